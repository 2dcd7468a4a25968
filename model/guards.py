"""When the specification refuses a call: each operation's guard, its refusals in order.

A guard reads the state and the arguments and raises a
:class:`~.refusals.Refusal` for the first thing wrong, in the order written
here (that order is observable: a call wrong in two ways is refused for
the first).  It changes nothing, so a refused call leaves the state as it
was.  A guard may also find that the call changes nothing at all and say
so with :class:`Noop` (its result): the call is then accepted without its
contracts or its update running.

Misuse the reference does not catch is refused here: negative counts (vLLM's
``get_new_blocks(-1)`` would inflate the free count), ids outside
``[0, num_blocks)`` (``-1`` would silently mean the last block),
``num_full_blocks`` beyond the block list, request hashes or masks of the
wrong length, group ids that do not fit 32 bits, moving hashes onto the null
block (which would index it), and prefix-cache entries offered to a pool
built without caching (the reference would index blocks that
``get_new_blocks`` then hands out without evicting them).  A partial entry
must end inside a block, as vLLM 0.31 asserts (from 0.32 on it may end at a
block boundary: ``boundary_partials``).  ``cache_full_blocks`` with
``num_cached_blocks >= num_full_blocks`` changes nothing, as in the
reference: vLLM's sparse-attention coordinator can ask for fewer ready
blocks than are cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .events import Hash
from .pool import chosen
from .refusals import Refusal, RefusalKind
from .request import num_blocks_hashed
from .state import NULL, BlockId, PoolState

MAX_GROUP_ID = 2**32 - 1
"""Group ids travel as four bytes in vLLM's index keys."""


@dataclass(frozen=True, slots=True)
class Noop:
    """The call is accepted and changes nothing; ``result`` is what it returns."""

    result: Any = None


Verdict = Noop | None
"""What a guard says when it does not refuse: a no-op, or ``None`` (the update runs)."""


# --------------------------------------------------------------------------
# The checks guards are made of.


def check_ids(s: PoolState, block_ids: Sequence[Any]) -> None:
    """Every listed id names a block of this pool."""
    for b in block_ids:
        if not isinstance(b, int) or not 0 <= b < s.num_blocks:
            raise Refusal(RefusalKind.UNKNOWN_BLOCK, f"block id {b!r} is not in [0, {s.num_blocks})")


def check_releasable(s: PoolState, block_ids: Sequence[BlockId], what: str) -> None:
    """Each real block holds at least as many references as the call lists it."""
    check_ids(s, block_ids)
    listed: dict[BlockId, int] = {}
    for b in block_ids:
        if b == NULL:
            continue
        listed[b] = listed.get(b, 0) + 1
        if listed[b] > s.ref[b]:
            raise Refusal(RefusalKind.NOT_IN_USE,
                          f"{what} block {b}: {listed[b]} release(s) but ref count {s.ref[b]}")


def check_count(name: str, value: Any) -> None:
    """A count is a non-negative int."""
    if not isinstance(value, int) or value < 0:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"{name} must be a non-negative int, got {value!r}")


def check_group(group_id: Any, name: str = "kv_cache_group_id") -> None:
    """A KV-cache group id fits the four bytes keys carry it in."""
    if not isinstance(group_id, int) or not 0 <= group_id <= MAX_GROUP_ID:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"{name} {group_id!r} is not a 32-bit id")


def check_block_size(s: PoolState, size: Any, name: str = "block_size") -> None:
    """A block size is a positive multiple of the hash block size."""
    if not isinstance(size, int) or size <= 0 or size % s.hash_block_size:
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"{name} {size!r} is not a positive multiple of {s.hash_block_size}")


def check_chunks(s: PoolState, num_tokens: Any, name: str = "num_tokens") -> None:
    """A token count is a positive multiple of the hash block size."""
    hbs = s.hash_block_size
    if not isinstance(num_tokens, int) or num_tokens <= 0 or num_tokens % hbs:
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"{name} {num_tokens!r} is not a positive multiple of {hbs}")


def check_callable(name: str, value: Any) -> None:
    """A watcher is a callable."""
    if not callable(value):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"{name} must be callable")


def check_caching(s: PoolState, op: str) -> None:
    """Prefix-cache entries need a pool built with caching."""
    if not s.caching:
        raise Refusal(RefusalKind.CACHING_DISABLED, f"{op} on a pool without prefix caching")


def check_hashed(request: Any, hbs: int, size: int, needed: int) -> None:
    """The request carries a hash for each of the first ``needed`` blocks."""
    have = num_blocks_hashed(request, hbs, size)
    if have < needed:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"request has {have} block hashes, want {needed}")


def check_conflicts(s: PoolState, new_ids: Sequence[BlockId], picked: Sequence[tuple[int, BlockId]],
                    size: int) -> None:
    """A block may only be re-cached at a longer prefix (a partial entry being promoted).

    Against what it covered before the call: a block listed again later in the call is listed at a
    longer prefix, which is allowed."""
    covered = {b: p.num_tokens for b in new_ids if (p := s.primary[b]) is not None}
    for i, b in picked:
        if b in covered and covered[b] >= (i + 1) * size:
            raise Refusal(RefusalKind.HASH_CONFLICT, f"block {b} is already cached at a prefix this long")


# --------------------------------------------------------------------------
# One guard per operation.


