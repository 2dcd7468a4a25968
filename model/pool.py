"""The block pool as a state machine: its variables, its initial state, one action per operation.

Read it as a TLA+ module.  The variables are :class:`~.state.PoolState`'s
(ref counts, the free queue, primary and secondary keys, the index, reuse
watchers, pending events, and the ghosts ``holds``, ``names``, ``holders``,
``announced``); the initial state is :func:`~.state.initial_state`.  Each
function below is the *next* of one operation: it runs only after the call
passed its guard (:mod:`.guards`, the refusals in order) and kept its
caller contracts (:mod:`.contracts`), so it never refuses.  It updates the
state in place, touching only the blocks and keys of the call's footprint
(:mod:`.footprints`), and returns the call's result.  :mod:`.operations`
declares each operation with all of these parts.

Where the reference (vLLM 0.31.0) leaves a choice open, the choice is stated
where it is made: refusals in :mod:`.guards`, updates below, the settings in
which vLLM releases differ in :class:`~.state.PoolState`;
``oracle/REFERENCE_DIFFERENCES.md`` sets each against vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from .events import Cleared, Event, Hash, Removed, Stored
from .request import EMPTY, Content, block_hash, chunk_keys, content, extends, lora_of, prefix_key, untagged
from .state import NULL, BlockId, Key, PoolState, Primary, Watcher

# --------------------------------------------------------------------------
# What several actions do.


def keys_of(s: PoolState, b: BlockId) -> list[Key]:
    """``b``'s index keys, primary first."""
    p = s.primary[b]
    return ([p.key] if p else []) + list(s.secondary[b])


def drop_hashes(s: PoolState, b: BlockId, announce: bool = True) -> None:
    """``b`` leaves the index under every key it has (primary first), each removal announced."""
    for key in keys_of(s, b):
        rest = tuple(x for x in s.index.get(key, ()) if x != b)
        if rest:
            s.index[key] = rest
        else:
            s.index.pop(key, None)
            s.names.pop(key, None)
        if s.events_on and announce:
            s.emit(Removed(key[0], key[1], s.medium))
            s.announced.discard((key, b))
    s.primary[b] = None
    s.secondary[b] = ()


def add_key(s: PoolState, key: Key, b: BlockId, num_tokens: int, names: Content) -> None:
    """Index ``b`` under ``key``: as its primary key if it has none, else as a secondary one."""
    if has_key(s, b, key):
        return
    if s.primary[b] is None:
        s.primary[b] = Primary(key, num_tokens)
    else:
        s.secondary[b] = (*s.secondary[b], key)
    s.index[key] = (*s.index.get(key, ()), b)
    s.names[key] = names


def has_key(s: PoolState, b: BlockId, key: Key) -> bool:
    """Whether ``b`` is indexed under ``key`` already."""
    p = s.primary[b]
    return (p is not None and p.key == key) or b in s.index.get(key, ())


def write(s: PoolState, b: BlockId, written: Content) -> None:
    """Ghost: ``b``'s owner wrote ``written``; the block keeps a longer prefix it already held."""
    if not extends(s.holds[b], written):
        s.holds[b] = written


def hand(s: PoolState, blocks: Sequence[BlockId], delta: int) -> None:
    """Ghost: the caller gains (``+1``) or gives back (``-1``) a reference per real listing."""
    for b in blocks:
        if b != NULL:
            s.holders[b] += delta


def stored(s: PoolState, request: Any, hashes: Sequence[Hash], parent: Hash | None,
           start: int, end: int, block_size: int, group: int,
           chunks: Sequence[tuple[int, int]]) -> Event:
    """The announcement of ``request``'s tokens ``[start, end)`` stored under ``hashes``;
    ``chunks`` are the stored blocks' token ranges, whose extra keys it publishes."""
    lora_id, lora_name = lora_of(request)
    return Stored(
        hashes=tuple(hashes), parent=parent, token_ids=tuple(request.all_token_ids[start:end]),
        block_size=block_size, lora_id=lora_id, lora_name=lora_name,
        extra_keys=tuple(untagged(chunk_keys(request, a, b)) for a, b in chunks) or None,
        group=group, medium=s.medium, session_id=request.session_id)


def chosen(block_ids: Sequence[BlockId], num_cached: int, num_full: int,
           block_mask: Sequence[bool] | None) -> list[tuple[int, BlockId]]:
    """The (position, block) pairs ``cache_full_blocks`` indexes: real, unmasked, in range."""
    return [(num_cached + i, b) for i, b in enumerate(block_ids[num_cached:num_full])
            if b != NULL and (block_mask is None or block_mask[i])]


# --------------------------------------------------------------------------
# The actions.


