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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .events import Cleared, Removed, Stored
from .footprints import Footprint, changed_outside
from .request import extends, prefix_key
from .state import NULL, Key, Output, PoolState


@dataclass(frozen=True)
class Transition:
    """One call: the state before it, the call, and what came of it.

    A refused call is a transition too: ``refused`` is set, ``refusal`` names
    its kind (a :class:`~.refusals.RefusalKind` name) and ``after`` is the
    state the call left behind (which must be ``before``).  ``arg`` reads an
    argument by its declared name; ``out`` is what the call told besides its
    result (events, reuse notices, metrics notices).
    """

    action: str
    args: tuple[Any, ...]
    before: PoolState
    after: PoolState
    result: Any = None
    refused: bool = False
    refusal: str | None = None
    named: Mapping[str, Any] = field(default_factory=dict)
    out: Output = field(default_factory=Output)
    policy: QueuePolicy | None = None
    """The queue the eviction policy prescribes for this operation (None: the queue stays)."""
    footprint: Footprint | None = None
    """What the call may change, as declared (None for a refused call: nothing)."""
    breaks: tuple[str, ...] = ()
    """Invariants the call broke in a way no state can show (a block queued twice)."""

    def arg(self, name: str) -> Any:
        """The argument declared as ``name``."""
        return self.named[name]


QueuePolicy = Callable[..., tuple[int, ...]]
"""An operation's queue policy: ``(state before, *args) -> queue after``."""
StepProperty = Callable[[Transition], bool]
STEP_PROPERTIES: dict[str, StepProperty] = {}


def step_property(pred: StepProperty) -> StepProperty:
    """Register ``pred`` under its name; its docstring's first line explains it."""
    STEP_PROPERTIES[pred.__name__] = pred
    return pred


# --------------------------------------------------------------------------
# The eviction policy, per operation that moves the queue (the declarations name them).


def handed_out_queue(before: PoolState, num_blocks: int) -> tuple[int, ...]:
    """``get_new_blocks(n)``: the queue without its first ``n``."""
    return tuple(before.free)[num_blocks:]


def touched_queue(before: PoolState, block_ids: Sequence[int]) -> tuple[int, ...]:
    """``touch``: the touched idle real blocks leave the queue."""
    gone = {b for b in block_ids if b != NULL and before.ref[b] == 0}
    return tuple(b for b in before.free if b not in gone)


def _released(before: PoolState, block_ids: Sequence[int]) -> list[int]:
    """The real blocks whose last reference the call drops, in the order of their last listing."""
    ids = list(block_ids)
    last = {b: i for i, b in enumerate(ids)}
    return [b for b in sorted(last, key=last.__getitem__) if b != NULL and ids.count(b) == before.ref[b]]


def freed_queue(before: PoolState, block_ids: Sequence[int]) -> tuple[int, ...]:
    """``free_blocks``: unhashed released blocks at the head (reused first), hashed ones at the tail."""
    idle = _released(before, block_ids)
    hashed = [b for b in idle if before.caching and before.primary[b] is not None]
    return (*(b for b in idle if b not in hashed), *before.free, *hashed)


def unpinned_queue(before: PoolState, block_ids: Sequence[int], on_reuse: Any) -> tuple[int, ...]:
    """``unpin_blocks``: the released blocks, all at the tail."""
    return (*before.free, *_released(before, block_ids))


def policy_queue(t: Transition) -> tuple[int, ...]:
    """The free queue the eviction policy prescribes after an accepted call (module docstring)."""
    if t.policy is None:
        return tuple(t.before.free)
    return t.policy(t.before, *t.args)


@step_property
def queue_keeps_relative_order(t: Transition) -> bool:
    """Blocks in the free queue before and after a call keep their relative order."""
    if t.refused:
        return True
    return ([b for b in t.before.free if b in t.after.free]
            == [b for b in t.after.free if b in t.before.free])


@step_property
def allocation_takes_queue_head(t: Transition) -> bool:
    """``get_new_blocks(n)`` hands out the first ``n`` queued blocks, in queue order."""
    if t.refused or t.action != "get_new_blocks":
        return True
    n = t.arg("num_blocks")
    ahead = tuple(t.before.free)
    return list(t.result) == list(ahead[:n]) and tuple(t.after.free) == ahead[n:]


