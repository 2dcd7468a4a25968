"""Step properties of the specification: what every call must do, as named predicates.

An invariant (:mod:`.invariants`) speaks of one state; a step property speaks
of one call: the state before it, the call, and the state after it.  Each is
registered in ``STEP_PROPERTIES`` under its name, the name every other layer
uses (the z3 order proofs, the bounded model checker, the event checker, the
claims table, the tests).

The queue properties are stated from the call and the state before it, not
from the action's code, so that a broken action is caught by them:

* ``get_new_blocks(n)`` hands out the first ``n`` blocks of the queue;
* ``free_blocks(ids)``: each real block whose last reference the call drops
  joins the queue in the order of its last listing: unhashed ones at the head
  (reused first), hashed ones at the tail (least recently freed, evicted first);
* ``unpin_blocks(ids, w)``: the same blocks, all at the tail;
* ``touch(ids)``: the touched idle real blocks leave the queue;
* every other call leaves the queue as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .events import Cleared, Removed, Stored
from .request import prefix_key
from .state import NULL, Key, PoolState


@dataclass(frozen=True)
class Transition:
    """One call: the state before it, the call, and what came of it.

    A refused call is a transition too: ``refused`` is set, ``refusal`` names
    its kind (a :class:`~.refusals.RefusalKind` name) and ``after`` is the
    state the call left behind (which must be ``before``).
    """

    action: str
    args: tuple[Any, ...]
    before: PoolState
    after: PoolState
    result: Any = None
    refused: bool = False
    refusal: str | None = None


StepProperty = Callable[[Transition], bool]
STEP_PROPERTIES: dict[str, StepProperty] = {}


def step_property(pred: StepProperty) -> StepProperty:
    """Register ``pred`` under its name; its docstring's first line explains it."""
    STEP_PROPERTIES[pred.__name__] = pred
    return pred


def policy_queue(before: PoolState, action: str, args: Sequence[Any]) -> tuple[int, ...]:
    """The free queue the eviction policy prescribes after an accepted call (module docstring)."""
    q = before.free
    if action == "get_new_blocks":
        return q[args[0]:]
    if action == "touch":
        gone = {b for b in args[0] if b != NULL and before.ref[b] == 0}
        return tuple(b for b in q if b not in gone)
    if action in ("free_blocks", "unpin_blocks"):
        ids = list(args[0])
        last = {b: i for i, b in enumerate(ids)}
        idle = [b for b in sorted(last, key=last.__getitem__)
                if b != NULL and ids.count(b) == before.ref[b]]
        if action == "unpin_blocks":
            return (*q, *idle)
        hashed = [b for b in idle if before.caching and before.primary[b] is not None]
        return (*(b for b in idle if b not in hashed), *q, *hashed)
    return q


@step_property
def queue_keeps_relative_order(t: Transition) -> bool:
    """Blocks in the free queue before and after a call keep their relative order."""
    if t.refused:
        return True
    in_before, in_after = set(t.before.free), set(t.after.free)
    return [b for b in t.before.free if b in in_after] == [b for b in t.after.free if b in in_before]


@step_property
def allocation_takes_queue_head(t: Transition) -> bool:
    """``get_new_blocks(n)`` hands out the first ``n`` queued blocks, in queue order."""
    if t.refused or t.action != "get_new_blocks":
        return True
    n = t.args[0]
    return list(t.result) == list(t.before.free[:n]) and t.after.free == t.before.free[n:]


@step_property
def queue_follows_eviction_policy(t: Transition) -> bool:
    """Freed blocks join the queue where the eviction policy says; hits leave it; nothing else moves."""
    if t.refused or t.action == "get_new_blocks":
        return True
    return t.after.free == policy_queue(t.before, t.action, t.args)