def get_new_blocks(s: PoolState, num_blocks: int) -> list[BlockId]:
    """Hand out the first ``num_blocks`` free blocks; their hashes go now (lazy eviction)."""
    taken = s.free.take_head(num_blocks)
    for b in taken:
        if b in s.watchers:
            s.fire(s.watchers.pop(b), b)
    for b in taken:
        if s.caching:
            drop_hashes(s, b)
            s.tell("evicted", b)
        s.tell("allocated", b)
        s.ref[b] = 1
        s.holds[b] = EMPTY
    hand(s, taken, +1)
    return taken


def free_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> None:
    """Drop one reference per listing.  Idle unhashed blocks go to the head of the queue
    (reused first), idle hashed ones to the tail (evicted last), in the order listed; the
    null block never enters it."""
    hand(s, block_ids, -1)
    first: list[BlockId] = []
    last: list[BlockId] = []
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        s.ref[b] -= 1
        if s.ref[b] == 0 and b != NULL:
            (last if s.caching and s.primary[b] else first).append(b)
    s.free.push_head(first)
    s.free.push_tail(last)


def touch(s: PoolState, block_ids: Sequence[BlockId]) -> None:
    """Take a reference on each block (a prefix hit); idle ones leave the queue."""
    hand(s, block_ids, +1)
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        if s.ref[b] == 0 and b != NULL:
            s.free.remove(b)
        s.ref[b] += 1
        s.tell("accessed", b)


def unpin_blocks(s: PoolState, block_ids: Sequence[BlockId], on_reuse: Watcher) -> None:
    """Drop references but keep the contents readable: idle blocks go to the tail,
    and ``on_reuse`` hears when one is handed out again or the cache is reset."""
    hand(s, block_ids, -1)
    released = []
    for b in block_ids:
        s.ref[b] -= 1
        s.watchers[b] = on_reuse
        if s.ref[b] == 0:
            released.append(b)
    s.free.push_tail(released)


def evict_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> None:
    """Remove the blocks' index entries; their counts and queue places stay."""
    for b in block_ids:
        s.tell("evicted", b)
        drop_hashes(s, b)


def reset_prefix_cache(s: PoolState) -> bool:
    """Forget every hash and watcher, only when no block but the null block is in use."""
    if s.num_blocks - len(s.free) != 1:
        return False
    for b, w in s.watchers.items():
        s.fire(w, b)
    s.watchers.clear()
    for blocks in s.index.values():
        for b in blocks:
            s.primary[b], s.secondary[b] = None, ()
    s.index.clear()
    s.names.clear()
    if s.events_on:
        s.emit(Cleared())
        s.announced.clear()
    s.tell("reset", None)
    return True


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> None:
    """Index ``block_ids[num_cached:num_full]`` (real, unmasked) under the request's hashes.

    A block hashed at a shorter prefix (a partial entry being promoted) loses
    its old entries first.  One ``BlockStored`` covers the whole range.
    """
    hbs, g = s.hash_block_size, kv_cache_group_id
    picked = chosen(block_ids, num_cached_blocks, num_full_blocks, block_mask)
    hashes = {i: block_hash(request, hbs, block_size, i) for i, _b in picked}
    for i, b in picked:
        prefix = content(request, (i + 1) * block_size, hbs)
        if s.primary[b] is not None:
            drop_hashes(s, b)
        write(s, b, prefix)
        add_key(s, (hashes[i], g), b, (i + 1) * block_size, prefix)
    if s.events_on:
        s.announced.update(((hashes[i], g), b) for i, b in picked)
        parent = block_hash(request, hbs, block_size, num_cached_blocks - 1) if num_cached_blocks else None
        s.emit(stored(s, request, [hashes[i] for i, _b in picked], parent,
                      num_cached_blocks * block_size, num_full_blocks * block_size, block_size, g,
                      [(i * block_size, (i + 1) * block_size) for i, _b in picked]))


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> Key | None:
    """Make ``block_id`` reachable from a prefix boundary inside it; return the key.

    The key becomes the block's primary key if it has none, else a secondary
    one.  Entries covering a shorter prefix go first (the block grew); with
    ``replace_existing_hashes`` all go (its contents were replaced).
    """
    hbs = s.hash_block_size
    key: Key = prefix_key(request, num_tokens, hbs, kv_cache_group_id)
    prefix = content(request, num_tokens, hbs)
    primary = s.primary[block_id]
    already = has_key(s, block_id, key)
    if replace_existing_hashes:
        drop_hashes(s, block_id)
        already = False
        s.holds[block_id] = prefix
    else:
        if not already and primary is not None and primary.num_tokens < num_tokens:
            drop_hashes(s, block_id)
        write(s, block_id, prefix)
    add_key(s, key, block_id, num_tokens, prefix)
    if s.events_on and not already:
        chunks = num_tokens // hbs
        start = (chunks - 1) * hbs
        parent = request.block_hashes[chunks - 2] if chunks > 1 else None
        s.emit(stored(s, request, [key[0]], parent, start, num_tokens, num_tokens - start,
                      kv_cache_group_id, [(start, num_tokens)]))
        s.announced.add((key, block_id))
    return key


