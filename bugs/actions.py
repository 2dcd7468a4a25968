"""Seeded bugs as broken model actions: the bounded model checker must find each.

Each function has a model action's signature (``(state, *args) -> (state,
result)``, updating the state in place as the model's actions do; the search
hands it a copy) and makes one classic mistake; some are the action with
one of the model's helpers replaced (:func:`patched`), the others are
written out.  A broken action that changes the state before it refuses
leaves the copy changed, which the search sees.  The ghost holders
(:func:`kvpool.model.pool.hand`) are kept as the correct action keeps them:
the bugs are elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from kvpool.model import ACTIONS, CALLER_ACTIONS
from kvpool.model import contracts as C
from kvpool.model import guards as G
from kvpool.model import pool as P
from kvpool.model.events import Removed
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import content, prefix_key
from kvpool.model.state import NULL, PoolState, Queue

Action = Callable[..., tuple[PoolState, Any]]
"""A model action: ``(state, *args) -> (state, result)``, in place."""


@contextlib.contextmanager
def patched(target: object, **names: Any) -> Iterator[None]:
    """Temporarily replace attributes: helpers of one of the model's modules, flags of a state
    or of a pool."""
    old = {k: getattr(target, k) for k in names}
    for k, v in names.items():
        setattr(target, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(target, k, v)


def _act(name: str, s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    return {**ACTIONS, **CALLER_ACTIONS}[name](s, *args)


def _drop_fields_only(s: PoolState, b: int, announce: bool = True) -> None:
    """Forget the block's hash fields but leave its index entries behind."""
    s.primary[b] = None
    s.secondary[b] = ()


def _check_once_per_block(s: PoolState, ids: Sequence[int], what: str) -> None:
    """vLLM-style check of each distinct block, blind to repeats in one call."""
    G.check_ids(s, ids)
    for b in set(ids):
        if b != NULL and s.ref[b] < 1:
            raise Refusal(RefusalKind.NOT_IN_USE, f"{what} block {b}")


