"""How long the z3 proof suite takes, and how deep the bounded model checker gets.

Times every check ``kvpool prove`` runs (initial state per invariant, the
step x invariant preservation matrix, the precondition sanity checks, and the
same for the free-queue order of ``proofs/order.py``), one
after another in this process, as the issue's speed target is stated for the
whole suite on the 2-core CI machine (target <= 10 s, aim <= 5 s).  Prints the
total, the five slowest checks, and the depth the BMC fully explores within a
10 s budget.  It asserts nothing about time: the numbers are for reading.

    python benchmarks/proofs_speed.py [--bmc-seconds 10] [--blocks 4] [--no-symmetry]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from kvpool.proofs import bmc
from kvpool.proofs.inductive import PROVEN, Result, check_enabled, check_initial, check_preservation
from kvpool.proofs.invariants import SYM_INVARIANTS
from kvpool.proofs.order import (
    ORDER_PROPERTIES,
    QSTEPS,
    check_order,
    check_order_enabled,
    check_order_initial,
)
from kvpool.proofs.transitions import STEPS


def time_suite() -> tuple[float, dict[str, Result]]:
    """Run every check of the suite; wall time and each result by label."""
    results: dict[str, Result] = {}
    start = time.perf_counter()
    for name in SYM_INVARIANTS:
        results[f"initial / {name}"] = check_initial(name)
    for step in STEPS:
        for name in SYM_INVARIANTS:
            results[f"{step} / {name}"] = check_preservation(step, name)
    for step in STEPS:
        results[f"enabled / {step}"] = check_enabled(step)
    results["order initial"] = check_order_initial()
    for step in QSTEPS:
        for prop in ORDER_PROPERTIES:
            results[f"order {step} / {prop}"] = check_order(step, prop)
        results[f"order enabled / {step}"] = check_order_enabled(step)
    return time.perf_counter() - start, results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bmc-seconds", type=float, default=10.0)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--no-symmetry", action="store_true", help="BMC without symmetry reduction")
    args = p.parse_args(argv)

    print(f"cpus: {os.cpu_count()}")
    total, results = time_suite()
    solver = sum(r.seconds for r in results.values())
    bad = [k for k, r in results.items() if r.status != PROVEN]
    print(f"inductive suite: {len(results)} checks in {total:.2f}s wall "
          f"({solver:.2f}s in z3, {total - solver:.2f}s building terms); "
          f"{len(bad)} not proven{': ' + ', '.join(bad) if bad else ''}")
    print("slowest checks:")
    for label, r in sorted(results.items(), key=lambda kv: -kv[1].seconds)[:5]:
        print(f"  {r.seconds:7.3f}s  {label}  ({r.status})")

    cfg = bmc.Bounds(blocks=args.blocks, symmetry=not args.no_symmetry)
    out = bmc.explore(cfg, depth=100, seconds=args.bmc_seconds)
    print(f"bmc ({cfg.blocks} blocks, hbs {cfg.hash_block_size}, "
          f"{'symmetry reduced' if cfg.symmetry else 'no symmetry reduction'}, "
          f"{args.bmc_seconds:g}s budget): "
          f"depth {out.depth} fully explored, {out.states} states, {out.transitions} transitions"
          f"{'' if out.ok else ', VIOLATION ' + ', '.join(out.violation)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
