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
from .transitions import COVERS

MARK = {PROVEN: "✓", "counterexample": "✗", "unknown": "?"}


def _cell(r: Result) -> str:
    return f"{MARK.get(r.status, '?')} {r.seconds:6.3f}s"


def _as_json(r: Result) -> dict[str, Any]:
    return {"status": r.status, "seconds": round(r.seconds, 4), "detail": r.detail}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every proof; exit 1 on any counterexample or unknown."""
    parser = argparse.ArgumentParser(prog="kvpool prove", description=__doc__)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS, help="per-check z3 timeout")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    initial = {name: check_initial(name, args.timeout_ms) for name in SYM_INVARIANTS}
    results = matrix(args.timeout_ms)
    enabled = {step: check_enabled(step, args.timeout_ms) for step in results}
    total = time.perf_counter() - start

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

    if args.json:
        doc = {
            "initial": {n: _as_json(r) for n, r in initial.items()},
            "matrix": {s: {n: _as_json(r) for n, r in row.items()} for s, row in results.items()},
            "enabled": {s: _as_json(r) for s, r in enabled.items()},
            "not_encoded": NOT_ENCODED,
            "covers": {a: list(st) for a, st in COVERS.items()},
            "seconds": round(total, 3),
            "ok": not failed,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
