"""Lockstep speed: model-vs-kvpool.impl steps per second, on N worker processes.

A "step" is one ``Lockstep.call``: the operation on the model and on the
pool, result comparison, a full observation diff and every model invariant.
Issue 5 asks for >= 5,000 steps/s on 2 cores; this prints the numbers and
asserts nothing about time (timings belong in a report, not a flaky test).

Two drivers are measured:

* the seeded random campaign (``oracle/search/campaign.py``), one process per core,
  seeds split between them (what ``kvpool conform`` runs);
* the Hypothesis state machine (``oracle/search/machine.py``) in one process, which
  adds Hypothesis's drawing and bookkeeping on top of the lockstep calls.

    python benchmarks/lockstep_speed.py [--workers 2] [--runs 8] [--steps 2000] [--examples 100]
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import met, parser

TARGET = 5_000


def _campaign_worker(seeds: list[int], steps: int) -> tuple[int, float]:
    """Run one seeded campaign run per seed; (lockstep calls, busy seconds)."""
    from kvpool.impl import BlockPool
    from kvpool.oracle.search.campaign import run_one

    started = time.perf_counter()
    calls = sum(run_one(BlockPool, seed, steps).steps for seed in seeds)
    return calls, time.perf_counter() - started


def campaign_rate(workers: int, runs: int, steps: int, seed: int) -> tuple[int, float, float]:
    """(calls, wall seconds, sum of per-worker busy seconds) over ``workers`` processes."""
    shards = [list(range(seed + w, seed + runs, workers)) for w in range(workers)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_campaign_worker, shards, [steps] * workers))
    wall = time.perf_counter() - started
    return sum(c for c, _ in results), wall, sum(b for _, b in results)


def machine_rate(examples: int, step_count: int) -> tuple[int, int, float]:
    """(lockstep calls, examples, seconds) of the Hypothesis machine in this process."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvpool.oracle.core.adapter import kvpool_adapter
    from kvpool.oracle.search.machine import machine_for

    totals = {"calls": 0, "examples": 0}
    base = machine_for(kvpool_adapter())

    class Counting(base):  # type: ignore[valid-type,misc]
        """Adds each example's lockstep calls to the totals when it ends."""

        def teardown(self) -> None:
            totals["examples"] += 1
            if self.pair is not None:
                totals["calls"] += self.pair.steps
            super().teardown()

    config = settings(max_examples=examples, stateful_step_count=step_count, deadline=None,
                      database=None, derandomize=True, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
    started = time.perf_counter()
    run_state_machine_as_test(Counting, settings=config)
    return totals["calls"], totals["examples"], time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, workers=2, runs=(8, "campaign runs, split between workers"),
                  steps=(2000, "workload steps per campaign run"), seed=0,
                  examples=(100, "Hypothesis machine examples (0: skip)"),
                  step_count=(30, "rules per machine example")).parse_args(argv)

    calls, wall, busy = campaign_rate(args.workers, args.runs, args.steps, args.seed)
    total = calls / wall if wall else 0.0
    print(f"campaign: {calls:,} lockstep calls in {wall:.2f}s on {args.workers} workers: "
          f"{total:,.0f} steps/s total, {calls / busy if busy else 0.0:,.0f} steps/s per worker "
          f"(target >= {TARGET:,} on 2 cores: {met(total >= TARGET)})")
    if args.examples:
        m_calls, examples, secs = machine_rate(args.examples, args.step_count)
        print(f"machine:  {m_calls:,} lockstep calls over {examples} examples in {secs:.2f}s "
              f"on 1 process: {m_calls / secs:,.0f} steps/s (Hypothesis drawing included; "
              f"pytest-xdist runs one such process per core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