def free_without_refcount_check(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Release with no ref-count check: a double free drives the count to -1."""
    with patched(G, check_releasable=lambda s, ids, what: G.check_ids(s, ids)):
        return _act("free_blocks", s, ids)


def free_same_block_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """``free_blocks([b, b])`` on a block with one reference is accepted."""
    with patched(G, check_releasable=_check_once_per_block):
        return _act("free_blocks", s, ids)


def evict_forgets_index(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction resets the block's hash fields but not the index."""
    with patched(P, drop_hashes=_drop_fields_only):
        return _act("evict_blocks", s, ids)


def evict_without_events(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction that tells no event consumer: their view of the cache goes stale."""
    with patched(s, events_on=False):
        return _act("evict_blocks", s, ids)


def touch_leaves_block_free(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A prefix hit takes a reference but leaves the idle block in the free queue."""
    G.check_ids(s, ids)
    for b in ids:
        s.ref[b] += 1
    P.hand(s, ids, +1)
    return s, None


def free_null_into_queue(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """The null block reaching count 0 joins the free queue, to be handed out later."""
    nxt, res = _act("free_blocks", s, ids)
    if NULL in ids and nxt.ref[NULL] == 0 and NULL not in nxt.free:
        nxt.free.push_tail([NULL])
    return nxt, res


def partial_kept_after_promotion(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """Promoting a partial entry to a full hash leaves the partial entry indexed."""
    with patched(P, drop_hashes=_drop_fields_only):
        return _act("cache_full_blocks", s, *args)


def cache_full_hashes_null(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks without the null-block skip: the placeholder gets hashed."""
    with patched(P, NULL=-1):
        return _act("cache_full_blocks", s, *args)


def reset_while_in_use(s: PoolState) -> tuple[PoolState, Any]:
    """Reset without the in-use guard, rebuilding the free queue as at start."""
    s.free = Queue(range(1, s.num_blocks))
    _act("reset_prefix_cache", s)
    return s, True


def counter_before_check(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """get_new_blocks pops blocks one by one and only then finds the queue too short."""
    if num_blocks <= len(s.free):
        return _act("get_new_blocks", s, num_blocks)
    _act("get_new_blocks", s, len(s.free))
    raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS, f"Cannot get {num_blocks} free blocks from the pool")


def _free_listing(s: PoolState, ids: Sequence[int]) -> None:
    """Check a free_blocks call as the model does, then drop every listing's reference."""
    G.check_releasable(s, ids, "free")
    for b in ids:
        if b != NULL or s.null_counted:
            s.ref[b] -= 1
    P.hand(s, ids, -1)


def free_appends_listing_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """vLLM's own shape of free_blocks: drop every listing, then queue each listing at 0.

    A block listed twice in one call (a request whose block table holds it
    twice, ref count 2) is queued twice: the free count, and with it usage,
    is wrong (usage below 0 once the queue outgrows the pool), and the block
    can be handed to two requests.  The model's queue holds each block once,
    so the second queueing is refused by the queue itself (:class:`~kvpool.model.state.QueuedTwice`).
    """
    _free_listing(s, ids)
    idle = [b for b in ids if b != NULL and s.ref[b] == 0]
    hashed = [b for b in idle if s.caching and s.primary[b] is not None]
    s.free.push_head([b for b in idle if b not in hashed])
    s.free.push_tail(hashed)
    return s, None


def free_pushes_head_one_by_one(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed unhashed blocks pushed onto the head one at a time (``appendleft`` in a loop).

    A batch lands reversed: the engine frees a block table in reverse so that
    its tail blocks are reused first, and the pool silently undoes that.
    """
    G.check_releasable(s, ids, "free")
    P.hand(s, ids, -1)
    for b in ids:
        if b == NULL:
            continue
        s.ref[b] -= 1
        if s.ref[b] == 0:
            if s.caching and s.primary[b] is not None:
                s.free.push_tail([b])
            else:
                s.free.push_head([b])
    return s, None


def free_hashed_to_head(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed cached blocks go to the head like unhashed ones: the freshest prefix is evicted first."""
    _free_listing(s, ids)
    last = {b: i for i, b in enumerate(ids)}
    s.free.push_head([b for b in sorted(last, key=last.__getitem__) if b != NULL and s.ref[b] == 0])
    return s, None


def touch_swap_remove(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A hit block leaves an array-backed free list by swap-with-last (O(1) removal).

    The former tail block jumps into the hole: the eviction order is lost.
    """
    G.check_ids(s, ids)
    for b in ids:
        if b == NULL and not s.null_counted:
            continue
        if s.ref[b] == 0 and b != NULL:
            free = list(s.free)
            i = free.index(b)
            free[i] = free[-1]
            free.pop()
            s.free = Queue(free)
        s.ref[b] += 1
    P.hand(s, ids, +1)
    return s, None


def _reversed(s: PoolState) -> None:
    s.free = Queue(list(s.free)[::-1])


def alloc_pops_tail(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The free list used as a stack: allocation takes the most recently freed blocks.

    The hottest cached prefixes (freed last, at the tail) are evicted first
    instead of the least recently used ones at the head.
    """
    _reversed(s)
    try:
        nxt, taken = _act("get_new_blocks", s, num_blocks)
    finally:
        _reversed(s)
    return nxt, taken


def reuse_notice_names_position(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The reuse callback gets the block's index in the allocated batch, not its id.

    An ``enumerate()`` mix-up: the engine is told that the wrong block was
    reused and keeps reading the overwritten one.
    """
    nxt, taken = _act("get_new_blocks", s, num_blocks)
    nxt.out.fired = [(w, taken.index(b)) for w, b in nxt.out.fired]
    return nxt, taken


def removed_event_drops_group(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction's BlockRemoved leaves out the KV-cache group (``group_idx=None``, read as 0).

    A router keeping one view per group (full attention, sliding window)
    removes the entry from group 0 and keeps serving the evicted one.
    """
    pending = len(s.events)
    nxt, res = _act("evict_blocks", s, ids)
    nxt.out.events = [replace(ev, group=0) if isinstance(ev, Removed) else ev for ev in nxt.out.events]
    nxt.events[pending:] = nxt.out.events
    return nxt, res


def stored_event_when_disabled(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks emits BlockStored without checking that events are enabled.

    Nobody takes events from such a pool, so the queue grows with every
    cached block for the life of the engine.  Needs ``Bounds(events_on=False)``
    (see the catalogue's ``bmc`` overrides).
    """
    with patched(s, events_on=True):
        return _act("cache_full_blocks", s, *args)


def alloc_keeps_old_hash(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """Allocation without lazy eviction: the old hash still serves the new owner's block."""
    with patched(s, caching=False):
        return _act("get_new_blocks", s, num_blocks)


def unpin_keeps_reference(s: PoolState, ids: Sequence[int], on_reuse: Any) -> tuple[PoolState, Any]:
    """unpin_blocks registers the watcher but keeps the reference: the block never returns."""
    ref, free = list(s.ref), s.free.copy()
    nxt, res = _act("unpin_blocks", s, ids, on_reuse)
    nxt.ref, nxt.free = ref, free
    return nxt, res


def alloc_refuses_last_block(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """``if num_blocks >= free: refuse`` (off by one): the last free block is never handed out."""
    if isinstance(num_blocks, int) and 0 < num_blocks == len(s.free):
        raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                      f"Cannot get {num_blocks} free blocks from the pool")
    return _act("get_new_blocks", s, num_blocks)


def cache_full_without_conflict_check(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks re-caches a block already cached at a prefix as long."""
    with patched(G, check_conflicts=lambda *a: None):
        return _act("cache_full_blocks", s, *args)


def cache_full_listing_twice(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """vLLM's cache_full_blocks with a block listed twice: it removes the first position's
    key, then announces it with the second in one BlockStored."""
    with patched(C, cached_once_per_call=lambda blocks: None):
        return _act("cache_full_blocks", s, *args)


def partial_write_over_hashed_block(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_partial_block takes another request's prefix into a hashed block and keeps its entries."""
    with patched(C, writes_extend_unless_writable=lambda *a: None):
        return _act("cache_partial_block", s, *args)


def owner_overwrites_hashed_block(s: PoolState, block_id: int, request: Any,
                                  num_tokens: int) -> tuple[PoolState, Any]:
    """The owner writes new KV into a block the index still names."""
    with patched(C, writes_extend_unless_writable=lambda *a: None):
        return _act("write_block", s, block_id, request, num_tokens)


def insert_indexes_null(s: PoolState, request: Any, prefix_tokens: int, group: int, block_id: int,
                        num_tokens: int | None) -> tuple[PoolState, Any]:
    """vLLM's _insert_block_hash has no null-block check: the null block enters the index."""
    if block_id != NULL:
        return _act("_insert_block_hash", s, request, prefix_tokens, group, block_id, num_tokens)
    key = (request.block_hashes[prefix_tokens // s.hash_block_size - 1], group)
    prefix = content(request, prefix_tokens, s.hash_block_size)
    P.add_key(s, key, NULL, num_tokens or s.hash_block_size, prefix)
    return s, None


def insert_overwrites_primary(s: PoolState, request: Any, prefix_tokens: int, group: int, block_id: int,
                              num_tokens: int | None) -> tuple[PoolState, Any]:
    """_insert_block_hash replaces a block's primary key instead of adding a secondary one."""
    old, before = s.primary[block_id], s.secondary[block_id]
    nxt, result = _act("_insert_block_hash", s, request, prefix_tokens, group, block_id, num_tokens)
    new_keys = nxt.secondary[block_id][len(before):]
    if old is None or not new_keys:
        return nxt, result
    nxt.primary[block_id] = replace(old, key=new_keys[0], num_tokens=num_tokens or old.num_tokens)
    nxt.secondary[block_id] = before
    return nxt, result


def insert_into_unheld_block(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """_insert_block_hash without its holder check: a block nobody holds gets KV and an entry."""
    with patched(C, written_by_a_holder=lambda *a: None):
        return _act("_insert_block_hash", s, *args)


def evict_spares_blocks_in_use(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """evict_blocks leaves the entries of a block someone holds."""
    G.evict_blocks(s, ids)
    for b in ids:
        s.tell("evicted", b)
        if s.ref[b] == 0:
            P.drop_hashes(s, b)
    return s, None


def replace_by_a_sharer(s: PoolState, request: Any, block_id: int, num_tokens: int, group: int,
                        block_size: int, replace_existing: bool = False) -> tuple[PoolState, Any]:
    """cache_partial_block(replace_existing_hashes=True) by any holder, not its sole owner."""
    args = (request, block_id, num_tokens, group, block_size, replace_existing)
    noop = G.cache_partial_block(s, *args)
    if noop is not None:
        return s, noop.result
    if not replace_existing:
        C.cache_partial_block(s, *args)
    elif s.ref[block_id] < 1:
        raise C.ContractBroken("replaced_by_its_sole_owner", f"block {block_id} has no holder")
    else:
        hbs = s.hash_block_size
        key = prefix_key(request, num_tokens, hbs, group)
        C.hashes_name_one_prefix(s, key, content(request, num_tokens, hbs))
    return s, P.cache_partial_block(s, *args)


def move_onto_a_shared_block(s: PoolState, src_id: int, dst_id: int) -> tuple[PoolState, Any]:
    """move_block_hashes onto a block others hold too (its contract not checked)."""
    noop = G.move_block_hashes(s, src_id, dst_id)
    if noop is not None:
        return s, noop.result
    P.move_block_hashes(s, src_id, dst_id)
    return s, None