def move_block_hashes(s: PoolState, src_id: BlockId, dst_id: BlockId) -> None:
    """Re-point ``src``'s entries at ``dst``, the caller's private copy of it; no events.

    The caller copied ``src``'s contents into ``dst`` (ghost: ``dst`` now
    holds what ``src`` held) and keeps writing into ``src``.  Each live
    announcement of a moved entry stands: it now names the copy.
    """
    primary = cast(Primary, s.primary[src_id])  # the guard makes moving an unhashed block a no-op
    keys = keys_of(s, src_id)
    names = [s.names[k] for k in keys]
    drop_hashes(s, src_id, announce=False)
    s.holds[dst_id] = s.holds[src_id]
    for key, name in zip(keys, names, strict=True):
        add_key(s, key, dst_id, primary.num_tokens, name)
    for key in keys:
        if (key, src_id) in s.announced:
            s.announced.remove((key, src_id))
            s.announced.add((key, dst_id))


def insert_block_hash(
    s: PoolState, request: Any, prefix_tokens: int, kv_cache_group_id: int, block_id: BlockId,
    num_tokens: int | None,
) -> None:
    """Index ``block_id`` under a key of another pool, whose KV the caller copied into it.

    vLLM's CPU offload pool does this (``_insert_block_hash``) with the keys of
    a GPU block it copied.  The key is ``request``'s hash of its first
    ``prefix_tokens`` tokens (what the pool receives is that key alone; the
    request is the ghost of what it names).  It becomes the block's primary
    key, covering ``num_tokens`` tokens, if the block has none, else a
    secondary one.  No event: the caller announces the entry, as vLLM's
    offload manager emits its own ``BlockStored``.
    """
    hbs = s.hash_block_size
    key: Key = prefix_key(request, prefix_tokens, hbs, kv_cache_group_id)
    prefix = content(request, prefix_tokens, hbs)
    already = has_key(s, block_id, key)
    write(s, block_id, prefix)
    add_key(s, key, block_id, num_tokens or 0, prefix)
    if s.events_on and not already:
        s.announced.add((key, block_id))


def maybe_evict_cached_block(s: PoolState, block_id: BlockId) -> bool:
    """``evict_blocks`` of one block, saying whether it had an entry (vLLM's checkpoint path)."""
    had = s.primary[block_id] is not None
    evict_blocks(s, [block_id])
    return had


def emit_cached_block_events(
    s: PoolState, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int,
) -> None:
    """Announce prefix-cache hits to event consumers (a re-announcement, no new copy)."""
    hbs = s.hash_block_size
    s.emit(stored(s, request, [block_hash(request, hbs, block_size, i) for i in range(num_cached_blocks)],
                  None, 0, num_cached_blocks * block_size, block_size, kv_cache_group_id,
                  [(i * block_size, (i + 1) * block_size) for i in range(num_cached_blocks)]))


def take_events(s: PoolState) -> list[Event]:
    """Hand over the pending events and empty the queue."""
    taken, s.events = s.events, []
    return taken


def write_block(s: PoolState, block_id: BlockId, request: Any, num_tokens: int) -> None:
    """The caller, not the pool: a holder writes ``request``'s first ``num_tokens`` tokens' KV.

    Ghost only (the pool sees no writes): the block then holds that prefix,
    or keeps the longer prefix it held if the write is a prefix of it.
    """
    write(s, block_id, content(request, num_tokens, s.hash_block_size))


# --------------------------------------------------------------------------
# The queries (they change nothing).


def get_cached_block(
    s: PoolState, block_hash: Hash, kv_cache_group_ids: Sequence[int],
) -> list[BlockId] | None:
    """The first block indexed under the hash in every group, or ``None``."""
    found = []
    for g in kv_cache_group_ids:
        blocks = s.index.get((block_hash, g))
        if not blocks:
            return None
        found.append(blocks[0])
    return found


def is_block_writable(s: PoolState, block_id: BlockId) -> bool:
    """Only a sole owner of an unhashed, non-null block may write into it."""
    return block_id != NULL and s.ref[block_id] == 1 and s.primary[block_id] is None


def get_num_free_blocks(s: PoolState) -> int:
    """How many blocks the free queue holds."""
    return len(s.free)


def get_usage(s: PoolState) -> float:
    """Fraction of the real (non-null) blocks in use."""
    real = s.num_blocks - 1
    return 1.0 - len(s.free) / real if real else 0.0
