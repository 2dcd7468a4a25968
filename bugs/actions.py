"""Seeded bugs as broken model actions: the bounded model checker must find each.

Each function has a model action's signature and makes one classic mistake;
some are the action with one of its helpers replaced (:func:`patched`), the
others are written out.  A broken action that mutates before it refuses
attaches the state it left behind to its refusal as ``state``, so that the
search can check that refused calls change nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from kvpool.model import actions as A
from kvpool.model.events import Removed
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import content
from kvpool.model.state import NULL, PoolState

Action = Callable[..., tuple[PoolState, Any]]
"""A model action: ``(state, *args) -> (next state, result)``."""


@contextlib.contextmanager
def patched(**names: Any) -> Iterator[None]:
    """Temporarily replace helpers inside :mod:`kvpool.model.actions`."""
    old = {k: getattr(A, k) for k in names}
    for k, v in names.items():
        setattr(A, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(A, k, v)


def _holders(s: PoolState, ids: Sequence[int], delta: int) -> tuple[int, ...]:
    """The ghost holders as the correct action keeps them (the bugs below are elsewhere)."""
    held = list(s.holders)
    for b in ids:
        if b != NULL:
            held[b] += delta
    return tuple(held)


def _drop_fields_only(s: PoolState, n: Any, b: int) -> None:
    """Forget the block's hash fields but leave its index entries behind."""
    n.primary[b] = None
    n.secondary[b] = ()


def _check_once_per_block(s: PoolState, ids: Sequence[int], what: str) -> None:
    """vLLM-style check of each distinct block, blind to repeats in one call."""
    A._check_ids(s, ids)
    for b in set(ids):
        if b != NULL and s.ref[b] < 1:
            raise Refusal(RefusalKind.NOT_IN_USE, f"{what} block {b}")