def _live_after_events(t: Transition) -> tuple[dict[Key, int], bool]:
    """Live announcements per key after the call's events, and whether a removal named a dead key.

    Announcements are the ``Stored`` of ``cache_*`` (``emit_cached_block_events``
    re-announces hits, it adds no copy) and the caller's own announcement of
    an entry ``_insert_block_hash`` adds; a ``Cleared`` forgets them all.
    Before the call, the live announcements of a key are its index entries
    (:func:`event_announcements_match_index` holds there).
    """
    live = {key: len(blocks) for key, blocks in t.before.index.items()}
    dead_removal = False
    if t.action == "_insert_block_hash" and not t.refused:
        request, prefix_tokens, group, block = t.args[:4]
        key = prefix_key(request, prefix_tokens, t.before.hash_block_size, group)
        if block not in t.before.index.get(key, ()):
            live[key] = live.get(key, 0) + 1
    for ev in t.after.events[len(t.before.events):]:
        if isinstance(ev, Cleared):
            live = {}
        elif isinstance(ev, Removed):
            key = (ev.hash, ev.group)
            dead_removal = dead_removal or live.get(key, 0) <= 0
            live[key] = live.get(key, 0) - 1
        elif isinstance(ev, Stored) and t.action != "emit_cached_block_events":
            for h in ev.hashes:
                live[(h, ev.group)] = live.get((h, ev.group), 0) + 1
    return live, dead_removal


@step_property
def event_removals_name_live_keys(t: Transition) -> bool:
    """A ``Removed`` names a key announced and not yet removed or cleared."""
    if not t.before.events_on:
        return True
    return not _live_after_events(t)[1]


@step_property
def event_announcements_match_index(t: Transition) -> bool:
    """After a call, each key's live announcements equal its index entries."""
    if not t.before.events_on:
        return True
    live, _ = _live_after_events(t)
    return {k: v for k, v in live.items() if v} == {k: len(b) for k, b in t.after.index.items()}


@step_property
def fired_watchers_were_registered(t: Transition) -> bool:
    """A reuse notice goes to the watcher registered on that block before the call."""
    return all(t.before.watchers.get(b) is w for w, b in t.after.fired[len(t.before.fired):])


def _in_use(s: PoolState) -> int:
    """Real blocks someone holds, counted from the reference counts (not from the queue)."""
    return sum(1 for b in range(1, s.num_blocks) if s.ref[b] > 0)


@step_property
def reset_needs_an_idle_pool(t: Transition) -> bool:
    """``reset_prefix_cache`` succeeds exactly when no real block is in use, and then forgets every hash."""
    if t.action != "reset_prefix_cache" or t.refused:
        return True
    if _in_use(t.before):
        return t.result is False and t.after == t.before
    return t.result is True and not t.after.index and not t.after.watchers


@step_property
def allocation_succeeds_iff_enough_free(t: Transition) -> bool:
    """``get_new_blocks(n)`` is refused for want of blocks exactly when fewer than ``n`` are idle."""
    if t.action != "get_new_blocks" or t.refusal == "INVALID_ARGUMENT":
        return True
    idle = t.before.num_blocks - 1 - _in_use(t.before)
    return (t.refusal == "NOT_ENOUGH_FREE_BLOCKS") == bool(t.args[0] > idle)


@step_property
def conflicting_caches_are_refused(t: Transition) -> bool:
    """``cache_full_blocks`` never re-caches a block already cached at a prefix as long."""
    if t.action != "cache_full_blocks" or t.refused:
        return True
    block_ids, num_cached, num_full, block_size = t.args[1], t.args[2], t.args[3], t.args[4]
    mask = t.args[6] if len(t.args) > 6 else None
    for i in range(num_cached, min(num_full, len(block_ids))):
        b, p = block_ids[i], t.before.primary[block_ids[i]]
        chosen = b != NULL and (mask is None or mask[i - num_cached])
        if chosen and p is not None and p.num_tokens >= (i + 1) * block_size:
            return False
    return True


@step_property
def refused_call_changes_nothing(t: Transition) -> bool:
    """A refused call leaves the state, pending events included, exactly as it was."""
    return not t.refused or (t.after == t.before)


QUEUE_ORDER = ("queue_keeps_relative_order", "allocation_takes_queue_head",
               "queue_follows_eviction_policy")
"""The step properties about the free queue's order: the eviction order."""
EVENT_LOG = ("event_removals_name_live_keys", "event_announcements_match_index")
"""The step properties about the event log a consumer rebuilds the index from."""


def broken_by(t: Transition) -> list[str]:
    """Names of the step properties ``t`` breaks (empty when it keeps them all)."""
    return [name for name, pred in STEP_PROPERTIES.items() if not pred(t)]
