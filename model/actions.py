"""The actions of the specification: one pure transition per pool operation.

Each action takes a :class:`PoolState` and the operation's arguments and
returns ``(next_state, result)``.  It first checks every argument and raises
a typed :class:`~kvpool.impl.errors.BlockPoolError` *before* computing any
change, so a refused call leaves the state as it was.  Queries return only
the result.

Decisions the reference (vLLM 0.31.0) leaves open, and the choice made:

* A block listed ``k`` times in one ``free_blocks``/``unpin_blocks`` call
  drops ``k`` references; listing it more often than it is referenced is a
  double free and is refused (``BlockNotInUseError``), as is freeing a block
  whose count is already 0.  The reference would drive the count negative.
* ``free_blocks``/``touch`` of the null block stay legal (engines keep it in
  block tables); its counter moves as in vLLM 0.31 (0.33 leaves it alone:
  ``initial_state(..., null_counted=False)``), it never enters the free queue
  and is never hashed.  ``unpin_blocks`` of it is refused.
* ``unpin_blocks`` of a hashed block is allowed: the block keeps its hash, is
  evicted last, can still be hit (``touch``); its watcher stays registered
  until ``get_new_blocks`` hands the block out or the cache is reset.
* ``cache_full_blocks``/``cache_partial_block`` on a pool built without
  caching are refused (``CachingDisabledError``): the reference would index
  blocks that ``get_new_blocks`` then hands out without evicting them.
* A block's secondary keys are kept in insertion order, so removal events
  and ``move_block_hashes`` are deterministic (the reference uses a ``set``).
* ``cache_full_blocks`` with ``num_cached_blocks >= num_full_blocks`` does
  nothing, as in the reference: vLLM's sparse-attention coordinator can ask
  for fewer ready blocks than are cached.

Misuse the reference does not catch is refused here: negative counts (vLLM's
``get_new_blocks(-1)`` would inflate the free count), ids outside
``[0, num_blocks)`` (``-1`` would silently mean the last block),
``num_full_blocks`` beyond the block list, request hashes or masks of the
wrong length, group ids that do not fit 32 bits, and moving hashes onto the
null block (which would index it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvpool.impl.errors import (
    BlockHashConflictError,
    BlockNotInUseError,
    CachingDisabledError,
    InvalidArgumentError,
    NotEnoughFreeBlocksError,
    NullBlockError,
    UnknownBlockError,
)
from kvpool.impl.events import (
    KVCacheEvent,
    all_blocks_cleared,
    block_removed,
    block_stored,
    extra_keys_of_blocks,
    extra_keys_of_chunk,
)
from kvpool.impl.hashing import generate_block_hash_extra_keys, resolve_block_hashes
from kvpool.impl.keys import (
    MAX_GROUP_ID,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)

from .state import NULL, BlockId, Content, Key, PoolState, Primary, Watcher

Step = tuple[PoolState, Any]


# --------------------------------------------------------------------------
# A mutable scratch copy, so each action reads as a list of assignments.


@dataclass(slots=True)
class _Next:
    ref: list[int]
    free: list[BlockId]
    primary: list[Primary | None]
    secondary: list[tuple[Key, ...]]
    index: dict[Key, tuple[BlockId, ...]]
    watchers: dict[BlockId, Watcher]
    events: list[KVCacheEvent]
    fired: list[tuple[Watcher, BlockId]]
    holds: list[Content]
    names: dict[Key, Content]


def _thaw(s: PoolState) -> _Next:
    return _Next(
        list(s.ref), list(s.free), list(s.primary), list(s.secondary), dict(s.index),
        dict(s.watchers), list(s.events), list(s.fired), list(s.holds), dict(s.names),
    )


def _freeze(s: PoolState, n: _Next) -> PoolState:
    return replace(
        s, ref=tuple(n.ref), free=tuple(n.free), primary=tuple(n.primary),
        secondary=tuple(n.secondary), index=n.index, watchers=n.watchers,
        events=tuple(n.events), fired=tuple(n.fired), holds=tuple(n.holds), names=n.names,
    )


def _drop_hashes(s: PoolState, n: _Next, b: BlockId) -> None:
    """Remove every index entry of ``b`` (primary first), emitting removals."""
    primary = n.primary[b]
    keys = ([primary.key] if primary else []) + list(n.secondary[b])
    for key in keys:
        rest = tuple(x for x in n.index.get(key, ()) if x != b)
        if rest:
            n.index[key] = rest
        else:
            n.index.pop(key, None)
        if s.events_on:
            n.events.append(block_removed(
                maybe_convert_block_hash(get_block_hash(key)), s.medium, get_group_id(key)))
    n.primary[b] = None
    n.secondary[b] = ()


def _add_key(n: _Next, key: Key, b: BlockId, num_tokens: int, names: Content) -> None:
    """Index ``b`` under ``key``: as its primary key if it has none."""
    primary = n.primary[b]
    if (primary and primary.key == key) or b in n.index.get(key, ()):
        return
    if primary is None:
        n.primary[b] = Primary(key, num_tokens)
    else:
        n.secondary[b] = n.secondary[b] + (key,)
    n.index[key] = (*n.index.get(key, ()), b)
    n.names[key] = names


def _write(held: Content, written: Content) -> Content:
    """Ghost: what a block holds after its owner wrote ``written`` into it."""
    return held if held[: len(written)] == written else written


def _content(request: Any, num_tokens: int, hash_block_size: int) -> Content:
    """Ghost: the request's prefix of ``num_tokens`` tokens, chunk by chunk."""
    chunks = []
    mm_idx = 0
    for start in range(0, num_tokens, hash_block_size):
        end = start + hash_block_size
        extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
        chunks.append((tuple(request.all_token_ids[start:end]), extra))
    return tuple(chunks)