def free_without_refcount_check(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Release with no ref-count check: a double free drives the count to -1."""
    with patched(_check_releasable=lambda s, ids, what: A._check_ids(s, ids)):
        return A.free_blocks(s, ids)


def free_same_block_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """``free_blocks([b, b])`` on a block with one reference is accepted."""
    with patched(_check_releasable=_check_once_per_block):
        return A.free_blocks(s, ids)


def evict_forgets_index(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction resets the block's hash fields but not the index."""
    with patched(_drop_hashes=_drop_fields_only):
        return A.evict_blocks(s, ids)


def evict_without_events(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction that tells no event consumer: their view of the cache goes stale."""
    nxt, res = A.evict_blocks(replace(s, events_on=False), ids)
    return replace(nxt, events_on=s.events_on), res


def touch_leaves_block_free(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A prefix hit takes a reference but leaves the idle block in the free queue."""
    A._check_ids(s, ids)
    ref = list(s.ref)
    for b in ids:
        ref[b] += 1
    return replace(s, ref=tuple(ref), holders=_holders(s, ids, +1)), None


def free_null_into_queue(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """The null block reaching count 0 joins the free queue, to be handed out later."""
    nxt, res = A.free_blocks(s, ids)
    if NULL in ids and nxt.ref[NULL] == 0 and NULL not in nxt.free:
        nxt = replace(nxt, free=(*nxt.free, NULL))
    return nxt, res


def partial_kept_after_promotion(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """Promoting a partial entry to a full hash leaves the partial entry indexed."""
    with patched(_drop_hashes=_drop_fields_only):
        return A.cache_full_blocks(s, *args)


def cache_full_hashes_null(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks without the null-block skip: the placeholder gets hashed."""
    with patched(NULL=-1):
        return A.cache_full_blocks(s, *args)


def reset_while_in_use(s: PoolState) -> tuple[PoolState, Any]:
    """Reset without the in-use guard, rebuilding the free queue as at start."""
    nxt, _ = A.reset_prefix_cache(replace(s, free=tuple(range(1, s.num_blocks))))
    return replace(nxt, ref=s.ref), True


def counter_before_check(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """get_new_blocks pops blocks one by one and only then finds the queue too short."""
    if num_blocks <= len(s.free):
        return A.get_new_blocks(s, num_blocks)
    left, _ = A.get_new_blocks(s, len(s.free))
    err = Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                  f"Cannot get {num_blocks} free blocks from the pool")
    err.state = left  # type: ignore[attr-defined]
    raise err


def _free_listing(s: PoolState, ids: Sequence[int]) -> list[int]:
    """Check a free_blocks call as the model does; the counts after dropping every listing."""
    A._check_releasable(s, ids, "free")
    ref = list(s.ref)
    for b in ids:
        if b != NULL or s.null_counted:
            ref[b] -= 1
    return ref


def free_appends_listing_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """vLLM's own shape of free_blocks: drop every listing, then queue each listing at 0.

    A block listed twice in one call (a request whose block table holds it
    twice, ref count 2) is queued twice: the free count, and with it usage,
    is wrong (usage below 0 once the queue outgrows the pool), and the block
    can be handed to two requests.
    """
    ref = _free_listing(s, ids)
    idle = [b for b in ids if b != NULL and ref[b] == 0]
    hashed = [b for b in idle if s.caching and s.primary[b] is not None]
    first = [b for b in idle if b not in hashed]
    return replace(s, ref=tuple(ref), free=(*first, *s.free, *hashed),
                   holders=_holders(s, ids, -1)), None


def free_pushes_head_one_by_one(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed unhashed blocks pushed onto the head one at a time (``appendleft`` in a loop).

    A batch lands reversed: the engine frees a block table in reverse so that
    its tail blocks are reused first, and the pool silently undoes that.
    """
    ref = _free_listing(s, ids)
    free = list(s.free)
    seen = list(s.ref)
    for b in ids:
        if b == NULL:
            continue
        seen[b] -= 1
        if seen[b] == 0:
            if s.caching and s.primary[b] is not None:
                free.append(b)
            else:
                free.insert(0, b)
    return replace(s, ref=tuple(ref), free=tuple(free), holders=_holders(s, ids, -1)), None


def free_hashed_to_head(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed cached blocks go to the head like unhashed ones: the freshest prefix is evicted first."""
    ref = _free_listing(s, ids)
    last = {b: i for i, b in enumerate(ids)}
    idle = [b for b in sorted(last, key=last.__getitem__) if b != NULL and ref[b] == 0]
    return replace(s, ref=tuple(ref), free=(*idle, *s.free), holders=_holders(s, ids, -1)), None


def touch_swap_remove(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A hit block leaves an array-backed free list by swap-with-last (O(1) removal).

    The former tail block jumps into the hole: the eviction order is lost.
    """
    A._check_ids(s, ids)
    free, ref = list(s.free), list(s.ref)
    for b in ids:
        if b == NULL and not s.null_counted:
            continue
        if ref[b] == 0 and b != NULL:
            i = free.index(b)
            free[i] = free[-1]
            free.pop()
        ref[b] += 1
    return replace(s, ref=tuple(ref), free=tuple(free), holders=_holders(s, ids, +1)), None


def alloc_pops_tail(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The free list used as a stack: allocation takes the most recently freed blocks.

    The hottest cached prefixes (freed last, at the tail) are evicted first
    instead of the least recently used ones at the head.
    """
    nxt, taken = A.get_new_blocks(replace(s, free=s.free[::-1]), num_blocks)
    return replace(nxt, free=nxt.free[::-1]), taken


def reuse_notice_names_position(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The reuse callback gets the block's index in the allocated batch, not its id.

    An ``enumerate()`` mix-up: the engine is told that the wrong block was
    reused and keeps reading the overwritten one.
    """
    nxt, taken = A.get_new_blocks(s, num_blocks)
    notices = tuple((w, taken.index(b)) for w, b in nxt.fired[len(s.fired):])
    return replace(nxt, fired=(*s.fired, *notices)), taken


def removed_event_drops_group(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction's BlockRemoved leaves out the KV-cache group (``group_idx=None``, read as 0).

    A router keeping one view per group (full attention, sliding window)
    removes the entry from group 0 and keeps serving the evicted one.
    """
    nxt, res = A.evict_blocks(s, ids)
    new = tuple(replace(ev, group=0) if isinstance(ev, Removed) else ev
                for ev in nxt.events[len(s.events):])
    return replace(nxt, events=(*s.events, *new)), res


def stored_event_when_disabled(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks emits BlockStored without checking that events are enabled.

    Nobody takes events from such a pool, so the queue grows with every
    cached block for the life of the engine.  Needs ``Config(events_on=False)``
    (see :data:`BUG_CONFIG`).
    """
    nxt, res = A.cache_full_blocks(replace(s, events_on=True), *args)
    return replace(nxt, events_on=s.events_on), res


def alloc_keeps_old_hash(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """Allocation without lazy eviction: the old hash still serves the new owner's block."""
    nxt, taken = A.get_new_blocks(replace(s, caching=False), num_blocks)
    return replace(nxt, caching=s.caching), taken


def unpin_keeps_reference(s: PoolState, ids: Sequence[int], on_reuse: Any) -> tuple[PoolState, Any]:
    """unpin_blocks registers the watcher but keeps the reference: the block never returns."""
    nxt, res = A.unpin_blocks(s, ids, on_reuse)
    return replace(nxt, ref=s.ref, free=s.free), res


def alloc_refuses_last_block(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """``if num_blocks >= free: refuse`` (off by one): the last free block is never handed out."""
    if isinstance(num_blocks, int) and 0 < num_blocks == len(s.free):
        raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                      f"Cannot get {num_blocks} free blocks from the pool")
    return A.get_new_blocks(s, num_blocks)


def cache_full_without_conflict_check(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks re-caches a block already cached at a prefix as long."""
    with patched(_check_conflicts=lambda *a: None):
        return A.cache_full_blocks(s, *args)


def cache_full_listing_twice(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """vLLM's cache_full_blocks with a block listed twice: it removes the first position's
    key, then announces it with the second in one BlockStored."""
    with patched(_require_once=lambda blocks: None):
        return A.cache_full_blocks(s, *args)


def partial_write_over_hashed_block(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_partial_block takes another request's prefix into a hashed block and keeps its entries."""
    with patched(_require_write=lambda *a: None):
        return A.cache_partial_block(s, *args)


def owner_overwrites_hashed_block(s: PoolState, block_id: int, request: Any,
                                  num_tokens: int) -> tuple[PoolState, Any]:
    """The owner writes new KV into a block the index still names."""
    with patched(_require_write=lambda *a: None):
        return A.write_block(s, block_id, request, num_tokens)


def insert_indexes_null(s: PoolState, request: Any, prefix_tokens: int, group: int, block_id: int,
                        num_tokens: int | None) -> tuple[PoolState, Any]:
    """vLLM's _insert_block_hash has no null-block check: the null block enters the index."""
    if block_id != NULL:
        return A.insert_block_hash(s, request, prefix_tokens, group, block_id, num_tokens)
    n = A._thaw(s)
    key = (request.block_hashes[prefix_tokens // s.hash_block_size - 1], group)
    names = content(request, prefix_tokens, s.hash_block_size)
    A._add_key(n, key, NULL, num_tokens or s.hash_block_size, names)
    return A._freeze(s, n), None


def insert_overwrites_primary(s: PoolState, request: Any, prefix_tokens: int, group: int, block_id: int,
                              num_tokens: int | None) -> tuple[PoolState, Any]:
    """_insert_block_hash replaces a block's primary key instead of adding a secondary one."""
    nxt, result = A.insert_block_hash(s, request, prefix_tokens, group, block_id, num_tokens)
    old = s.primary[block_id]
    new_keys = nxt.secondary[block_id][len(s.secondary[block_id]):]
    if old is None or not new_keys:
        return nxt, result
    primary = replace(old, key=new_keys[0], num_tokens=num_tokens or old.num_tokens)
    b = block_id
    return replace(nxt, primary=(*nxt.primary[:b], primary, *nxt.primary[b + 1:]),
                   secondary=(*nxt.secondary[:b], s.secondary[b], *nxt.secondary[b + 1:])), result
