"""Breadth-first search of every call sequence of a small pool, up to a depth.

States are deduplicated on a canonical form (:mod:`.symmetry`); the events a
step emits and the notices it delivers are checked when they happen, then
dropped from the state, so the state space stays finite.  After every step
the search checks every model invariant and every step property
(:mod:`kvpool.model.properties`).

A search can be one *part* of a sharded search (``part=(i, n)``): every part
explores the same levels up to ``split_depth``, then sorts that level's states
by their digest and keeps every ``n``-th from the ``i``-th on.  Parts reach some
states beyond the split from several kept states; :class:`PartFigures` names each
state it reached beyond the split by a digest, with the calls made from it, so
that the union of the parts has exactly the figures of one unsharded search
(:func:`merge_parts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.model import ACTIONS, CALLER_ACTIONS, OPERATIONS, ContractBroken, Operation, Refusal, violated
from kvpool.model.levels import Stop, Stopwatch, breadth_first
from kvpool.model.properties import Transition, broken_by
from kvpool.model.state import PoolState, QueuedTwice

from .domains import DEFAULT, Action, Bounds, Call, calls
from .symmetry import state_digest, state_key


@dataclass
class PartFigures:
    """What one part of a sharded search saw (see :func:`explore`'s ``part``).

    ``prefix_states`` and ``prefix_transitions`` are the levels every part shares
    (states up to the split depth; calls from states above it); ``frontier`` is
    the number of states at the split depth, ``owned`` how many this part kept,
    ``owned_transitions`` the calls made from them; ``beyond`` maps the digest of
    each state this part reached deeper than the split to the calls it made from
    it (0 for a state on the last level, not expanded).
    """

    index: int
    count: int
    split_depth: int
    frontier: int = 0
    owned: int = 0
    prefix_states: int = 0
    prefix_transitions: int = 0
    owned_transitions: int = 0
    beyond: dict[bytes, int] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a search found: depth fully explored, states seen, any violation."""

    depth: int
    states: int
    transitions: int
    seconds: float
    complete: bool
    violation: list[str] = field(default_factory=list)
    trace: list[Transition] = field(default_factory=list)
    part: PartFigures | None = None
    """The part's own figures, when the search was one part of a sharded search."""
    expanded: int = 0
    """States of the last level whose calls were all made when the budget stopped the search
    (how far into level ``depth + 1`` it got); ``frontier`` of them."""
    frontier: int = 0

    @property
    def ok(self) -> bool:
        return not self.violation


def apply_call(actions: Mapping[str, Action], s: PoolState, call: Call) -> Transition | None:
    """Run one call on a copy of ``s``; ``None`` for a call that breaks a caller contract.

    A refusal is a transition too (its ``after`` is the state the call left
    behind: ``s`` itself when it changed nothing): the step properties speak
    of refusals (a refused call changes nothing; allocation is refused only
    when too few blocks are idle).  The transition carries the call's
    footprint as declared, for the check that nothing outside it changed.
    """
    name, args = call
    op = OPERATIONS[name]
    act = actions.get(name) or CALLER_ACTIONS[name]
    if act is ACTIONS.get(name) or act is CALLER_ACTIONS.get(name):
        return _apply_declared(op, s, args)
    left = s.copy()
    try:
        nxt, result = act(left, *args)
    except ContractBroken:
        return None  # outside the specification: no successor to check
    except Refusal as e:
        after = s if left == s and left.events == s.events else left
        return op.transition(s, after, args, refusal=e.kind.name)
    except QueuedTwice as e:  # a wrong action: the queue cannot show what it did
        return replace(op.transition(s, left, args, out=left.out), breaks=(e.invariant,))
    return op.transition(s, nxt, args, result, out=nxt.out)


def _apply_declared(op: Operation, s: PoolState, args: tuple[Any, ...]) -> Transition | None:
    """:func:`apply_call` for the model's own action: its guard and contracts read ``s`` without
    changing it, so only an accepted call that changes something needs a copy."""
    bound = op.bind(args)
    try:
        noop = op.prepare(s, bound)
    except ContractBroken:
        return None
    except Refusal as e:
        return op.transition(s, s, args, refusal=e.kind.name)
    if noop is not None:
        return op.transition(s, s, args, noop.result)
    after = s.copy()
    result = op.next(after, *bound)
    return op.transition(s, after, args, result, out=after.out)


def _check(step: Transition, state_too: bool = True) -> list[str]:
    """Every property of one step (the invariants only if the state is new)."""
    changed = step.after is not step.before
    bad = violated(step.after) if state_too or (step.refused and changed) else []
    return [*step.breaks, *bad, *broken_by(step)]


def explore(
    cfg: Bounds = DEFAULT, depth: int = 3, seconds: float = 20.0,
    actions: Mapping[str, Action] | None = None, visit: Callable[[PoolState], None] | None = None,
    part: tuple[int, int] | None = None, split_depth: int = 2,
) -> Outcome:
    """Breadth-first search of all call sequences up to ``depth`` within ``seconds``.

    ``actions`` replace the model's own by name (a seeded bug); the caller's
    writes (``CALLER_ACTIONS``) are explored too.  ``visit`` (if given) is
    called on each state the search keeps, the initial one included: one per
    class with :attr:`Bounds.symmetry`.

    ``part=(i, n)`` (``0 <= i < n``) makes this the ``i``-th of ``n`` parts: the
    levels up to ``min(split_depth, depth - 1)`` are explored in full, then only
    the states of that level whose place, sorted by digest, is ``i`` modulo ``n``
    are explored further.  ``states`` and ``transitions`` are then this part's
    own; :func:`merge_parts` joins the parts.
    """
    if part is not None and not (0 <= part[0] < part[1]):
        raise ValueError(f"part {part}: need 0 <= index < count")
    split = max(0, min(split_depth, depth - 1))
    figures = None if part is None else PartFigures(part[0], part[1], split)
    watch = Stopwatch()
    actions = {**ACTIONS, **CALLER_ACTIONS, **(actions or {})}
    requests = cfg.requests()
    s0 = cfg.initial()
    key = state_key(cfg)
    parent: dict[tuple[Any, ...], Transition | None] = {key(s0): None}
    transitions = 0
    found: list[Any] = []  # the violation and the step that shows it, when one is found
    if visit is not None:
        visit(s0)

    def trace_to(last: Transition) -> list[Transition]:
        out = [last]
        while (p := parent[key(out[-1].before)]) is not None:
            out.append(p)
        return out[::-1]

    def select(level: int, frontier: list[PoolState]) -> list[PoolState]:
        """One part's share of the split level (every state elsewhere)."""
        if figures is None or level != split:
            return frontier
        figures.frontier = len(frontier)
        figures.prefix_states, figures.prefix_transitions = len(parent), transitions
        figures.owned = len(mine := sorted(frontier, key=lambda st: state_digest(key(st)))[
            figures.index::figures.count])
        return mine

    def expand(s: PoolState, level: int) -> list[PoolState]:
        nonlocal transitions
        made = 0
        nxt: list[PoolState] = []
        for call in calls(s, cfg, requests):
            step = apply_call(actions, s, call)
            if step is None:
                continue
            transitions += 1
            made += 1
            c = key(step.after)
            seen = c in parent  # then its invariants were checked already
            bad = _check(step, state_too=not seen)
            if bad:
                found[:] = [bad, step]
                raise Stop
            if not seen:
                parent[c] = step  # its events are kept for the trace
                step.after.events = []  # checked as they were emitted (step.out)
                nxt.append(step.after)
                if figures is not None and level > split:
                    figures.beyond[state_digest(c)] = 0
                if visit is not None:
                    visit(nxt[-1])
        if figures is not None and level - 1 > split:
            figures.beyond[state_digest(key(s))] = made
        elif figures is not None and level - 1 == split:
            figures.owned_transitions += made
        return nxt

    levels = breadth_first([s0], depth, expand, over_budget=watch.past(seconds), select=select)
    if figures is not None and depth <= split:  # nothing to split: every part is the whole search
        figures.prefix_states, figures.prefix_transitions = len(parent), transitions
    return Outcome(levels.depth, len(parent), transitions, watch.seconds(), levels.complete,
                   found[0] if found else [], trace_to(found[1]) if found else [], figures,
                   0 if levels.stopped else levels.expanded, levels.frontier)


def merge_parts(parts: list[PartFigures]) -> tuple[int, int]:
    """The states and transitions of one unsharded search, from all its parts' figures.

    States up to the split are every part's; beyond it a state is counted once
    however many parts reached it, with the calls made from it by a part that
    expanded it (a part that reached it only on the last level did not).
    """
    if not parts:
        return 0, 0
    beyond: dict[bytes, int] = {}
    for p in parts:
        for d, made in p.beyond.items():
            if made > beyond.get(d, -1):
                beyond[d] = made
    first = parts[0]
    return (first.prefix_states + len(beyond),
            first.prefix_transitions + sum(p.owned_transitions for p in parts) + sum(beyond.values()))
