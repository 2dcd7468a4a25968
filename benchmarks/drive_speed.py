"""Calls per second over the drive protocol's pipe, with the Rust pool (``clients/rust-pool``).

Everything is measured in one run, so that the figures compare on one machine
at one load:

* the pipe alone: ``rust-pool --trivial`` answers every line with a constant
  line, without reading it; one call at a time (a round trip each) and in
  batches of 1,000 (how kvpool sends the queries it observes a pool with);
* the Rust pool answering the calls of a recorded workload (``kvpool record``,
  misuse included), each answer checked as a trace line, the way
  ``kvpool conform --exec`` reads them: one at a time, and in batches;
* the lockstep: the seeded campaign against the Rust pool over the pipe (seen
  through calls only, and with observations), against kvpool's own pool in
  this process: the model's side of the comparison is the same in all three.

Asserts nothing about time (speed belongs in a report, not a test).

    python benchmarks/drive_speed.py [--calls 20000] [--runs 4] [--steps 1000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

if importlib.util.find_spec("kvpool") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
RUST = ROOT / "clients" / "rust-pool"
TARGET = 10_000
"""Calls per second the issue asks of the pipe (one call at a time)."""


def build() -> str:
    cargo = shutil.which("cargo")
    if cargo is None:
        raise SystemExit("cargo is not installed: cannot build clients/rust-pool")
    subprocess.run([cargo, "build", "--release", "--offline", "--quiet"], cwd=RUST, check=True)
    return str(RUST / "target" / "release" / "rust-pool")


def recorded_calls(steps: int, seed: int) -> tuple[dict[str, object], list[tuple[str, dict[str, object]]]]:
    """The pool and the calls of a recorded run of the workload on kvpool's pool."""
    from kvpool.impl import BlockPool
    from kvpool.oracle.trace import record

    rec = record(BlockPool, seed, steps, observe=False)
    pool = {k: v for k, v in rec.header.items() if k not in ("kvpool_trace", "meta")}
    return pool, [(str(line["op"]), dict(line["args"])) for line in rec.lines]  # type: ignore[arg-type]


def pipe_rates(argv: list[str], calls: int) -> tuple[float, float]:
    """(one at a time, batches of 1,000) calls/s of raw lines to ``argv``."""
    from kvpool.oracle.drive import protocol
    from kvpool.oracle.drive.process import PoolProcess

    proc = PoolProcess(argv)
    proc.start()
    proc.exchange([protocol.encode(protocol.header(protocol.pool_fields(8, True, 1, False)))], str)
    line = protocol.encode({"op": "get_num_free_blocks", "args": {}})
    started = time.perf_counter()
    for _ in range(calls):
        proc.exchange([line], str)
    single = calls / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(calls // 1000):
        proc.exchange([line] * 1000, str)
    batched = (calls // 1000 * 1000) / (time.perf_counter() - started)
    proc.close()
    return single, batched


def answered_rates(binary: str, pool: dict[str, object], work: list[tuple[str, dict[str, object]]],
                   calls: int) -> tuple[float, float]:
    """(one at a time, batches) calls/s of the recorded calls, each answer read as a trace line."""
    from kvpool.oracle.drive.facade import Session
    from kvpool.oracle.drive.process import PoolProcess
    from kvpool.oracle.trace.read import parse_header

    header = parse_header({"kvpool_trace": 1, **pool})
    proc = PoolProcess([binary])
    rates = []
    for batch in (1, len(work)):
        done = 0
        elapsed = 0.0
        while done < calls:
            session = Session(proc, dict(pool), header, None, None)
            session.open()
            started = time.perf_counter()
            for at in range(0, len(work), batch):
                session.calls(work[at:at + batch])
            elapsed += time.perf_counter() - started
            done += len(work)
        rates.append(done / elapsed)
    proc.close()
    return rates[0], rates[1]


def lockstep_rates(binary: str, runs: int, steps: int) -> dict[str, tuple[int, int, float]]:
    """Lockstep calls, protocol calls and seconds of the seeded campaign, per pool."""
    from kvpool.impl import BlockPool
    from kvpool.oracle.core.adapter import adapter_factory
    from kvpool.oracle.drive import DriveAdapter
    from kvpool.oracle.search.campaign import run_one

    out: dict[str, tuple[int, int, float]] = {}
    started = time.perf_counter()
    calls = sum(run_one(BlockPool, seed, steps).steps for seed in range(runs))
    out["kvpool.impl in this process"] = (calls, 0, time.perf_counter() - started)
    for label, argv in (("rust-pool, seen through calls", [binary]),
                        ("rust-pool --observe", [binary, "--observe"])):
        with DriveAdapter(argv) as adapter:
            factory = adapter_factory(adapter)
            calls = sent = 0
            started = time.perf_counter()
            for seed in range(runs):
                pair = run_one(factory, seed, steps, errors_match=adapter.errors_match)
                calls += pair.steps
            seconds = time.perf_counter() - started
            sent = sum(slot.process.lines_read for slot in adapter.slots)  # answers read, both pools
            out[label] = (calls, sent, seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="protocol calls per rate (20000)")
    parser.add_argument("--runs", type=int, default=4, help="campaign runs of the lockstep (4)")
    parser.add_argument("--steps", type=int, default=1000, help="workload steps per run (1000)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    binary = build()
    trivial = pipe_rates([binary, "--trivial"], args.calls)
    raw = pipe_rates([binary], args.calls)
    pool, work = recorded_calls(2000, 1)
    answered = answered_rates(binary, pool, work, args.calls)
    lockstep = lockstep_rates(binary, args.runs, args.steps)
    print(f"{'what':<58} {'one at a time':>14} {'in batches':>12}")
    for label, (single, batched) in (
            ("the pipe alone: rust-pool --trivial, a constant answer", trivial),
            ("rust-pool: get_num_free_blocks, raw lines", raw),
            (f"rust-pool: a recorded workload's {len(work)} calls, answers read", answered)):
        print(f"{label:<58} {single:>12,.0f}/s {batched:>10,.0f}/s")
    print(f"the pool's calls one at a time: {answered[0] / trivial[0]:.2f} of the pipe alone; "
          f"target {TARGET:,} calls/s: {'met' if answered[0] >= TARGET else 'NOT met'}")
    base = lockstep["kvpool.impl in this process"]
    base_rate = base[0] / base[2]
    print(f"\nlockstep, campaign of {args.runs} runs x {args.steps} steps:")
    for label, (calls, sent, seconds) in lockstep.items():
        rate = calls / seconds
        extra = f", {sent:,} protocol calls, {sent / seconds:,.0f}/s" if sent else ""
        print(f"  {label:<34} {calls:>7,} calls {rate:>8,.0f}/s ({rate / base_rate:.2f} of in-process)"
              f"{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "trivial": trivial, "raw": raw, "answered": answered, "workload_calls": len(work),
            "lockstep": lockstep}, indent=2))


if __name__ == "__main__":
    main()
