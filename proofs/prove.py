"""Every z3 proof at once, as plain results: what ``kvpool prove`` prints and ``kvpool verify`` reports.

Three parts, each timed on its own: the invariants (every encoded invariant
holds initially and is preserved by every step, every step's precondition is
satisfiable, every lemma follows from the invariants it names), the step
properties (:mod:`.step_properties`: each holds of every step it speaks of)
and the eviction order (:mod:`.order`: the free queue with places is well
formed initially and every queue step keeps every order property).  A check
z3 cannot decide is searched for a counterexample in a small pool
(:func:`~.inductive.settle`); one that stays undecided fails.
The checks run in a fixed order, the same for every caller, and ``each`` is
told of every result as it comes (a progress bar, a picture of a
counterexample) so that a caller need not run them itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import transitions
from .inductive import (
    PROVEN,
    TIMEOUT_MS,
    Result,
    check_enabled,
    check_initial,
    check_lemma,
    check_preservation,
    check_step_property,
    settle,
)
from .invariants import SYM_INVARIANTS, SYM_LEMMAS
from .order import ORDER_PROPERTIES, QSTEPS, check_order, check_order_enabled, check_order_initial
from .step_properties import SYM_STEP_PROPERTIES, applies


@dataclass(frozen=True)
class Check:
    """Which check a result answers.

    ``part`` is ``"invariants"``, ``"properties"`` or ``"order"``; ``kind`` is
    ``"initial"``, ``"preserve"``, ``"enabled"``, ``"lemma"`` or ``"holds"``
    (a step property of a step); ``step`` is the step (or queue step) and
    ``name`` the invariant, lemma or property, where the check has one.
    """

    part: str
    kind: str
    step: str | None = None
    name: str | None = None


@dataclass
class OrderProofs:
    """The eviction order: the initial queue, queue step x property, preconditions."""

    initial: Result
    matrix: dict[str, dict[str, Result]]
    enabled: dict[str, Result]
    seconds: float

    def results(self) -> Iterator[Result]:
        yield self.initial
        yield from self.enabled.values()
        for row in self.matrix.values():
            yield from row.values()


@dataclass
class Proofs:
    """The invariants (initial, step x invariant, preconditions, lemmas), the step properties
    (property x step) and the eviction order."""

    initial: dict[str, Result]
    matrix: dict[str, dict[str, Result]]
    enabled: dict[str, Result]
    seconds: float
    order: OrderProofs
    lemmas: dict[str, Result]
    properties: dict[str, dict[str, Result]]
    """Per step property, per step it speaks of."""

    def results(self) -> Iterator[Result]:
        """The invariant and step-property parts' results (not the order's)."""
        yield from self.initial.values()
        yield from self.enabled.values()
        for row in self.matrix.values():
            yield from row.values()
        yield from self.lemmas.values()
        for row in self.properties.values():
            yield from row.values()

    @property
    def ok(self) -> bool:
        """Every check of every part proven (``unknown`` is a failure: a timeout proves nothing)."""
        return all(r.status == PROVEN for r in (*self.results(), *self.order.results()))


OnResult = Callable[[Check, Result], None]


def _property_steps() -> dict[str, list[str]]:
    return {p: [st for st in transitions.STEPS if applies(p, st)] for p in SYM_STEP_PROPERTIES}


def check_count() -> int:
    """How many checks :func:`prove_all` runs (for a progress bar)."""
    names, steps = len(SYM_INVARIANTS), len(transitions.STEPS)
    properties = sum(len(v) for v in _property_steps().values())
    return (names * (steps + 1) + steps + len(SYM_LEMMAS) + properties + 1
            + len(QSTEPS) * (len(ORDER_PROPERTIES) + 1))


def prove_all(timeout_ms: int = TIMEOUT_MS, each: OnResult | None = None) -> Proofs:
    """Run every check, in order, with ``timeout_ms`` per check; tell ``each`` of every result."""

    def told(check: Check, result: Result) -> Result:
        if each is not None:
            each(check, result)
        return result

    names, steps = list(SYM_INVARIANTS), list(transitions.STEPS)  # read now: tests swap steps
    start = time.perf_counter()
    initial = {n: told(Check("invariants", "initial", name=n), check_initial(n, timeout_ms))
               for n in names}
    matrix = {st: {n: told(Check("invariants", "preserve", st, n),
                           settle(check_preservation(st, n, timeout_ms), st, n, timeout_ms=timeout_ms))
                   for n in names} for st in steps}
    enabled = {st: told(Check("invariants", "enabled", st), check_enabled(st, timeout_ms)) for st in steps}
    lemmas = {n: told(Check("invariants", "lemma", name=n), check_lemma(n, timeout_ms))
              for n in SYM_LEMMAS}
    properties = {p: {st: told(Check("properties", "holds", st, p),
                               settle(check_step_property(st, p, timeout_ms), st, p,
                                      timeout_ms=timeout_ms))
                      for st in sts} for p, sts in _property_steps().items()}
    seconds = time.perf_counter() - start
    return Proofs(initial, matrix, enabled, seconds, _prove_order(timeout_ms, told), lemmas,
                  properties)


def _prove_order(timeout_ms: int, told: Callable[[Check, Result], Result]) -> OrderProofs:
    """The eviction order's checks (:mod:`.order`), in order."""
    start = time.perf_counter()
    initial = told(Check("order", "initial"), check_order_initial(timeout_ms))
    matrix = {st: {p: told(Check("order", "preserve", st, p), check_order(st, p, timeout_ms))
                   for p in ORDER_PROPERTIES} for st in QSTEPS}
    enabled = {st: told(Check("order", "enabled", st), check_order_enabled(st, timeout_ms))
               for st in QSTEPS}
    return OrderProofs(initial, matrix, enabled, time.perf_counter() - start)


__all__ = ["Check", "OnResult", "OrderProofs", "Proofs", "check_count", "prove_all"]
