"""Run a seeded bug's forms against the checks that must catch them.

Each function returns a :class:`Caught`: which properties (or, for the
lockstep, which observed parts) the form broke, and what it cost.  An empty
``by`` means the check missed the bug: the check is then weaker than claimed.
Results are cached per bug and budget, so the tests and ``kvpool verify``
share the searches.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.model import ACTIONS
from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.core.lockstep import Divergence
from kvpool.oracle.search.campaign import run_one
from kvpool.proofs import bmc
from kvpool.proofs.inductive import COUNTEREXAMPLE, SCOPE, TIMEOUT_MS, find_counterexample
from kvpool.proofs.invariants import SYM_INVARIANTS
from kvpool.proofs.order import ORDER_PROPERTIES, find_order_counterexample
from kvpool.proofs.step_properties import SYM_STEP_PROPERTIES, applies

from .catalogue import BUGS, SeededBug, forms
from .pools import patches_take_effect


@dataclass(frozen=True)
class Caught:
    """What one check found against one form of a seeded bug."""

    method: str
    """``inductive`` (z3 step), ``order`` (z3 queue step), ``bmc`` or ``lockstep``."""
    by: tuple[str, ...]
    """The properties the form broke (lockstep: the parts that differed); empty: missed."""
    seconds: float
    detail: str = ""
    trace: Any = field(default=None, compare=False, repr=False)
    """The BMC's outcome or the lockstep's divergence, for a picture of the failure."""


@functools.cache
def refute_z3(name: str, scope: int = SCOPE, timeout_ms: int = TIMEOUT_MS) -> Caught:
    """Search a small pool for a state where the broken step breaks an encoded invariant or
    one of the step properties of the step it breaks."""
    form = BUGS[name].z3
    if form is None:
        raise ValueError(f"{name} has no z3 form")
    started = time.perf_counter()
    targets = [*SYM_INVARIANTS, *(p for p in SYM_STEP_PROPERTIES if applies(p, form.name))]
    results = {name: find_counterexample(form, name, scope, timeout_ms) for name in targets}
    by = tuple(name for name, r in results.items() if r.status == COUNTEREXAMPLE)
    return Caught("inductive", by, time.perf_counter() - started)


@functools.cache
def refute_queue(name: str, scope: int = 4) -> Caught:
    """Search a small queue for a step where the broken queue step breaks an order property."""
    form = BUGS[name].queue
    if form is None:
        raise ValueError(f"{name} has no queue form")
    started = time.perf_counter()
    by = tuple(p for p in ORDER_PROPERTIES
               if find_order_counterexample(form, p, scope).status == COUNTEREXAMPLE)
    return Caught("order", by, time.perf_counter() - started)


def bmc_config(bug: SeededBug, cfg: bmc.Bounds | None = None) -> bmc.Bounds:
    """The pool in which the BMC looks for ``bug``: ``cfg`` with the bug's overrides."""
    return replace(cfg or bmc.Bounds(), **dict(bug.bmc))


def with_bug(name: str) -> dict[str, Any]:
    """The model's actions with ``name``'s action form in place of the correct one."""
    form = BUGS[name].action
    if form is None:
        raise ValueError(f"{name} has no action form")
    action, broken = form
    return {**ACTIONS, action: broken}


@functools.cache
def find_with_bmc(name: str, cfg: bmc.Bounds | None = None, depth: int = 6,
                  seconds: float = 60.0) -> Caught:
    """Explore every call sequence with the broken action until a property breaks."""
    out = bmc.explore(bmc_config(BUGS[name], cfg), depth, seconds, with_bug(name))
    return Caught("bmc", tuple(out.violation), out.seconds,
                  f"depth {out.depth}, {out.states} states", out)


@functools.cache
def catch_with_lockstep(name: str, runs: int = 16, steps: int = 2000, seed: int = 0) -> Caught:
    """Run the seeded workload on the broken pool, seed after seed, until it diverges."""
    form = BUGS[name].pool
    if form is None:
        raise ValueError(f"{name} has no pool form")
    if not patches_take_effect(form):  # it would agree with the model and look missed
        raise RuntimeError(f"{name} replaces functions of kvpool.impl, which the compiled build "
                           "(KVPOOL_COMPILE=1) does not see: run the seeded bugs on the plain build")
    factory = kvpool_adapter(form).factory()
    started = time.perf_counter()
    calls = 0
    for run in range(runs):
        try:
            pair = run_one(factory, seed + run, steps)
        except Divergence as exc:
            return Caught("lockstep", tuple(exc.parts) or ("divergence",),
                          time.perf_counter() - started, f"seed {seed + run}: {exc}", exc)
        calls += pair.steps
    return Caught("lockstep", (), time.perf_counter() - started,
                  f"{runs} runs, {calls} calls agreed with the model")


def every_check(name: str, *, bmc_seconds: float = 60.0, runs: int = 16, steps: int = 2000,
                timeout_ms: int = TIMEOUT_MS) -> list[Caught]:
    """Each form of ``name`` against the check for its layer, in the layers' order (:func:`forms`)."""
    check: dict[str, Callable[[], Caught]] = {
        "z3": lambda: refute_z3(name, timeout_ms=timeout_ms), "queue": lambda: refute_queue(name),
        "action": lambda: find_with_bmc(name, seconds=bmc_seconds),
        "pool": lambda: catch_with_lockstep(name, runs, steps)}
    return [check[layer]() for layer in forms(BUGS[name])]
