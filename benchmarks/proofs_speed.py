"""How long the z3 proof suite takes, and how deep the bounded model checker gets.

Times every check ``kvpool prove`` runs (:func:`kvpool.proofs.prove.prove_all`:
initial state per invariant, the step x invariant preservation matrix, the
precondition sanity checks, the lemmas, the step properties, and the same for
the free-queue order of ``proofs/order.py``), one after another in this
process, as the issue's speed target is stated for the whole suite on the
2-core CI machine (target <= 10 s, aim <= 5 s).  Prints the
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
from kvpool.proofs.inductive import PROVEN, Result
from kvpool.proofs.prove import Check, prove_all


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bmc-seconds", type=float, default=10.0)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--no-symmetry", action="store_true", help="BMC without symmetry reduction")
    args = p.parse_args(argv)

    print(f"cpus: {os.cpu_count()}")
    results: dict[str, Result] = {}  # every check of the suite, as ``kvpool prove`` runs them, by label

    def each(check: Check, r: Result) -> None:
        results[" / ".join(x for x in (check.part, check.kind, check.step, check.name) if x)] = r

    start = time.perf_counter()
    prove_all(each=each)
    total = time.perf_counter() - start
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
