"""The inductive proofs: every step preserves every invariant, for any pool size.

For each (step, invariant) pair z3 checks that

    prefix axioms ∧ hbs > 0 ∧ Inv(s) ∧ Pre(s, args) ∧ ¬inv(Post(s, args))

is unsatisfiable, where ``Inv`` is the conjunction of ALL encoded invariants
(so each invariant may lean on the others).  Together with :func:`check_initial`
(Inv holds in ``initial_state`` of any size) this is the induction.  Every
step's precondition is also checked satisfiable together with Inv
(:func:`check_enabled`), so no proof is vacuous.  Step properties
(:mod:`.step_properties`) are proven per step the same way
(:func:`check_step_property`), and each lemma from the invariants it names
(:func:`check_lemma`).  Results are ``proven``, ``counterexample`` or
``unknown``; :func:`settle` turns an ``unknown`` into a counterexample when
a small pool has one, and an ``unknown`` that stays one is a failure: a
timeout proves nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3  # type: ignore[import-untyped]

from kvpool.model.invariants import DERIVED_FROM

from .finite import scoped
from .invariants import SYM_INVARIANTS, SYM_LEMMAS, SymInvariant, inv
from .step_properties import SYM_STEP_PROPERTIES
from .symbolic import Expr, SymState, config_ok, initial, prefix_axioms
from .transitions import STEPS, StepSpec

TIMEOUT_MS = 20_000
"""Per-check solver timeout."""

SCOPE = 3
"""Elements per sort when searching for counterexamples (see :mod:`.finite`)."""

PROVEN, COUNTEREXAMPLE, UNKNOWN = "proven", "counterexample", "unknown"
NONE_IN_SCOPE = "no counterexample in scope"


@dataclass(frozen=True)
class Result:
    """The outcome of one check and how long it took."""

    status: str
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == PROVEN


def _solve(assertions: list[Expr], timeout_ms: int,
           scope: tuple[int, SymState, list[Expr]] | None = None) -> tuple[str, float, str]:
    """Check ``assertions`` (plus the prefix axioms), optionally in a finite scope.

    Returns (z3 verdict, seconds, model text or reason unknown).
    """
    facts = [*prefix_axioms(), *assertions]
    return run_solver(facts if scope is None else scoped(facts, *scope), timeout_ms)


def run_solver(facts: list[Expr], timeout_ms: int) -> tuple[str, float, str]:
    """z3 on ``facts`` as they are: (verdict, seconds, model text or reason unknown)."""
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*facts)
    start = time.perf_counter()
    verdict = solver.check()
    took = time.perf_counter() - start
    if verdict == z3.sat:
        return "sat", took, str(solver.model())
    if verdict == z3.unknown:
        return "unknown", took, solver.reason_unknown()
    return "unsat", took, ""


def refuted(solved: tuple[str, float, str]) -> Result:
    """A negated goal's solver outcome: ``proven`` iff it is unsatisfiable."""
    verdict, took, detail = solved
    return Result({"unsat": PROVEN, "sat": COUNTEREXAMPLE}.get(verdict, UNKNOWN), took, detail)


def witnessed(solved: tuple[str, float, str]) -> Result:
    """A precondition's solver outcome: ``proven`` iff some state meets it (a proof about it is not
    vacuous); ``counterexample`` if none does."""
    verdict, took, detail = solved
    return Result({"sat": PROVEN, "unsat": COUNTEREXAMPLE}.get(verdict, UNKNOWN), took,
                  detail if verdict != "sat" else "")


def _refute(assertions: list[Expr], timeout_ms: int) -> Result:
    """``proven`` iff ``assertions`` (a negated goal) and the prefix axioms are unsatisfiable."""
    return refuted(_solve(assertions, timeout_ms))


def in_scope(solved: tuple[str, float, str]) -> Result:
    """A finite-scope search's solver outcome: a counterexample, or none in scope."""
    verdict, took, detail = solved
    return Result({"sat": COUNTEREXAMPLE, "unsat": NONE_IN_SCOPE}.get(verdict, UNKNOWN), took, detail)