def get_new_blocks(s: PoolState, num_blocks: int) -> Verdict:
    check_count("num_blocks", num_blocks)
    if num_blocks > len(s.free):
        raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                      f"Cannot get {num_blocks} free blocks from the pool")
    return None


def free_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Verdict:
    check_releasable(s, block_ids, "free")
    return None


def touch(s: PoolState, block_ids: Sequence[BlockId]) -> Verdict:
    check_ids(s, block_ids)
    return None


def unpin_blocks(s: PoolState, block_ids: Sequence[BlockId], on_reuse: Any) -> Verdict:
    check_callable("on_reuse", on_reuse)
    check_ids(s, block_ids)
    if NULL in block_ids:
        raise Refusal(RefusalKind.NULL_BLOCK, "the null block cannot be unpinned")
    check_releasable(s, block_ids, "unpin")
    return None


def evict_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Verdict:
    check_ids(s, block_ids)
    return None


def reset_prefix_cache(s: PoolState) -> Verdict:
    return None


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> Verdict:
    check_count("num_cached_blocks", num_cached_blocks)
    check_count("num_full_blocks", num_full_blocks)
    check_block_size(s, block_size)
    check_group(kv_cache_group_id)
    if num_cached_blocks >= num_full_blocks:
        return Noop()
    check_caching(s, "cache_full_blocks")
    if num_full_blocks > len(block_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_full_blocks {num_full_blocks} > {len(block_ids)} blocks")
    new_ids = block_ids[num_cached_blocks:num_full_blocks]
    check_ids(s, new_ids)
    if block_mask is not None and len(block_mask) != len(new_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"block_mask has {len(block_mask)} entries, want {len(new_ids)}")
    picked = chosen(block_ids, num_cached_blocks, num_full_blocks, block_mask)
    needed = max([i + 1 for i, _ in picked] + [num_cached_blocks if s.events_on else 0])
    check_hashed(request, s.hash_block_size, block_size, needed)
    check_conflicts(s, new_ids, picked, block_size)
    return None


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> Verdict:
    check_ids(s, [block_id])
    if block_id == NULL:
        return Noop()
    check_block_size(s, block_size)
    check_group(kv_cache_group_id)
    check_chunks(s, num_tokens)
    if not (replace_existing_hashes or s.boundary_partials
            or (block_size > s.hash_block_size and num_tokens % block_size)):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, "a partial entry must end inside a block")
    if num_tokens // s.hash_block_size > len(request.block_hashes):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"request has only {len(request.block_hashes)} block hashes")
    check_caching(s, "cache_partial_block")
    return None


def move_block_hashes(s: PoolState, src_id: BlockId, dst_id: BlockId) -> Verdict:
    check_ids(s, [src_id, dst_id])
    if s.primary[dst_id] is not None or s.secondary[dst_id]:
        raise Refusal(RefusalKind.HASH_CONFLICT, f"block {dst_id} already has hashes")
    if dst_id == NULL and s.primary[src_id] is not None:
        raise Refusal(RefusalKind.NULL_BLOCK, "hashes cannot be moved onto the null block")
    if s.primary[src_id] is None:
        return Noop()
    return None


def insert_block_hash(
    s: PoolState, request: Any, prefix_tokens: int, kv_cache_group_id: int, block_id: BlockId,
    num_tokens: int | None,
) -> Verdict:
    check_ids(s, [block_id])
    hbs = s.hash_block_size
    if (not isinstance(prefix_tokens, int) or prefix_tokens <= 0 or prefix_tokens % hbs
            or prefix_tokens // hbs > len(request.block_hashes)):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"no key names the first {prefix_tokens!r} tokens")
    check_group(kv_cache_group_id)
    if block_id == NULL:
        raise Refusal(RefusalKind.NULL_BLOCK, "the null block cannot be indexed")
    check_caching(s, "_insert_block_hash")
    if s.primary[block_id] is None and not (
            isinstance(num_tokens, int) and num_tokens > 0 and num_tokens % hbs == 0):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_tokens {num_tokens!r} of a primary key is not a positive multiple of {hbs}")
    return None


def maybe_evict_cached_block(s: PoolState, block_id: BlockId) -> Verdict:
    check_ids(s, [block_id])
    return None


def emit_cached_block_events(
    s: PoolState, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int,
) -> Verdict:
    check_count("num_cached_blocks", num_cached_blocks)
    check_block_size(s, block_size)
    check_group(kv_cache_group_id)
    if not s.events_on or num_cached_blocks == 0:
        return Noop()
    check_hashed(request, s.hash_block_size, block_size, num_cached_blocks)
    return None


def take_events(s: PoolState) -> Verdict:
    return None


def write_block(s: PoolState, block_id: BlockId, request: Any, num_tokens: int) -> Verdict:
    check_ids(s, [block_id])
    check_chunks(s, num_tokens)
    if num_tokens > len(request.all_token_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"request has only {len(request.all_token_ids)} tokens")
    return None


def get_cached_block(s: PoolState, block_hash: Hash, kv_cache_group_ids: Sequence[int]) -> Verdict:
    for g in kv_cache_group_ids:
        check_group(g)
    return None


def is_block_writable(s: PoolState, block_id: BlockId) -> Verdict:
    check_ids(s, [block_id])
    return None


def get_num_free_blocks(s: PoolState) -> Verdict:
    return None


def get_usage(s: PoolState) -> Verdict:
    return None
