"""Workload calls per second of ``kvpool conform --exec`` with the Rust pool, against the bare pipe.

Everything is measured in one run, so that the figures compare on one machine
at one load:

* the bare pipe: ``rust-pool --trivial`` answers every line with a constant
  line without reading it; round trips one line at a time, and lines in
  batches of 1,000 (how the campaign sends its calls);
* the campaign phase of ``kvpool conform --exec`` (``run_campaign_phase`` with
  a :class:`~kvpool.oracle.drive.DriveAdapter`, as the command runs it, directed
  calls included): the Rust pool seen through calls (black box: ``observe``
  lines, or one query per question for a process that does not answer them,
  ``--no-observe-lines``) and showing its whole pool (``--observe``), on the
  drawn pools and ``--long-lived`` on 256 blocks; for each, workload calls/s,
  protocol lines sent per workload call, and the ratio to kvpool's own pool
  in this process on the same runs;
* the same with each call waiting for its answer (``--sync``: what the state
  machine and a shrink do).

Each rate is given twice: per second of wall-clock time, which on a machine shared
with other jobs measures the load as much as the drive, and per CPU-second of
kvpool's own process (the pool process runs on the other core of two), which is
what an idle two-core machine would reach end to end when kvpool's side is the
bottleneck, as it is here. Asserts nothing about time (speed belongs in a report,
not a test).

    python benchmarks/drive_speed.py [--runs 4] [--steps 1000] [--json FILE]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import met, parser

RUST = Path(__file__).resolve().parents[1] / "clients" / "rust-pool"
TARGETS = {"drawn pools": 5_000, "long-lived, 256 blocks": 2_000}
"""Workload calls per second the drive is to reach end to end (issue 36), by kind of run."""


def pipe_rates(argv: list[str], lines: int) -> tuple[float, float]:
    """(round trips one line at a time, lines in batches of 1,000) per second to ``argv``."""
    from kvpool.oracle.drive import protocol
    from kvpool.oracle.drive.process import PoolProcess

    proc = PoolProcess(argv)
    proc.start()
    proc.exchange([protocol.encode(protocol.header(protocol.pool_fields(8, True, 1, False)))], str)
    line = protocol.encode({"op": "get_num_free_blocks", "args": {}})
    rates = []
    for batch in (1, 1000):
        started = time.perf_counter()
        for _ in range(lines // batch):
            proc.exchange([line] * batch, str)
        rates.append(lines // batch * batch / (time.perf_counter() - started))
    proc.close()
    return rates[0], rates[1]


def campaign(argv: list[str] | None, runs: int, steps: int, long_lived: bool,
             sync: bool = False) -> dict[str, Any]:
    """The campaign phase against ``argv`` (None: kvpool's pool in this process)."""
    from kvpool.oracle.core.adapter import kvpool_adapter
    from kvpool.oracle.drive import DriveAdapter
    from kvpool.oracle.search.conform import Options, run_campaign_phase

    opts = Options(runs=runs, steps=steps, long_lived=long_lived, blocks=256 if long_lived else None)
    with contextlib.nullcontext() if argv is None else DriveAdapter(argv) as drive:
        if drive is not None:
            drive.pipelined = not sync
        started, cpu = time.perf_counter(), time.process_time()
        result = run_campaign_phase(kvpool_adapter() if drive is None else drive, opts)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        lines = 0 if drive is None else drive.protocol_lines()
    return {"ok": result.ok, "calls": result.executed, "seconds": seconds, "cpu": cpu, "lines": lines}


def main() -> None:
    ap = parser(__doc__, runs=(4, "campaign runs (4)"), steps=(1000, "workload steps per run (1000)"),
                lived_steps=(2000, "workload steps per long-lived run (2000)"),
                pipe_lines=(20_000, "lines per pipe rate (20000)"))
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if (cargo := shutil.which("cargo")) is None:
        raise SystemExit("cargo is not installed: cannot build clients/rust-pool")
    subprocess.run([cargo, "build", "--release", "--offline", "--quiet"], cwd=RUST, check=True)
    binary = str(RUST / "target" / "release" / "rust-pool")
    trivial = pipe_rates([binary, "--trivial"], args.pipe_lines)
    print(f"the bare pipe (rust-pool --trivial): {trivial[0]:,.0f} round trips/s one line at a time, "
          f"{trivial[1]:,.0f} lines/s in batches of 1,000")
    figures: dict[str, Any] = {"pipe": {"round_trips": trivial[0], "batched_lines": trivial[1]}}
    for kind, long_lived, runs, steps in (("drawn pools", False, args.runs, args.steps),
                                          ("long-lived, 256 blocks", True, 2, args.lived_steps)):
        base = campaign(None, runs, steps, long_lived)
        base_rate = base["calls"] / base["seconds"]
        print(f"\ncampaign phase, {kind} ({runs} runs x {steps} steps):")
        print(f"  {'kvpool.impl in this process':<46} {base['calls']:>7,} workload calls "
              f"{base_rate:>8,.0f}/s, {base['calls'] / base['cpu']:>7,.0f} per CPU-second")
        rows: dict[str, Any] = {"in-process": base}
        for label, argv, sync in (
                ("rust-pool, black box (observe lines)", [binary], False),
                ("rust-pool, black box, one query a line", [binary, "--no-observe-lines"], False),
                ("rust-pool --observe (whole pool shown)", [binary, "--observe"], False),
                ("rust-pool, black box, each call waiting", [binary], True)):
            got = campaign(argv, runs, steps, long_lived, sync)
            rate, cpu_rate = got["calls"] / got["seconds"], got["calls"] / got["cpu"]
            target = TARGETS[kind]
            verdict = "met per CPU-second" if rate < target <= cpu_rate else met(rate >= target)
            shown = "" if sync or "one query" in label else f"  target {target:,}/s: {verdict}"
            print(f"  {label:<46} {got['calls']:>7,} workload calls {rate:>8,.0f}/s, {cpu_rate:>7,.0f} "
                  f"per CPU-second ({rate / base_rate:.2f} of in-process, {rate / trivial[0]:.2f} of the "
                  f"pipe's round trips), {got['lines'] / max(got['calls'], 1):.1f} protocol lines a "
                  f"call{shown}" + ("" if got["ok"] else "  DIVERGED"))
            rows[label] = got
        figures[kind] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
