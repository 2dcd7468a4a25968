"""How often each router profile's index leaves the pool, on random streams kvpool's pool records.

    .venv/bin/python scripts/router_survey.py [STREAMS] [STEPS] [--keep DIR]

Records STREAMS runs of the seeded workload (the first seeds whose drawn
configuration has prefix caching and KV events on; STEPS workload steps each,
misuse included) with kvpool's pool in lockstep with the model, replays each
trace once with every profile reading along (``kvpool check-trace --router``),
and prints, per profile, the prefix queries asked, how many the profile
over- and under-claims, and the inputs it does not index as meant, by rule;
then what ``kvpool check-events`` says of the same streams: violations, and
warnings by name (``--strict`` fails on them).  docs/routers.md quotes its output.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from kvpool.impl import BlockPool
from kvpool.oracle.events.check import check_stream, load_events
from kvpool.oracle.events.routers import PROFILES, check_trace_routers, profile_factory
from kvpool.oracle.events.warnings import add_warnings
from kvpool.oracle.generate.runs import RunConfig
from kvpool.oracle.trace import record


def seeds(count: int) -> list[int]:
    out, seed = [], 0
    while len(out) < count:
        cfg = RunConfig.draw(random.Random(seed))
        if cfg.events and cfg.caching:
            out.append(seed)
        seed += 1
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", type=int, nargs="?", default=12)
    parser.add_argument("steps", type=int, nargs="?", default=400)
    parser.add_argument("--keep", type=Path, default=None, help="write the traces here")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="router-survey-"))
    folder.mkdir(parents=True, exist_ok=True)
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    rules: dict[str, Counter[str]] = defaultdict(Counter)
    events_check: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    for seed in seeds(args.streams):
        rec = record(BlockPool, seed, args.steps)
        path = folder / f"seed{seed}.jsonl"
        rec.write(path)
        result, reports = check_trace_routers(path, [profile_factory(p) for p in PROFILES])
        if not result.ok:
            print(result.format(), file=sys.stderr)
            return 1
        for r in reports:
            t = totals[r.profile]
            t.update(queries=r.queries, over=r.over, under=r.under, differences=len(r.differences))
            for x, _ in r.reactions:
                t[x.kind] += 1
                rules[r.profile][f"{x.kind} {x.rule}"] += 1
            for d in r.differences:
                rules[r.profile][f"{d.kind} {d.cause.rule}"] += 1
        stream = load_events(path)
        report = add_warnings(check_stream(stream, str(path)), stream, path, True)
        events_check.update(events=report.events, violations=len(report.violations))
        warnings.update(w.rule for w in report.warnings)
    print(f"{args.streams} streams of {args.steps} steps ({folder}): "
          f"{events_check['events']} events, {totals['set']['queries']} prefix queries")
    kinds = ("dropped-store", "unhandled", "ignored-clear", "restarted-chain", "misread-store")
    print("| profile | queries | over-claims | under-claims | reported at their line | "
          + " | ".join(kinds) + " |")
    print("|---|" + "---:|" * (4 + len(kinds)))
    for name in PROFILES:
        t = totals[name]
        print(f"| {name} | {t['queries']} | {t['over']} | {t['under']} | {t['differences']} | "
              + " | ".join(str(t[k]) for k in kinds) + " |")
    for name in PROFILES:
        print(f"{name}: " + ", ".join(f"{k}: {n}" for k, n in rules[name].most_common()))
    print(f"check-events: {events_check['violations']} violation(s); warnings: "
          + ", ".join(f"{k} {n}" for k, n in warnings.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
