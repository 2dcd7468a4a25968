"""``kvpool prove``: print the step x invariant proof matrix; fail on anything unproven.

The proofs run in :mod:`kvpool.proofs.prove`; this prints their matrices, a
concrete counterexample (a small pool before and after the step) under every
refuted check, and writes them as JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from kvpool.model.invariants import DERIVED_FROM
from kvpool.proofs.inductive import COUNTEREXAMPLE, PROVEN, TIMEOUT_MS, Result
from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS
from kvpool.proofs.order import ORDER_PROPERTIES
from kvpool.proofs.prove import Check, Proofs, prove_all
from kvpool.proofs.step_properties import NOT_ENCODED_STEPS, SYM_STEP_DOCS
from kvpool.proofs.transitions import COVERS

from .usage import command_parser, write_json

MARK = {PROVEN: "✓", "counterexample": "✗", "unknown": "?"}


def _cell(r: Result) -> str:
    return f"{MARK.get(r.status, '?')} {r.seconds:6.3f}s"


def result_json(r: Result) -> dict[str, Any]:
    """One check in the ``--json`` document."""
    return {"status": r.status, "seconds": round(r.seconds, 4), "detail": r.detail}


def _print_matrix(corner: str, names: Collection[str], initial: Callable[[str], Result | None],
                  matrix: Mapping[str, Mapping[str, Result]], enabled: Mapping[str, Result]) -> None:
    """A matrix of checks: a row per name (its initial check, if any, then one per step), then
    each step's precondition."""
    width = max(len(n) for n in names)

    def line(label: str, first: str, cells: Iterable[str]) -> None:
        print(f"{label:<{width}}  " + "  ".join(f"{c:>13}" for c in (first, *cells)))

    line(corner, "initial", matrix)
    for name in names:
        first = initial(name)
        line(name, "" if first is None else _cell(first), (_cell(matrix[s][name]) for s in matrix))
    line("precondition satisfiable", "", (_cell(enabled[s]) for s in matrix))


def _proven(results: Iterable[Result]) -> str:
    every = list(results)
    return f"{sum(r.status == PROVEN for r in every)}/{len(every)} checks proven"


def print_proofs(p: Proofs) -> None:
    """Both matrices, the unencoded invariants, the action -> step cover, the counts."""
    _print_matrix("invariant", SYM_INVARIANTS, p.initial.__getitem__, p.matrix, p.enabled)
    for name, why in NOT_ENCODED.items():
        print(f"not encoded: {name}: {why}")
    print("model actions -> steps: " + "; ".join(f"{a}: {'+'.join(st)}" for a, st in COVERS.items()))
    for name, r in p.lemmas.items():
        print(f"lemma {name} <= {' & '.join(DERIVED_FROM[name])}: {_cell(r)}")
    print("step properties (proofs/step_properties.py), for every step they speak of:")
    for name, by_step in p.properties.items():
        print(f"  {name}: {SYM_STEP_DOCS[name]}")
        print("    " + "  ".join(f"{st} {_cell(r)}" for st, r in by_step.items()))
    for name, why in NOT_ENCODED_STEPS.items():
        print(f"  not here: {name}: {why}")
    print(f"{_proven(p.results())} in {p.seconds:.2f}s")

    o = p.order
    print("eviction order (free-queue places, proofs/order.py):")
    # the initial queue's check stands in the row of the property it proves
    _print_matrix("property", ORDER_PROPERTIES,
                  lambda name: o.initial if name == "queue_well_formed" else None, o.matrix, o.enabled)
    print(f"order: {_proven(o.results())} in {o.seconds:.2f}s")


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
    parser = command_parser("kvpool prove", (__doc__ or "").splitlines()[0],
                            "example:\n  kvpool prove --json proofs.json")
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
        write_json(args.json, proofs_json(proofs))
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