@step_property
def queue_follows_eviction_policy(t: Transition) -> bool:
    """Freed blocks join the queue where the eviction policy says; hits leave it; nothing else moves."""
    if t.refused or t.action == "get_new_blocks":
        return True
    return tuple(t.after.free) == policy_queue(t)


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
        key = prefix_key(t.arg("request"), t.arg("prefix_tokens"), t.before.hash_block_size,
                         t.arg("kv_cache_group_id"))
        if t.arg("block_id") not in t.before.index.get(key, ()):
            live[key] = live.get(key, 0) + 1
    for ev in t.out.events:
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
    live, _ = _live_after_events(t)  # a removal of a dead key is the property above's to judge
    return {k: v for k, v in live.items() if v > 0} == {k: len(b) for k, b in t.after.index.items()}


@step_property
def fired_watchers_were_registered(t: Transition) -> bool:
    """A reuse notice goes to the watcher registered on that block before the call."""
    return all(t.before.watchers.get(b) is w for w, b in t.out.fired)


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
    return (t.refusal == "NOT_ENOUGH_FREE_BLOCKS") == bool(t.arg("num_blocks") > idle)


@step_property
def conflicting_caches_are_refused(t: Transition) -> bool:
    """``cache_full_blocks`` never re-caches a block already cached at a prefix as long."""
    if t.action != "cache_full_blocks" or t.refused:
        return True
    block_ids, num_cached, num_full = t.arg("block_ids"), t.arg("num_cached_blocks"), t.arg("num_full_blocks")
    block_size, mask = t.arg("block_size"), t.arg("block_mask")
    for i in range(num_cached, min(num_full, len(block_ids))):
        b, p = block_ids[i], t.before.primary[block_ids[i]]
        chosen = b != NULL and (mask is None or mask[i - num_cached])
        if chosen and p is not None and p.num_tokens >= (i + 1) * block_size:
            return False
    return True


CACHE_RECORDS = ("cache_full_blocks", "cache_partial_block")
"""The operations whose ghost write records what the request's prefix is, whoever holds the
block: the model lets them cache a block nobody holds (a small pool reaches cached idle blocks
in one call), so the holder rule below does not speak of them."""


@step_property
def content_changes_only_through_holders(t: Transition) -> bool:
    """A block's ghost content changes only while a caller holds it (a cache call's records excepted)."""
    if t.refused:
        return True
    b, a = t.before, t.after
    recorded = t.footprint.blocks if t.action in CACHE_RECORDS and t.footprint is not None else frozenset()
    return all(b.holders[x] > 0 or a.holders[x] > 0
               for x in range(b.num_blocks) if a.holds[x] != b.holds[x] and x not in recorded)


@step_property
def shared_content_only_grows(t: Transition) -> bool:
    """A block two or more callers hold keeps its content, or extends it: no holder loses its KV."""
    if t.refused:
        return True
    b, a = t.before, t.after
    return all(extends(a.holds[x], b.holds[x]) for x in range(1, b.num_blocks) if b.holders[x] >= 2)


EVICTIONS = ("evict_blocks", "_maybe_evict_cached_block")
"""The operations that take blocks out of the index on the caller's request."""


@step_property
def evicted_blocks_leave_the_index(t: Transition) -> bool:
    """After ``evict_blocks`` (or ``_maybe_evict_cached_block``) the listed blocks have no index entries."""
    if t.refused or t.action not in EVICTIONS:
        return True
    listed = set(t.arg("block_ids") if t.action == "evict_blocks" else [t.arg("block_id")])
    s = t.after
    return (all(s.primary[b] is None and not s.secondary[b] for b in listed)
            and not any(b in listed for blocks in s.index.values() for b in blocks))


@step_property
def changes_stay_in_footprint(t: Transition) -> bool:
    """An accepted call changes only the blocks and keys its declaration says it may."""
    return t.refused or t.footprint is None or not changed_outside(t.before, t.after, t.footprint)


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
