"""``kvpool prove``: print the step x invariant proof matrix; fail on anything unproven."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from .inductive import PROVEN, TIMEOUT_MS, Result, check_enabled, check_initial, matrix
from .invariants import NOT_ENCODED, SYM_INVARIANTS
from .order import ORDER_PROPERTIES, QSTEPS, check_order_enabled, check_order_initial, order_matrix
from .transitions import COVERS

MARK = {PROVEN: "✓", "counterexample": "✗", "unknown": "?"}


def _cell(r: Result) -> str:
    return f"{MARK.get(r.status, '?')} {r.seconds:6.3f}s"


def _as_json(r: Result) -> dict[str, Any]:
    return {"status": r.status, "seconds": round(r.seconds, 4), "detail": r.detail}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every proof; exit 1 on any counterexample or unknown."""
    parser = argparse.ArgumentParser(
        prog="kvpool prove", description=__doc__,
        epilog="example:\n  kvpool prove --json proofs.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS, help="per-check z3 timeout")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    initial = {name: check_initial(name, args.timeout_ms) for name in SYM_INVARIANTS}
    results = matrix(args.timeout_ms)
    enabled = {step: check_enabled(step, args.timeout_ms) for step in results}
    total = time.perf_counter() - start
    ostart = time.perf_counter()
    o_initial = check_order_initial(args.timeout_ms)
    o_results = order_matrix(args.timeout_ms)
    o_enabled = {step: check_order_enabled(step, args.timeout_ms) for step in QSTEPS}
    o_total = time.perf_counter() - ostart

    names = list(SYM_INVARIANTS)
    width = max(len(n) for n in names)
    steps = ["initial", *results]
    print(f"{'invariant':<{width}}  " + "  ".join(f"{s:>13}" for s in steps))
    for name in names:
        row = [initial[name]] + [results[s][name] for s in results]
        print(f"{name:<{width}}  " + "  ".join(f"{_cell(r):>13}" for r in row))
    print(f"{'precondition satisfiable':<{width}}  {'':>13}  "
          + "  ".join(f"{_cell(enabled[s]):>13}" for s in results))
    for name, why in NOT_ENCODED.items():
        print(f"not encoded: {name}: {why}")
    print("model actions -> steps: "
          + "; ".join(f"{a}: {'+'.join(st)}" for a, st in COVERS.items()))

    every = [*initial.values(), *enabled.values(), *(r for row in results.values() for r in row.values())]
    failed = [r for r in every if r.status != PROVEN]
    print(f"{len(every) - len(failed)}/{len(every)} checks proven in {total:.2f}s")

    print("eviction order (free-queue places, proofs/order.py):")
    owidth = max(len(n) for n in ORDER_PROPERTIES)
    print(f"{'property':<{owidth}}  " + "  ".join(f"{s:>13}" for s in ["initial", *o_results]))
    for name in ORDER_PROPERTIES:
        first = f"{_cell(o_initial):>13}" if name == "queue_well_formed" else f"{'':>13}"
        print(f"{name:<{owidth}}  {first}  "
              + "  ".join(f"{_cell(o_results[s][name]):>13}" for s in o_results))
    print(f"{'precondition satisfiable':<{owidth}}  {'':>13}  "
          + "  ".join(f"{_cell(o_enabled[s]):>13}" for s in o_results))
    o_every = [o_initial, *o_enabled.values(), *(r for row in o_results.values() for r in row.values())]
    o_failed = [r for r in o_every if r.status != PROVEN]
    print(f"order: {len(o_every) - len(o_failed)}/{len(o_every)} checks proven in {o_total:.2f}s")
    failed += o_failed

    if args.json:
        doc = {
            "initial": {n: _as_json(r) for n, r in initial.items()},
            "matrix": {s: {n: _as_json(r) for n, r in row.items()} for s, row in results.items()},
            "enabled": {s: _as_json(r) for s, r in enabled.items()},
            "not_encoded": NOT_ENCODED,
            "covers": {a: list(st) for a, st in COVERS.items()},
            "seconds": round(total, 3),
            "order": {
                "initial": _as_json(o_initial),
                "matrix": {s: {n: _as_json(r) for n, r in row.items()} for s, row in o_results.items()},
                "enabled": {s: _as_json(r) for s, r in o_enabled.items()},
                "seconds": round(o_total, 3),
            },
            "ok": not failed,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
