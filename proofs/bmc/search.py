"""Breadth-first search of every call sequence of a small pool, up to a depth.

States are deduplicated on a canonical form (:mod:`.symmetry`); the events a
step emits and the notices it delivers are checked when they happen, then
dropped from the state, so the state space stays finite.  After every step
the search checks every model invariant and every step property
(:mod:`kvpool.model.properties`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.model import ACTIONS, CALLER_ACTIONS, ContractBroken, Refusal, violated
from kvpool.model.properties import Transition, broken_by
from kvpool.model.state import PoolState

from .domains import DEFAULT, Action, Call, Config, calls
from .symmetry import canonical, orbit_key, renamings_of


@dataclass
class Step:
    """One transition on a trace: the call, the states around it, the result."""

    action: str
    args: tuple[Any, ...]
    before: PoolState
    after: PoolState
    result: Any = None
    error: str | None = None


@dataclass
class Outcome:
    """What a search found: depth fully explored, states seen, any violation."""

    depth: int
    states: int
    transitions: int
    seconds: float
    complete: bool
    violation: list[str] = field(default_factory=list)
    trace: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violation


def apply_call(actions: Mapping[str, Action], s: PoolState, call: Call) -> Step | None:
    """Run one call; ``None`` for a call that breaks a caller contract.

    A refusal is a step too (its ``after`` is the state the call left behind,
    ``before`` itself when the refusal was clean): the step properties speak
    of refusals (a refused call changes nothing; allocation is refused only
    when too few blocks are idle).
    """
    name, args = call
    try:
        nxt, result = (actions.get(name) or CALLER_ACTIONS[name])(s, *args)
    except ContractBroken:
        return None  # outside the specification: no successor to check
    except Refusal as e:
        left = getattr(e, "state", None)
        if left is None or (canonical(left) == canonical(s) and left.events == s.events):
            left = s
        return Step(name, args, s, left, None, e.kind.name)
    return Step(name, args, s, nxt, result)


def _check(step: Step, state_too: bool = True) -> list[str]:
    """Every property of one step (the invariants only if the state is new)."""
    changed = step.after is not step.before
    bad = violated(step.after) if state_too or (step.error and changed) else []
    return bad + broken_by(Transition(step.action, step.args, step.before, step.after, step.result,
                                      refused=step.error is not None, refusal=step.error))


def explore(
    cfg: Config = DEFAULT, depth: int = 3, seconds: float = 20.0,
    actions: Mapping[str, Action] | None = None, visit: Callable[[PoolState], None] | None = None,
) -> Outcome:
    """Breadth-first search of all call sequences up to ``depth`` within ``seconds``.

    ``actions`` replace the model's own by name (a seeded bug); the caller's
    writes (``CALLER_ACTIONS``) are explored too.  ``visit`` (if given) is
    called on each state the search keeps, the initial one included: one per
    class with :attr:`Config.symmetry`.
    """
    start = time.perf_counter()
    actions = {**ACTIONS, **CALLER_ACTIONS, **(actions or {})}
    requests = cfg.requests()
    s0 = cfg.initial()
    if cfg.symmetry:
        renamings = renamings_of(cfg)
        memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}

        def key(s: PoolState) -> tuple[Any, ...]:
            # Most steps reach a state seen before: look it up by its exact
            # variables (dict order included) before canonicalising it.
            exact = (s.ref, s.free, s.primary, s.secondary, s.holds, tuple(s.index.items()),
                     tuple(s.watchers.items()), tuple(s.names.items()), s.holders, s.announced)
            if exact not in memo:
                memo[exact] = orbit_key(s, renamings)
            return memo[exact]
    else:
        key = canonical
    parent: dict[tuple[Any, ...], Step | None] = {key(s0): None}
    frontier = [s0]
    done, transitions = 0, 0
    if visit is not None:
        visit(s0)

    def trace_to(last: Step) -> list[Step]:
        out = [last]
        p = parent[key(last.before)]
        while p is not None:
            out.append(p)
            p = parent[key(p.before)]
        return out[::-1]

    for level in range(1, depth + 1):
        nxt: list[PoolState] = []
        for s in frontier:
            if time.perf_counter() - start > seconds:
                return Outcome(done, len(parent), transitions, time.perf_counter() - start, False)
            for call in calls(s, cfg, requests):
                step = apply_call(actions, s, call)
                if step is None:
                    continue
                transitions += 1
                c = key(step.after)
                seen = c in parent  # then its invariants were checked already
                bad = _check(step, state_too=not seen)
                if bad:
                    return Outcome(level - 1, len(parent), transitions,
                                   time.perf_counter() - start, False, bad, trace_to(step))
                if not seen:
                    parent[c] = step  # its events are kept for the trace
                    nxt.append(replace(step.after, events=(), fired=(), told=()))
                    if visit is not None:
                        visit(nxt[-1])
        done, frontier = level, nxt
        if not frontier:
            break
    return Outcome(done, len(parent), transitions, time.perf_counter() - start, True)


