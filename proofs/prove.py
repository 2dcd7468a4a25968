"""Every z3 proof at once, as plain results: what ``kvpool prove`` prints and ``kvpool verify`` reports.

Two parts, each timed on its own: the invariants (every encoded invariant
holds initially and is preserved by every step, every step's precondition is
satisfiable) and the eviction order (:mod:`.order`: the free queue with places
is well formed initially and every queue step keeps every order property).
The checks run in a fixed order, the same for every caller, and ``each`` is
told of every result as it comes (a progress bar, a picture of a
counterexample) so that a caller need not run them itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import transitions
from .inductive import PROVEN, TIMEOUT_MS, Result, check_enabled, check_initial, check_preservation
from .invariants import SYM_INVARIANTS
from .order import ORDER_PROPERTIES, QSTEPS, check_order, check_order_enabled, check_order_initial


@dataclass(frozen=True)
class Check:
    """Which check a result answers.

    ``part`` is ``"invariants"`` or ``"order"``; ``kind`` is ``"initial"``,
    ``"preserve"`` or ``"enabled"``; ``step`` is the step (or queue step) and
    ``name`` the invariant (or order property), where the check has one.
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
    """The invariants (initial, step x invariant, preconditions) and the eviction order."""

    initial: dict[str, Result]
    matrix: dict[str, dict[str, Result]]
    enabled: dict[str, Result]
    seconds: float
    order: OrderProofs

    def results(self) -> Iterator[Result]:
        """The invariant part's results (not the order's)."""
        yield from self.initial.values()
        yield from self.enabled.values()
        for row in self.matrix.values():
            yield from row.values()

    @property
    def ok(self) -> bool:
        """Every check of both parts proven (``unknown`` is a failure: a timeout proves nothing)."""
        return all(r.status == PROVEN for r in (*self.results(), *self.order.results()))


OnResult = Callable[[Check, Result], None]


def check_count() -> int:
    """How many checks :func:`prove_all` runs (for a progress bar)."""
    names, steps = len(SYM_INVARIANTS), len(transitions.STEPS)
    return names * (steps + 1) + steps + 1 + len(QSTEPS) * (len(ORDER_PROPERTIES) + 1)


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
    matrix = {st: {n: told(Check("invariants", "preserve", st, n), check_preservation(st, n, timeout_ms))
                   for n in names} for st in steps}
    enabled = {st: told(Check("invariants", "enabled", st), check_enabled(st, timeout_ms)) for st in steps}
    seconds = time.perf_counter() - start
    return Proofs(initial, matrix, enabled, seconds, _prove_order(timeout_ms, told))


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