# --------------------------------------------------------------------------
# Argument checks shared by the actions (they never change anything).


def _check_ids(s: PoolState, ids: Sequence[Any]) -> None:
    for b in ids:
        if not isinstance(b, int) or not 0 <= b < s.num_blocks:
            raise UnknownBlockError(f"block id {b!r} is not in [0, {s.num_blocks})")


def _check_releasable(s: PoolState, ids: Sequence[BlockId], what: str) -> None:
    """Each non-null block must hold at least as many references as listings."""
    _check_ids(s, ids)
    listed: dict[BlockId, int] = {}
    for b in ids:
        if b == NULL:
            continue
        listed[b] = listed.get(b, 0) + 1
        if listed[b] > s.ref[b]:
            raise BlockNotInUseError(
                f"{what} block {b}: {listed[b]} release(s) but ref count {s.ref[b]}")


def _check_count(name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")


def _check_group(group_id: Any) -> None:
    if not isinstance(group_id, int) or not 0 <= group_id <= MAX_GROUP_ID:
        raise InvalidArgumentError(f"kv_cache_group_id {group_id!r} is not a 32-bit id")


def _check_block_size(s: PoolState, block_size: Any) -> None:
    if not isinstance(block_size, int) or block_size <= 0 or block_size % s.hash_block_size:
        raise InvalidArgumentError(
            f"block_size {block_size!r} is not a positive multiple of {s.hash_block_size}")


# --------------------------------------------------------------------------
# Actions.


def get_new_blocks(s: PoolState, num_blocks: int) -> Step:
    """Hand out the first ``num_blocks`` free blocks; evict their hashes lazily."""
    _check_count("num_blocks", num_blocks)
    if num_blocks > len(s.free):
        raise NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
    n = _thaw(s)
    taken, n.free = n.free[:num_blocks], n.free[num_blocks:]
    for b in taken:
        if b in n.watchers:
            n.fired.append((n.watchers.pop(b), b))
    for b in taken:
        if s.caching:
            _drop_hashes(s, n, b)
        n.ref[b] = 1
        n.holds[b] = ()
    return _freeze(s, n), taken


def free_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Drop one reference per listing; idle blocks rejoin the free queue.

    Unhashed blocks (or all, without caching) go to the head in the given
    order, to be reused first; hashed ones to the tail, evicted last (LRU).
    """
    _check_releasable(s, block_ids, "free")
    n = _thaw(s)
    first: list[BlockId] = []
    last: list[BlockId] = []
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        n.ref[b] -= 1
        if n.ref[b] == 0 and b != NULL:
            (last if s.caching and n.primary[b] else first).append(b)
    n.free = first + n.free + last
    return _freeze(s, n), None


def touch(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Take a reference on each block (a prefix hit); idle ones leave the queue."""
    _check_ids(s, block_ids)
    n = _thaw(s)
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        if n.ref[b] == 0 and b != NULL:
            n.free.remove(b)
        n.ref[b] += 1
    return _freeze(s, n), None


def unpin_blocks(s: PoolState, block_ids: Sequence[BlockId], on_reuse: Watcher) -> Step:
    """Drop references but keep the contents readable until reuse or reset."""
    if not callable(on_reuse):
        raise InvalidArgumentError("on_reuse must be callable")
    _check_ids(s, block_ids)
    if NULL in block_ids:
        raise NullBlockError("the null block cannot be unpinned")
    _check_releasable(s, block_ids, "unpin")
    n = _thaw(s)
    released = []
    for b in block_ids:
        n.ref[b] -= 1
        n.watchers[b] = on_reuse
        if n.ref[b] == 0:
            released.append(b)
    n.free = n.free + released
    return _freeze(s, n), None


def evict_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Remove the blocks' index entries; ref counts and queue places stay."""
    _check_ids(s, block_ids)
    n = _thaw(s)
    for b in block_ids:
        _drop_hashes(s, n, b)
    return _freeze(s, n), None


def reset_prefix_cache(s: PoolState) -> Step:
    """Forget every hash, only when no block but the null block is in use."""
    if s.num_blocks - len(s.free) != 1:
        return s, False
    n = _thaw(s)
    n.fired += [(w, b) for b, w in n.watchers.items()]
    n.watchers = {}
    n.index = {}
    n.primary = [None] * s.num_blocks
    n.secondary = [()] * s.num_blocks
    if s.events_on:
        n.events.append(all_blocks_cleared())
    return _freeze(s, n), True


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> Step:
    """Index ``block_ids[num_cached:num_full]`` under the request's block hashes.

    Null and masked-out blocks are skipped.  A block that already has a hash
    must be a partial entry being promoted (its prefix is shorter); its old
    entries are removed first.  One ``BlockStored`` covers the whole range.
    """
    _check_count("num_cached_blocks", num_cached_blocks)
    _check_count("num_full_blocks", num_full_blocks)
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if num_cached_blocks >= num_full_blocks:
        return s, None
    if not s.caching:
        raise CachingDisabledError("cache_full_blocks on a pool without prefix caching")
    if num_full_blocks > len(block_ids):
        raise InvalidArgumentError(f"num_full_blocks {num_full_blocks} > {len(block_ids)} blocks")
    new_ids = block_ids[num_cached_blocks:num_full_blocks]
    _check_ids(s, new_ids)
    if block_mask is not None and len(block_mask) != len(new_ids):
        raise InvalidArgumentError(f"block_mask has {len(block_mask)} entries, want {len(new_ids)}")
    hashes = resolve_block_hashes(request.block_hashes, s.hash_block_size, block_size)
    chosen = [
        (num_cached_blocks + i, b) for i, b in enumerate(new_ids)
        if b != NULL and (block_mask is None or block_mask[i])
    ]
    needed = max([i + 1 for i, _ in chosen] + [num_cached_blocks if s.events_on else 0])
    if len(hashes) < needed:
        raise InvalidArgumentError(f"request has {len(hashes)} block hashes, want {needed}")
    covered = {b: p.num_tokens for b in new_ids if (p := s.primary[b]) is not None}
    for i, b in chosen:
        if b in covered and covered[b] >= (i + 1) * block_size:
            raise BlockHashConflictError(f"block {b} is already cached at a prefix this long")
        covered[b] = (i + 1) * block_size

    n = _thaw(s)
    for i, b in chosen:
        num_tokens = (i + 1) * block_size
        content = _content(request, num_tokens, s.hash_block_size)
        if n.primary[b] is not None:
            _drop_hashes(s, n, b)
        n.holds[b] = _write(n.holds[b], content)
        _add_key(n, make_block_hash_with_group_id(hashes[i], kv_cache_group_id), b,
                 num_tokens, content)
    if s.events_on:
        parent = (maybe_convert_block_hash(hashes[num_cached_blocks - 1])
                  if num_cached_blocks else None)
        n.events.append(block_stored(
            request, [maybe_convert_block_hash(hashes[i]) for i, _b in chosen], parent,
            num_cached_blocks * block_size, num_full_blocks * block_size, block_size,
            kv_cache_group_id, s.medium,
            extra_keys_of_blocks(request, [i for i, _b in chosen], block_size)))
    return _freeze(s, n), None


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> Step:
    """Make ``block_id`` reachable from a prefix boundary inside it.

    The key becomes the block's primary key if it has none, else a secondary
    one.  Entries covering a shorter prefix are dropped first (the block grew);
    with ``replace_existing_hashes`` all are (its contents were replaced).
    Returns the key, or ``None`` for the null block.
    """
    _check_ids(s, [block_id])
    if block_id == NULL:
        return s, None
    hbs = s.hash_block_size
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if not isinstance(num_tokens, int) or num_tokens <= 0 or num_tokens % hbs:
        raise InvalidArgumentError(f"num_tokens {num_tokens!r} is not a positive multiple of {hbs}")
    if not replace_existing_hashes and not (block_size > hbs and num_tokens % block_size):
        raise InvalidArgumentError("a partial entry must end inside a block")
    num_hash_blocks = num_tokens // hbs
    if num_hash_blocks > len(request.block_hashes):
        raise InvalidArgumentError(f"request has only {len(request.block_hashes)} block hashes")
    if not s.caching:
        raise CachingDisabledError("cache_partial_block on a pool without prefix caching")

    n = _thaw(s)
    key = make_block_hash_with_group_id(request.block_hashes[num_hash_blocks - 1],
                                        kv_cache_group_id)
    primary = n.primary[block_id]
    already = (primary is not None and primary.key == key) or block_id in n.index.get(key, ())
    content = _content(request, num_tokens, hbs)
    if replace_existing_hashes:
        _drop_hashes(s, n, block_id)
        already = False
        n.holds[block_id] = content
    else:
        if not already and primary is not None and primary.num_tokens < num_tokens:
            _drop_hashes(s, n, block_id)
        n.holds[block_id] = _write(n.holds[block_id], content)
    _add_key(n, key, block_id, num_tokens, content)
    if s.events_on and not already:
        start = (num_hash_blocks - 1) * hbs
        parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
        n.events.append(block_stored(
            request, [maybe_convert_block_hash(get_block_hash(key))],
            maybe_convert_block_hash(parent) if parent is not None else None,
            start, num_tokens, num_tokens - start, kv_cache_group_id, s.medium,
            [extra_keys_of_chunk(request, start, num_tokens)]))
    return _freeze(s, n), key


def move_block_hashes(s: PoolState, src_id: BlockId, dst_id: BlockId) -> Step:
    """Re-point ``src``'s entries at ``dst``, a private copy; no events.

    The caller copied ``src``'s contents into ``dst`` (ghost: ``dst`` now
    holds what ``src`` held) and keeps writing into ``src``.
    """
    _check_ids(s, [src_id, dst_id])
    if s.primary[dst_id] is not None or s.secondary[dst_id]:
        raise BlockHashConflictError(f"block {dst_id} already has hashes")
    if dst_id == NULL and s.primary[src_id] is not None:
        raise NullBlockError("hashes cannot be moved onto the null block")
    primary = s.primary[src_id]
    if primary is None:
        return s, None
    n = _thaw(s)
    keys = [primary.key, *n.secondary[src_id]]
    names = [n.names[k] for k in keys]
    _drop_hashes(replace(s, events_on=False), n, src_id)
    n.holds[dst_id] = n.holds[src_id]
    for key, name in zip(keys, names, strict=True):
        _add_key(n, key, dst_id, primary.num_tokens, name)
    return _freeze(s, n), None


def take_events(s: PoolState) -> Step:
    """Hand over the emitted events and clear the log."""
    return replace(s, events=()), list(s.events)


def emit_cached_block_events(
    s: PoolState, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int,
) -> Step:
    """Announce prefix-cache hits to event consumers; the pool is unchanged."""
    _check_count("num_cached_blocks", num_cached_blocks)
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if not s.events_on or num_cached_blocks == 0:
        return s, None
    hashes = resolve_block_hashes(request.block_hashes, s.hash_block_size, block_size)
    if num_cached_blocks > len(hashes):
        raise InvalidArgumentError(f"request has {len(hashes)} block hashes, want {num_cached_blocks}")
    event = block_stored(
        request, [maybe_convert_block_hash(h) for h in hashes[:num_cached_blocks]], None,
        0, num_cached_blocks * block_size, block_size, kv_cache_group_id, s.medium,
        extra_keys_of_blocks(request, range(num_cached_blocks), block_size))
    return replace(s, events=(*s.events, event)), None


# --------------------------------------------------------------------------
# Queries.


def get_cached_block(
    s: PoolState, block_hash: bytes, kv_cache_group_ids: Sequence[int]
) -> list[BlockId] | None:
    """The first block indexed under the hash in every group, or ``None``."""
    for g in kv_cache_group_ids:
        _check_group(g)
    found = []
    for g in kv_cache_group_ids:
        blocks = s.index.get(make_block_hash_with_group_id(block_hash, g))
        if not blocks:
            return None
        found.append(blocks[0])
    return found


def is_block_writable(s: PoolState, block_id: BlockId) -> bool:
    """Only a sole owner of an unhashed, non-null block may write into it."""
    _check_ids(s, [block_id])
    return block_id != NULL and s.ref[block_id] == 1 and s.primary[block_id] is None


def get_num_free_blocks(s: PoolState) -> int:
    """How many blocks the free queue holds."""
    return len(s.free)


def get_usage(s: PoolState) -> float:
    """Fraction of the real (non-null) blocks in use."""
    real = s.num_blocks - 1
    return 1.0 - len(s.free) / real if real else 0.0


ACTIONS: dict[str, Callable[..., Step]] = {
    f.__name__: f
    for f in (
        get_new_blocks, free_blocks, touch, unpin_blocks, evict_blocks, reset_prefix_cache,
        cache_full_blocks, cache_partial_block, move_block_hashes, emit_cached_block_events,
        take_events,
    )
}
"""Every state-changing operation of the pool, by its public name."""

QUERIES: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (get_cached_block, is_block_writable, get_num_free_blocks, get_usage)
}
"""Every read-only operation of the pool, by its public name."""
