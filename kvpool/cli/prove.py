"""``kvpool prove``: print the step x invariant proof matrix; fail on anything unproven.

The proofs run in :mod:`kvpool.proofs.prove`; this prints their matrices, a
concrete counterexample (a small pool before and after the step) under every
refuted check, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kvpool.model.invariants import DERIVED_FROM
from kvpool.proofs.inductive import COUNTEREXAMPLE, PROVEN, TIMEOUT_MS, Result
from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS
from kvpool.proofs.order import ORDER_PROPERTIES
from kvpool.proofs.prove import Check, Proofs, prove_all
from kvpool.proofs.step_properties import NOT_ENCODED_STEPS, SYM_STEP_DOCS
from kvpool.proofs.transitions import COVERS

MARK = {PROVEN: "✓", "counterexample": "✗", "unknown": "?"}
DESCRIPTION = "``kvpool prove``: print the step x invariant proof matrix; fail on anything unproven."


def _cell(r: Result) -> str:
    return f"{MARK.get(r.status, '?')} {r.seconds:6.3f}s"


def result_json(r: Result) -> dict[str, Any]:
    """One check in the ``--json`` document."""
    return {"status": r.status, "seconds": round(r.seconds, 4), "detail": r.detail}


def print_proofs(p: Proofs) -> None:
    """Both matrices, the unencoded invariants, the action -> step cover, the counts."""
    names = list(SYM_INVARIANTS)
    width = max(len(n) for n in names)
    steps = ["initial", *p.matrix]
    print(f"{'invariant':<{width}}  " + "  ".join(f"{s:>13}" for s in steps))
    for name in names:
        row = [p.initial[name]] + [p.matrix[s][name] for s in p.matrix]
        print(f"{name:<{width}}  " + "  ".join(f"{_cell(r):>13}" for r in row))
    print(f"{'precondition satisfiable':<{width}}  {'':>13}  "
          + "  ".join(f"{_cell(p.enabled[s]):>13}" for s in p.matrix))
    for name, why in NOT_ENCODED.items():
        print(f"not encoded: {name}: {why}")
    print("model actions -> steps: "
          + "; ".join(f"{a}: {'+'.join(st)}" for a, st in COVERS.items()))
    for name, r in p.lemmas.items():
        print(f"lemma {name} <= {' & '.join(DERIVED_FROM[name])}: {_cell(r)}")
    print("step properties (proofs/step_properties.py), for every step they speak of:")
    for name, by_step in p.properties.items():
        print(f"  {name}: {SYM_STEP_DOCS[name]}")
        print("    " + "  ".join(f"{st} {_cell(r)}" for st, r in by_step.items()))
    for name, why in NOT_ENCODED_STEPS.items():
        print(f"  not here: {name}: {why}")
    every = list(p.results())
    failed = [r for r in every if r.status != PROVEN]
    print(f"{len(every) - len(failed)}/{len(every)} checks proven in {p.seconds:.2f}s")

    o = p.order
    print("eviction order (free-queue places, proofs/order.py):")
    owidth = max(len(n) for n in ORDER_PROPERTIES)
    print(f"{'property':<{owidth}}  " + "  ".join(f"{s:>13}" for s in ["initial", *o.matrix]))
    for name in ORDER_PROPERTIES:
        first = f"{_cell(o.initial):>13}" if name == "queue_well_formed" else f"{'':>13}"
        print(f"{name:<{owidth}}  {first}  "
              + "  ".join(f"{_cell(o.matrix[s][name]):>13}" for s in o.matrix))
    print(f"{'precondition satisfiable':<{owidth}}  {'':>13}  "
          + "  ".join(f"{_cell(o.enabled[s]):>13}" for s in o.matrix))
    o_every = list(o.results())
    o_failed = [r for r in o_every if r.status != PROVEN]
    print(f"order: {len(o_every) - len(o_failed)}/{len(o_every)} checks proven in {o.seconds:.2f}s")


def proofs_json(p: Proofs) -> dict[str, Any]:
    """The ``--json`` document."""
    o = p.order
    return {
        "initial": {n: result_json(r) for n, r in p.initial.items()},
        "matrix": {s: {n: result_json(r) for n, r in row.items()} for s, row in p.matrix.items()},
        "enabled": {s: result_json(r) for s, r in p.enabled.items()},
        "not_encoded": NOT_ENCODED,
        "covers": {a: list(st) for a, st in COVERS.items()},
        "lemmas": {n: {**result_json(r), "from": list(DERIVED_FROM[n])} for n, r in p.lemmas.items()},
        "properties": {n: {s: result_json(r) for s, r in row.items()}
                       for n, row in p.properties.items()},
        "not_encoded_properties": NOT_ENCODED_STEPS,
        "seconds": round(p.seconds, 3),
        "order": {
            "initial": result_json(o.initial),
            "matrix": {s: {n: result_json(r) for n, r in row.items()} for s, row in o.matrix.items()},
            "enabled": {s: result_json(r) for s, r in o.enabled.items()},
            "seconds": round(o.seconds, 3),
        },
        "ok": p.ok,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run every proof; exit 1 on any counterexample or unknown."""
    parser = argparse.ArgumentParser(
        prog="kvpool prove", description=DESCRIPTION,
        epilog="example:\n  kvpool prove --json proofs.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS, help="per-check z3 timeout")
    args = parser.parse_args(argv)
    refuted: list[tuple[Check, Result]] = []

    def each(check: Check, r: Result) -> None:
        if r.status != PROVEN:
            refuted.append((check, r))

    proofs = prove_all(args.timeout_ms, each)
    print_proofs(proofs)
    for check, r in refuted:
        print_refuted(check, r, args.timeout_ms)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(proofs_json(proofs), fh, indent=2)
    return 0 if proofs.ok else 1


def print_refuted(check: Check, r: Result, timeout_ms: int) -> None:
    """A failed check, with the small pool that breaks it where one exists."""
    what = f"{check.part} {check.kind} {check.step or ''} {check.name or ''}".split()
    print(f"\n✗ {' '.join(what)}: {r.status}" + (f" ({r.detail})" if r.status != COUNTEREXAMPLE else ""))
    if check.kind in ("preserve", "holds") and check.part != "order" and check.step and check.name:
        # lazy: pictures only for a counterexample
        from kvpool.proof_pictures import counterexample_steps, counterexample_text

        steps = counterexample_steps(check.step, check.name, timeout_ms=timeout_ms)
        for line in counterexample_text(steps) if steps else ["  no pool in the search scope"]:
            print(line)


__all__ = ["main", "print_proofs", "print_refuted", "proofs_json", "result_json"]


if __name__ == "__main__":
    raise SystemExit(main())
