"""The free queue as a sequence, and the step properties both ways: on every accepted call, the z3
queue steps leave the model's queue in order, and each z3 step property equals the model's, on the
call as made and on transitions altered to break one property in the model."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from kvpool.model import OPERATIONS
from kvpool.model.events import Removed, Stored
from kvpool.model.properties import CACHE_RECORDS, EVICTIONS, QUEUE_ORDER, STEP_PROPERTIES, Transition
from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import extends
from kvpool.model.split import Split
from kvpool.model.state import Output, PoolState, Primary, Queue

from .. import bmc
from ..evaluate.interp import Interp, QInterp, abstract, queue_of, queue_order
from ..evaluate.runtime import Undetermined
from .report import Disagreement, Run
from .show import described, show_bool
from .states import perturbations, unfaithful

Plan = Split
"""A call as z3 steps (the declaration's split, :mod:`kvpool.model.split`)."""


QueueRun = list[tuple[QInterp, QInterp, str, tuple[Any, ...]]]
"""Queue steps as run: (queue before, queue after, step, arguments)."""
StepRun = list[tuple[str, Interp, Interp, tuple[Any, ...], frozenset[tuple[int, int]],
                     frozenset[tuple[int, int]]]]
"""z3 steps as run: (step, state before, state after, arguments, removed, stored)."""


def queue_plan(p: Plan, after: PoolState) -> list[tuple[str, tuple[Any, ...]]]:
    """An accepted call as queue steps (:data:`.order.QSTEPS`), from its split: ``free_blocks``
    reserves a head place per listing first; a step that changes hashes is ``recache`` of each
    block it names, to the cachedness the block ends with."""
    def cached(b: int) -> bool:
        return after.caching and after.primary[b] is not None

    releases = sum(1 for st, _a in p.steps if st == "release")
    out: list[tuple[str, tuple[Any, ...]]] = [("open_batch", (releases,))] if releases else []
    for st, a in p.steps:
        if st in ("alloc", "release", "touch", "unpin"):
            out.append((st, (a[0],)))
        elif st == "reset":
            out.append(("uncache_all", ()))
        elif st in ("evict", "cache_full", "cache_partial", "insert", "move"):
            out += [("recache", (b, cached(b))) for b in ((a[0], a[1]) if st == "move" else (a[0],))]
        else:
            out.append(("identity", ()))
    return out


def check_queue(run: Run, s: PoolState, after: PoolState, call: bmc.Call, p: Plan) -> QueueRun:
    """The queue steps from ``s``'s queue: enabled, and leaving ``after``'s queue, IN ORDER."""
    rep = run.report
    q = queue_of(s)
    done: QueueRun = []
    try:
        for name, args in queue_plan(p, after):
            step = run.compiled.queue[name]
            if not step.pre(q, *args):
                rep.add(Disagreement(f"queue/{name}", s, described(call, "accepted"),
                                     f"the z3 queue step {name}{args} is not enabled"))
                return []
            nq = step.post(q, *args)
            done.append((q, nq, name, args))
            q = nq
        got = queue_order(q)
    except Undetermined as exc:
        rep.add(Disagreement("queue/order", s, described(call, "accepted"), f"undetermined: {exc}"))
        return []
    rep.queues += 1
    want = queue_of(after)
    if got != tuple(after.free) or (q.ref, q.free, q.cached) != (want.ref, want.free, want.cached):
        rep.add(Disagreement("queue/order", s, described(call, "accepted"),
                             f"z3's queue {list(got)}, the model's {list(after.free)}"
                             + ("" if (q.ref, q.cached) == (want.ref, want.cached)
                                else f"; counts or cachedness differ: z3 {q.ref} {q.cached}, model "
                                     f"{want.ref} {want.cached}")))
    return done


def _z3_says(run: Run, steps: StepRun, queue: QueueRun, last_enabled: bool = True) -> dict[str, bool | None]:
    """Each step property the z3 side states of the call: every step it speaks of keeps it
    (``None``: it reads a cell the model leaves undefined); ``last_enabled``: whether the last
    step is taken as enabled (a call refused at its last step: not)."""
    out: dict[str, bool | None] = {}
    for prop, per_step in run.compiled.claims.items():
        for i, (name, st, post, args, removed, stored) in enumerate(steps):
            claim = per_step.get(name)
            if claim is None:
                continue
            enabled = last_enabled or i < len(steps) - 1
            try:
                held: bool | None = claim(st, post, *args, enabled, removed, stored)
            except Undetermined:
                held = None
            prev = out.get(prop, True)
            out[prop] = None if prev is None or held is None else prev and held
    for q, qp, name, args in queue:
        for prop, claim in run.compiled.queue[name].claims.items():
            if prop in STEP_PROPERTIES:
                prev = out.get(prop, True)
                out[prop] = None if prev is None else prev and claim(q, qp, *args)
    return out


def _compare(run: Run, s: PoolState, call: bmc.Call, t: Transition, said: Mapping[str, bool | None],
             what: str) -> None:
    """The model's step properties of ``t`` against what z3 says of them, both ways."""
    for prop, z in said.items():
        want = STEP_PROPERTIES[prop](t)
        counts = run.report.properties.setdefault(prop, [0, 0])
        counts[0 if want else 1] += 1
        if z is not want:
            run.report.add(Disagreement(
                f"property/{prop}", s, described(call, what),
                f"{prop}: model {want}, z3 {show_bool(z)}"))


def check_properties(run: Run, s: PoolState, nxt: PoolState, result: Any, call: bmc.Call,
                      steps: StepRun, queue: QueueRun) -> None:
    """Every step property z3 states against the model's, both ways, on the call as made and on
    transitions made wrong on purpose.

    Reachable calls keep every property, so each accepted call (one in ``perturb`` of them,
    rotating) is also altered in ways that break one property in the model (:func:`_altered`),
    and, for a call of one z3 step, its next state is perturbed as the states are
    (:func:`.states.perturbations`; on one in ``perturb`` of the altered calls, one in ``perturb``
    of the perturbations, rotating so that every kind comes round; the unfaithful ones and those
    that edit the announcements alone left out).  On each, every property z3 states is compared
    with the model's (the queue-order ones on the alterations made for them: the z3 three divide
    the order per step, the model's per call, and their conjunctions agree where the queue does):
    a property true in one and false in the other is a disagreement, whichever is false, so a z3
    property weaker than the model's by any conjunct an alteration breaks is caught.
    """
    name, args = call
    op = OPERATIONS[name]
    _compare(run, s, call, op.transition(s, nxt, args, result, out=nxt.out), _z3_says(run, steps, queue),
             "accepted")
    run.turn += 1
    if not steps or run.perturb == 0 or run.turn % run.perturb:
        return
    for alt in _altered(run, s, nxt, result, call, steps, queue):
        st_, post, a, rem, sto = alt.last
        said = _z3_says(run, [*steps[:-1], (steps[-1][0], st_, steps[-1][2] if post is None else post, a,
                                            rem, sto)],
                        [*queue[:-1], alt.qlast] if alt.qlast is not None else queue, alt.enabled)
        # the queue properties divide the order differently per step and per call: each is
        # compared on the alterations made for it (the queue itself is compared whole, above)
        _compare(run, s, call, op.transition(alt.before or s, alt.after, args, alt.result, alt.refusal,
                                             out=alt.out),
                 {n: v for n, v in said.items() if n == alt.prop or n not in QUEUE_ORDER},
                 f"altered: {alt.label}")
    if len(steps) != 1 or (run.turn // run.perturb) % run.perturb:  # a perturbed state is the
        return  # result of the call, not of its last step alone; one in perturb of the altered calls
    step, before_i, _post, cargs, removed, stored = steps[0]
    d = run.compiled.domain
    for j, (label, ps) in enumerate(perturbations(nxt, d, run.turn)):
        # the model's event properties read the call's events, z3's the announcements they leave:
        # a state whose announcements alone are edited is no transition of either
        if (run.turn + j) % run.perturb or unfaithful(ps) or ps.announced != nxt.announced:
            continue
        said = _z3_says(run, [(step, before_i, abstract(d, ps), cargs, removed, stored)], [])
        _compare(run, s, call, op.transition(s, ps, args, result, out=nxt.out), said,
                 f"its next state perturbed: {label}")


class Altered(NamedTuple):
    """A transition altered to break one property in the model, and the same on the z3 side."""

    label: str
    prop: str
    """The property the alteration breaks."""
    after: PoolState
    result: Any
    out: Output
    last: tuple[Interp, Any, tuple[Any, ...], frozenset[tuple[int, int]], frozenset[tuple[int, int]]]
    """The last z3 step's (state, post or None: unchanged, args, removed, stored)."""
    qlast: tuple[QInterp, QInterp, str, tuple[Any, ...]] | None
    """The last queue step, altered (None: unchanged)."""
    before: PoolState | None = None
    """The state before, when the alteration changes it too (None: the reached one)."""
    refusal: str | None = None
    """The refusal the altered call ends in (None: accepted)."""
    enabled: bool = True
    """Whether the last z3 step is enabled in the altered transition."""


def _refused_on_purpose(run: Run, s: PoolState, nxt: PoolState, result: Any, call: bmc.Call,
                        steps: StepRun) -> Iterator[Altered]:
    """The properties about when a step is enabled, made false: a reset refused on an idle pool, an
    allocation refused with enough idle blocks, a block cached again at a prefix as long (the state
    before altered so); each with the last z3 step disabled, or its state before the same."""
    d = run.compiled.domain
    name = call[0]
    lname, lst, _post, largs, lrem, lsto = steps[-1]
    none: frozenset[tuple[int, int]] = frozenset()
    if name == "reset_prefix_cache" and result is True:
        yield Altered("a reset refused on an idle pool", "reset_needs_an_idle_pool", s, False, Output(),
                      (lst, lst, largs, none, none), None, enabled=False)
    if name == "get_new_blocks" and len(steps) == 1:
        yield Altered("an allocation refused with enough idle blocks", "allocation_succeeds_iff_enough_free",
                      s, None, Output(), (lst, lst, largs, none, none), None,
                      refusal="NOT_ENOUGH_FREE_BLOCKS", enabled=False)
    if name == "cache_full_blocks" and len(steps) == 1 and lname == "cache_full":
        b, t = int(largs[0]), int(largs[2])
        key = d.keys[int(largs[1])]
        before = s.copy()
        before.primary[b] = Primary(key, t)
        yield Altered("a block cached again at a prefix as long", "conflicting_caches_are_refused", nxt,
                      result, nxt.out, (abstract(d, before), None, largs, lrem, lsto), None, before)


def _altered(run: Run, s: PoolState, nxt: PoolState, result: Any, call: bmc.Call, steps: StepRun,
             queue: QueueRun) -> Iterator[Altered]:
    """The call made wrong, one property at a time; each alteration's label says how."""
    d = run.compiled.domain
    name = call[0]
    lname, lst, _post, largs, lrem, lsto = steps[-1]
    same = (lst, None, largs, lrem, lsto)
    if name not in CACHE_RECORDS:
        idle = [x for x in range(1, s.num_blocks) if s.holders[x] == 0 and nxt.holders[x] == 0]
        if idle:
            x = idle[run.turn % len(idle)]
            other = d.contents[(d.content_id[nxt.holds[x]] + 1) % len(d.contents)]
            after = nxt.copy()
            after.holds[x] = other
            yield Altered(
                "content of unheld block changed", "content_changes_only_through_holders", after, result,
                nxt.out, (lst, abstract(d, after), largs, lrem, lsto), None)
    shared = [x for x in range(1, s.num_blocks) if s.holders[x] >= 2 and lst.holders[x] >= 2]
    if shared and len(steps) == 1:
        x = shared[run.turn % len(shared)]
        before = s
        if s.holds[x] == EMPTY_PREFIX:  # nothing replaces the empty prefix: say it held some
            before = s.copy()
            before.holds[x] = max(d.contents, key=len)
        lost = next(c for c in d.contents if not extends(c, before.holds[x]))
        after = nxt.copy()
        after.holds[x] = lost
        yield Altered(
            "a shared block's content replaced", "shared_content_only_grows", after, result, nxt.out,
            (abstract(d, before), abstract(d, after), largs, lrem, lsto), None, before)
    if name in EVICTIONS and lname == "evict" and s.primary[largs[0]] is not None:
        b = largs[0]
        p = s.primary[b]
        assert p is not None
        after = nxt.copy()
        after.primary[b] = p
        after.index[p.key] = (*after.index.get(p.key, ()), b)
        after.names.setdefault(p.key, s.names[p.key])
        yield Altered(
            "evicted block keeps its primary entry", "evicted_blocks_leave_the_index", after, result,
            nxt.out, (lst, abstract(d, after), largs, lrem, lsto), None)
    if s.events_on and name != "emit_cached_block_events":
        live = sorted((k, b) for k, b in s.announced
                      if (k, b) in nxt.announced and (d.key_id[k], b) in lst.live
                      and (d.key_id[k], b) not in lrem)
        if live:
            k, b = live[run.turn % len(live)]
            extra = Stored((k[0],), None, (), 1, None, None, None, k[1], s.medium, None)
            yield Altered(
                "a Stored of a live entry", "event_announcements_match_index", nxt, result,
                Output([*nxt.out.events, extra], nxt.out.fired, nxt.out.told),
                (lst, None, largs, lrem, lsto | {(d.key_id[k], b)}), None)
        touched = {(ev.hash, ev.group) for ev in nxt.out.events if isinstance(ev, Removed)}
        touched |= {(h, ev.group) for ev in nxt.out.events if isinstance(ev, Stored) for h in ev.hashes}
        dead = [k for k in d.keys if k not in touched and k not in nxt.index
                and not any(kk == k for kk, _b in s.announced)]
        if dead:
            k = dead[run.turn % len(dead)]
            yield Altered(
                "a Removed of a key never announced", "event_removals_name_live_keys", nxt, result,
                Output([*nxt.out.events, Removed(k[0], k[1], s.medium)], nxt.out.fired, nxt.out.told),
                (lst, None, largs, lrem | {(d.key_id[k], 1)}, lsto), None)
    if name == "reset_prefix_cache" and result is True:
        after = nxt.copy()
        after.watchers = {1: bmc.watcher_a}
        yield Altered(
            "a watcher kept by the reset", "reset_needs_an_idle_pool", after, result, nxt.out,
            (lst, abstract(d, after), largs, lrem, lsto), None)
    yield from _refused_on_purpose(run, s, nxt, result, call, steps)
    if queue:
        q, qp, qname, qargs = queue[-1]
        stay = [b for b in s.free if b in nxt.free]
        if len(stay) >= 2 and all(qp.free[b] and q.free[b] for b in stay[:2]):
            x, y = stay[0], stay[1]
            after = nxt.copy()
            after.free = Queue(y if b == x else x if b == y else b for b in nxt.free)
            pos = list(qp.pos)
            pos[x], pos[y] = pos[y], pos[x]
            yield Altered(
                "two queued blocks swapped", "queue_keeps_relative_order", after, result, nxt.out, same,
                (q, qp._replace(pos=tuple(pos)), qname, qargs))
        arrived = [b for b in range(s.num_blocks) if qp.free[b] and not q.free[b]]
        if arrived and len(nxt.free) >= 2:
            x = arrived[-1]
            rest = [b for b in nxt.free if b != x]
            to_tail = nxt.free.members()[0] == x
            after = nxt.copy()
            after.free = Queue([*rest, x] if to_tail else [x, *rest])
            places = [v for v in qp.pos if v is not None]
            moved = max(places) + 1 if to_tail else min(places) - 1
            pos = list(qp.pos)
            pos[x] = moved
            yield Altered(
                "a freed block at the other end", "queue_follows_eviction_policy", after, result, nxt.out,
                same, (q, qp._replace(pos=tuple(pos), lo=min(qp.lo, moved), hi=max(qp.hi, moved + 1)),
                       qname, qargs))
        if name == "get_new_blocks" and len(queue) == 1 and len(s.free) >= 2:
            second = s.free.members()[1]
            after = nxt.copy()
            after.free = Queue(b for b in s.free if b != second)
            alloc = run.compiled.queue["alloc"]
            yield Altered(
                "the second queued block handed out", "allocation_takes_queue_head", after, [second],
                nxt.out, same, (q, alloc.post(q, second), "alloc", (second,)))