def broken(step: str | StepSpec, target: str | SymInvariant,
           s: SymState, args: list[Expr]) -> list[Expr]:
    """The query whose models are counterexamples: a good state where the step breaks ``target``.

    ``target`` is an invariant (by name or as a predicate) or a step property's name.
    """
    spec = STEPS[step] if isinstance(step, str) else step
    st = spec.fn(s, *args)
    if isinstance(target, str) and target in SYM_STEP_PROPERTIES:
        return [config_ok(s), inv(s), z3.Not(SYM_STEP_PROPERTIES[target].claim(s, args, st))]
    pred = SYM_INVARIANTS[target] if isinstance(target, str) else target
    return [config_ok(s), inv(s), st.pre, z3.Not(pred(st.post))]


def check_preservation(step: str | StepSpec, invariant: str | SymInvariant,
                       timeout_ms: int = TIMEOUT_MS) -> Result:
    """Inv(s) ∧ Pre ∧ Step ⇒ invariant(s'), for one step and one invariant."""
    spec = STEPS[step] if isinstance(step, str) else step
    s = SymState.fresh("s")
    return _refute(broken(spec, invariant, s, spec.fresh_args()), timeout_ms)


def check_step_property(step: str | StepSpec, name: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """Inv(s) ⇒ the step property ``name`` of one step, for any pool size."""
    return check_preservation(step, name, timeout_ms)


def check_lemma(name: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """The invariants the model names as the lemma's premises imply it, for any pool size."""
    s = SymState.fresh("s")
    premises = [SYM_INVARIANTS[p](s) for p in DERIVED_FROM[name]]
    return _refute([config_ok(s), *premises, z3.Not(SYM_LEMMAS[name](s))], timeout_ms)


def find_counterexample(step: str | StepSpec, target: str | SymInvariant, scope: int = SCOPE,
                        timeout_ms: int = TIMEOUT_MS) -> Result:
    """Search a pool with at most ``scope`` blocks/keys/contents for a step breaking ``target``.

    ``target``: an invariant or a step property.  ``counterexample`` (with the
    model) or :data:`NONE_IN_SCOPE` / ``unknown``.
    """
    spec = STEPS[step] if isinstance(step, str) else step
    s = SymState.fresh("s")
    args = spec.fresh_args()
    return in_scope(_solve(broken(spec, target, s, args), timeout_ms, (scope, s, args)))


def settle(result: Result, step: str | StepSpec, target: str, scope: int = SCOPE,
           timeout_ms: int = TIMEOUT_MS) -> Result:
    """An ``unknown`` made definite where it can be: a counterexample in a small pool, if any.

    Anything but ``unknown`` comes back as it was.  An ``unknown`` with no
    counterexample in scope stays ``unknown`` (a failure) and says so.
    """
    if result.status != UNKNOWN:
        return result
    found = find_counterexample(step, target, scope, timeout_ms)
    took = result.seconds + found.seconds
    if found.status == COUNTEREXAMPLE:
        return Result(COUNTEREXAMPLE, took, found.detail)
    why = (f"no counterexample with at most {scope} blocks, keys and contents"
           if found.status == NONE_IN_SCOPE else "the finite-scope search gave up too")
    return Result(UNKNOWN, took, f"z3 gave up ({result.detail}); {why}: unproven, not refuted")


def check_initial(invariant: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """``invariant`` holds in the initial state, whatever the number of blocks."""
    s = initial()
    return _refute([config_ok(s), z3.Not(SYM_INVARIANTS[invariant](s))], timeout_ms)


def check_enabled(step: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """Inv(s) ∧ Pre is satisfiable: the step's proofs are not vacuous.

    ``proven`` here means "a witness state exists"; ``counterexample`` would
    mean the precondition contradicts the invariant.
    """
    s = SymState.fresh("s")
    st = STEPS[step].fn(s, *STEPS[step].fresh_args())
    return witnessed(_solve([config_ok(s), inv(s), st.pre], timeout_ms))


def matrix(timeout_ms: int = TIMEOUT_MS) -> dict[str, dict[str, Result]]:
    """Every (step, invariant) preservation result."""
    return {step: {name: check_preservation(step, name, timeout_ms) for name in SYM_INVARIANTS}
            for step in STEPS}
