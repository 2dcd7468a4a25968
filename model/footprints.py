"""What each call may change: its footprint, the blocks and keys it touches (mypyvy's ``modifies``).

A footprint is computed from the state before the call and its arguments,
at the call's own cost.  Outside it nothing changes: every other block keeps
its count, hashes, content, holders and watcher, and its place in the free
queue relative to the other untouched blocks; every other key keeps its
index entries, name and announcements.  The bounded model checker checks
that on every transition, the lockstep in its debug mode; the lockstep
compares a pool with the model on the footprint after every call, and on
the whole pool every few calls (``kvpool.oracle.core.lockstep``).  The
footprint of a call on just the blocks it names is derived (:mod:`.derived`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .pool import chosen, keys_of
from .request import block_hash, prefix_key
from .state import NULL, BlockId, Key, PoolState


@dataclass(frozen=True)
class Footprint:
    """The blocks and keys a call may change."""

    blocks: frozenset[BlockId] = frozenset()
    keys: frozenset[Key] = frozenset()


NOTHING = Footprint()


def of_blocks(s: PoolState, blocks: Iterable[BlockId], keys: Iterable[Key] = ()) -> Footprint:
    """The blocks (ids of this pool only), the keys each has now, and ``keys``."""
    real = frozenset(b for b in blocks if isinstance(b, int) and 0 <= b < s.num_blocks)
    return Footprint(real, frozenset(k for b in real for k in keys_of(s, b)) | frozenset(keys))


def get_new_blocks(s: PoolState, num_blocks: int) -> Footprint:
    """The blocks handed out; none when there are too few (the call is refused, at no cost)."""
    return of_blocks(s, s.free.first(num_blocks) if isinstance(num_blocks, int) and num_blocks <= len(s.free)
                     else ())


def reset_prefix_cache(s: PoolState) -> Footprint:
    """Every indexed block and key, and every watched block (amortized: each got there by a call)."""
    return of_blocks(s, {b for blocks in s.index.values() for b in blocks} | set(s.watchers), s.index)


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> Footprint:
    hbs = s.hash_block_size
    picked = chosen(block_ids, num_cached_blocks, num_full_blocks, block_mask)
    return of_blocks(s, [b for _i, b in picked],
                     [(block_hash(request, hbs, block_size, i), kv_cache_group_id) for i, _b in picked])


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> Footprint:
    if block_id == NULL:
        return NOTHING
    return of_blocks(s, [block_id], [prefix_key(request, num_tokens, s.hash_block_size, kv_cache_group_id)])


def insert_block_hash(
    s: PoolState, request: Any, prefix_tokens: int, kv_cache_group_id: int, block_id: BlockId,
    num_tokens: int | None,
) -> Footprint:
    key = prefix_key(request, prefix_tokens, s.hash_block_size, kv_cache_group_id)
    return of_blocks(s, [block_id], [key])


def nothing(s: PoolState, *args: Any) -> Footprint:
    """Event-only operations and queries change no block and no key."""
    return NOTHING


def changed_outside(before: PoolState, after: PoolState, fp: Footprint) -> list[str]:
    """What changed outside ``fp`` between two states (empty when nothing did); O(pool size)."""
    out = []
    for var in ("ref", "primary", "secondary", "holds", "holders"):
        was, now = getattr(before, var), getattr(after, var)
        if was != now:
            out += [f"block {b}'s {var}" for b in range(before.num_blocks)
                    if b not in fp.blocks and was[b] != now[b]]
    for b in set(before.watchers) | set(after.watchers):
        if b not in fp.blocks and before.watchers.get(b) is not after.watchers.get(b):
            out.append(f"block {b}'s watcher")
    if before.free != after.free:
        untouched_before = [b for b in before.free if b not in fp.blocks]
        if untouched_before != [b for b in after.free if b not in fp.blocks]:
            out.append("the untouched blocks' places in the free queue")
    if before.index != after.index or before.names != after.names:
        for k in set(before.index) | set(after.index) | set(before.names) | set(after.names):
            if k in fp.keys:
                continue
            if before.index.get(k) != after.index.get(k):
                out.append(f"the index entries of key …{k[0][-3:].hex()}/g{k[1]}")
            if before.names.get(k) is not after.names.get(k):
                out.append(f"the name of key …{k[0][-3:].hex()}/g{k[1]}")
    if before.announced != after.announced:
        moved = {e for e in before.announced ^ after.announced
                 if e[0] not in fp.keys and e[1] not in fp.blocks}
        if moved:
            out.append(f"{len(moved)} announcement(s) of untouched entries")
    return out
