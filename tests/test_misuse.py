"""A table of misuses: each is refused with its typed error and changes nothing.

The pools are first brought into a non-trivial state (blocks allocated,
shared, cached, idle and cached, a partial and a secondary entry, an
unpinned block with a watcher, pending events), so that "unchanged" — the
``snapshot`` of every pool being equal before and after — means something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvpool.impl import (
    BlockHashConflictError,
    BlockNotInUseError,
    BlockPool,
    BlockPoolError,
    CachingDisabledError,
    InvalidArgumentError,
    KVCacheBlock,
    NotEnoughFreeBlocksError,
    NullBlockError,
    Request,
    UnknownBlockError,
    get_request_block_hasher,
)
from kvpool.oracle.core.observe import snapshot

HBS = 2
BS = 4
NUM_BLOCKS = 16


def make_request(name: str, tokens: list[int]) -> Request:
    return Request(name, tokens, block_hasher=get_request_block_hasher(HBS))


def watcher(block: KVCacheBlock) -> None:
    """A reuse watcher that does nothing."""


@dataclass
class World:
    """The pools under test and handles on their blocks, in a known state."""

    pool: BlockPool  # caching, events on
    other: BlockPool  # a second caching pool
    plain: BlockPool  # built with enable_caching=False
    request: Request  # 16 tokens: 8 hash chunks, 4 full blocks
    short: Request  # 6 tokens: 3 hash chunks, 1 full block
    table: list[KVCacheBlock]  # blocks 1-4 of the running request
    idle_cached: list[KVCacheBlock]  # freed cached blocks (ref 0, tail of the queue)
    unpinned: KVCacheBlock  # ref 0, watched
    never_used: KVCacheBlock  # ref 0, never allocated
    other_held: KVCacheBlock
    other_idle: KVCacheBlock
    plain_held: KVCacheBlock

    @property
    def cached(self) -> KVCacheBlock:
        """Held, fully cached, with a secondary (partial) entry."""
        return self.table[0]

    @property
    def shared(self) -> KVCacheBlock:
        """Cached and held by two requests (ref 2)."""
        return self.table[1]

    @property
    def held(self) -> KVCacheBlock:
        """Cached, held once."""
        return self.table[2]

    @property
    def partial(self) -> KVCacheBlock:
        """Held, whose primary key is a partial entry (14 tokens, inside the block)."""
        return self.table[3]

    def pools(self) -> list[BlockPool]:
        return [self.pool, self.other, self.plain]


def build_world() -> World:
    pool = BlockPool(NUM_BLOCKS, True, HBS, enable_kv_cache_events=True)
    request = make_request("r", list(range(16)))
    short = make_request("s", list(range(6)))
    table = pool.get_new_blocks(4)  # 1..4
    pool.cache_full_blocks(request, table, 0, 3, BS, 0)
    pool.cache_partial_block(request, table[3], 14, 0, BS)  # partial primary
    pool.cache_partial_block(request, table[0], 2, 0, BS)  # secondary on a full block
    pool.touch([table[1]])
    finished = pool.get_new_blocks(2)  # 5, 6
    pool.cache_full_blocks(make_request("f", [9] * 8), finished, 0, 2, BS, 1)
    pool.free_blocks(reversed(finished))
    unpinned = pool.get_new_blocks(1)[0]
    pool.unpin_blocks([unpinned], watcher)

    other = BlockPool(6, True, HBS, enable_kv_cache_events=True)
    other_held, other_idle = other.get_new_blocks(2)
    other.free_blocks([other_idle])

    plain = BlockPool(6, False, HBS)
    plain_held = plain.get_new_blocks(1)[0]
    assert pool.kv_event_queue, "the state should have pending events"
    return World(pool, other, plain, request, short, table, finished, unpinned,
                 pool.blocks[NUM_BLOCKS - 1], other_held, other_idle, plain_held)


@dataclass(frozen=True)
class Misuse:
    id: str
    call: Callable[[World], Any]
    error: type[BlockPoolError]
    message: str | None = None  # the exact message, where it is part of the contract
    xfail: str | None = None


def full(w: World, num_cached: Any = 3, num_full: Any = 4, *, block_size: int = BS,
         group: int = 0, request: Request | None = None,
         blocks: list[KVCacheBlock] | None = None, block_mask: list[bool] | None = None) -> None:
    """``cache_full_blocks`` of the running request's table, the last block by default."""
    w.pool.cache_full_blocks(request or w.request, w.table if blocks is None else blocks,
                             num_cached, num_full, block_size, group, block_mask=block_mask)


def partial(w: World, num_tokens: Any, *, block_size: int = BS, group: int = 0,
            block: KVCacheBlock | None = None, pool: BlockPool | None = None) -> None:
    """``cache_partial_block`` of the running request, on a held cached block by default."""
    target = w.held if block is None else block
    (pool or w.pool).cache_partial_block(w.request, target, num_tokens, group, block_size)


MISUSES: list[Misuse] = [
    # ---- freeing
    Misuse("double_free", lambda w: w.pool.free_blocks([w.idle_cached[0]]), BlockNotInUseError),
    Misuse("over_free_in_one_call", lambda w: w.pool.free_blocks([w.shared] * 3),
           BlockNotInUseError),
    Misuse("free_never_allocated_block", lambda w: w.pool.free_blocks([w.never_used]),
           BlockNotInUseError),
    Misuse("free_good_and_bad_block", lambda w: w.pool.free_blocks([w.held, w.never_used]),
           BlockNotInUseError),
    Misuse("free_int", lambda w: w.pool.free_blocks([3]), UnknownBlockError),
    Misuse("free_none", lambda w: w.pool.free_blocks([w.held, None]), UnknownBlockError),
    Misuse("free_block_of_no_pool", lambda w: w.pool.free_blocks([KVCacheBlock(3)]),
           UnknownBlockError),
    Misuse("free_over_free_in_other_pool",
           lambda w: w.pool.free_blocks([w.held, w.other_held, w.other_held]),
           BlockNotInUseError),
    Misuse("free_idle_block_of_other_pool",
           lambda w: w.pool.free_blocks([w.other_idle, w.held]), BlockNotInUseError),
    # ---- unpinning
    Misuse("unpin_null_block", lambda w: w.pool.unpin_blocks([w.pool.null_block], watcher),
           NullBlockError),
    Misuse("unpin_idle_block", lambda w: w.pool.unpin_blocks([w.idle_cached[1]], watcher),
           BlockNotInUseError),
    Misuse("unpin_over_free_in_one_call", lambda w: w.pool.unpin_blocks([w.held, w.held], watcher),
           BlockNotInUseError),
    Misuse("unpin_non_callable_watcher", lambda w: w.pool.unpin_blocks([w.held], 42),
           InvalidArgumentError),
    Misuse("unpin_int", lambda w: w.pool.unpin_blocks([3], watcher), UnknownBlockError),
    Misuse("unpin_block_of_other_pool", lambda w: w.pool.unpin_blocks([w.other_held], watcher),
           UnknownBlockError),
    # ---- touching and querying blocks
    Misuse("touch_int", lambda w: w.pool.touch([w.idle_cached[0], 3]), UnknownBlockError),
    Misuse("touch_none", lambda w: w.pool.touch([None]), UnknownBlockError),
    Misuse("touch_block_of_no_pool", lambda w: w.pool.touch([KVCacheBlock(3)]),
           UnknownBlockError),
    Misuse("touch_block_of_other_pool", lambda w: w.pool.touch([w.held, w.other_idle]),
           UnknownBlockError),
    Misuse("writable_block_of_no_pool", lambda w: w.pool.is_block_writable(KVCacheBlock(3)),
           UnknownBlockError),
    Misuse("get_cached_block_group_negative",
           lambda w: w.pool.get_cached_block(w.request.block_hashes[1], [0, -1]),
           InvalidArgumentError),
    Misuse("get_cached_block_group_negative_after_a_miss",
           lambda w: w.pool.get_cached_block(b"never cached", [0, -1]), InvalidArgumentError),
    # ---- evicting
    Misuse("evict_id_minus_one", lambda w: w.pool.evict_blocks({1, -1}), UnknownBlockError),
    Misuse("evict_id_num_blocks", lambda w: w.pool.evict_blocks({NUM_BLOCKS}), UnknownBlockError),
    Misuse("evict_id_str", lambda w: w.pool.evict_blocks({"3"}), UnknownBlockError),
    # ---- allocating
    Misuse("get_new_blocks_negative", lambda w: w.pool.get_new_blocks(-1), InvalidArgumentError),
    Misuse("get_new_blocks_str", lambda w: w.pool.get_new_blocks("2"), InvalidArgumentError),
    Misuse("get_new_blocks_free_plus_one",
           lambda w: w.pool.get_new_blocks(w.pool.get_num_free_blocks() + 1),
           NotEnoughFreeBlocksError, message="Cannot get 12 free blocks from the pool"),
    # ---- cache_full_blocks
    Misuse("full_beyond_block_list", lambda w: full(w, 3, 5), InvalidArgumentError),
    Misuse("full_too_few_request_hashes", lambda w: full(w, 3, 4, request=w.short),
           InvalidArgumentError),
    Misuse("full_mask_wrong_length", lambda w: full(w, 3, 4, block_mask=[True, False]),
           InvalidArgumentError),
    Misuse("full_negative_num_cached", lambda w: full(w, -1, 4), InvalidArgumentError),
    Misuse("full_negative_num_full", lambda w: full(w, 0, -1), InvalidArgumentError),
    Misuse("full_block_size_not_multiple", lambda w: full(w, 3, 4, block_size=3),
           InvalidArgumentError),
    Misuse("full_group_negative", lambda w: full(w, 3, 4, group=-1), InvalidArgumentError),
    Misuse("full_group_too_big", lambda w: full(w, 3, 4, group=2**32), InvalidArgumentError),
    Misuse("full_block_of_other_pool", lambda w: full(w, 3, 4, blocks=[*w.table[:3], w.other_held]),
           UnknownBlockError),
    Misuse("full_recache_same_length", lambda w: full(w, 0, 3), BlockHashConflictError),
    Misuse("full_caching_disabled",
           lambda w: w.plain.cache_full_blocks(w.request, [w.plain_held], 0, 1, BS, 0),
           CachingDisabledError),
    Misuse("emit_more_blocks_than_hashes",
           lambda w: w.pool.emit_cached_block_events(w.short, 2, BS, 0), InvalidArgumentError),
    # ---- cache_partial_block
    Misuse("partial_off_hash_grid", lambda w: partial(w, 3), InvalidArgumentError),
    Misuse("partial_zero_tokens", lambda w: partial(w, 0), InvalidArgumentError),
    Misuse("partial_negative_tokens", lambda w: partial(w, -2), InvalidArgumentError),
    Misuse("partial_past_request_hashes", lambda w: partial(w, 18), InvalidArgumentError),
    Misuse("partial_boundary_not_inside_block", lambda w: partial(w, 8), InvalidArgumentError),
    Misuse("partial_block_size_equals_hash_block_size",
           lambda w: partial(w, 2, block_size=HBS), InvalidArgumentError),
    Misuse("partial_block_size_not_multiple", lambda w: partial(w, 2, block_size=5),
           InvalidArgumentError),
    Misuse("partial_group_negative", lambda w: partial(w, 2, group=-1), InvalidArgumentError),
    Misuse("partial_group_too_big", lambda w: partial(w, 2, group=2**32), InvalidArgumentError),
    Misuse("partial_block_of_other_pool", lambda w: partial(w, 2, block=w.other_held),
           UnknownBlockError),
    Misuse("partial_caching_disabled",
           lambda w: partial(w, 2, block=w.plain_held, pool=w.plain), CachingDisabledError),
    Misuse("partial_tokens_none", lambda w: partial(w, None), InvalidArgumentError),
    # ---- move_block_hashes
    Misuse("move_onto_hashed_block", lambda w: w.pool.move_block_hashes(w.cached, w.held),
           BlockHashConflictError),
    Misuse("move_onto_null_block",
           lambda w: w.pool.move_block_hashes(w.cached, w.pool.null_block), NullBlockError),
    Misuse("move_from_block_of_no_pool",
           lambda w: w.pool.move_block_hashes(KVCacheBlock(2), w.pool.blocks[9]),
           UnknownBlockError),
    # ---- two wrong arguments: the refusal the model checks first (found by the bounded
    # refinement, oracle/search/refinement.py: the pool used to refuse the other one)
    Misuse("free_idle_block_then_block_of_no_pool",
           lambda w: w.pool.free_blocks([w.idle_cached[0], KVCacheBlock(3)]), UnknownBlockError),
    Misuse("unpin_null_block_then_block_of_other_pool",
           lambda w: w.pool.unpin_blocks([w.pool.null_block, w.other_held], watcher),
           UnknownBlockError),
    Misuse("full_block_of_no_pool_and_mask_wrong_length",
           lambda w: full(w, 3, 4, blocks=[*w.table[:3], KVCacheBlock(3)], block_mask=[True, False]),
           UnknownBlockError),
    Misuse("full_recache_then_block_of_no_pool",
           lambda w: full(w, 0, 4, blocks=[*w.table[:3], KVCacheBlock(3)]), UnknownBlockError),
    Misuse("full_recache_with_too_few_request_hashes", lambda w: full(w, 0, 3, request=w.short),
           InvalidArgumentError),
    # ---- construction
    Misuse("ctor_zero_blocks", lambda w: BlockPool(0, True, HBS), InvalidArgumentError),
    Misuse("ctor_negative_blocks", lambda w: BlockPool(-4, True, HBS), InvalidArgumentError),
    Misuse("ctor_non_int_blocks", lambda w: BlockPool(4.0, True, HBS), InvalidArgumentError),
    Misuse("ctor_hash_block_size_zero", lambda w: BlockPool(4, True, 0), InvalidArgumentError),
]


def _params() -> list[Any]:
    out = []
    for case in MISUSES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


def test_the_table_has_enough_distinct_cases() -> None:
    names = [case.id for case in MISUSES]
    assert len(names) == len(set(names))
    assert len(names) >= 25


def test_the_world_is_non_trivial() -> None:
    w = build_world()
    refs = [b.ref_cnt for b in w.pool.blocks]
    assert refs[1:5] == [1, 2, 1, 1] and refs[5:8] == [0, 0, 0]
    assert w.pool.get_num_free_blocks() == 11
    assert w.idle_cached[0].block_hash is not None and w.idle_cached[0].ref_cnt == 0
    assert w.partial.block_hash_num_tokens == 14
    assert w.pool.cached_block_hashes_by_block
    assert list(w.pool._reuse_watchers) == [w.unpinned.block_id]
    assert w.pool.kv_event_queue


@pytest.mark.parametrize("case", _params())
def test_misuse_is_refused_with_its_typed_error_and_changes_nothing(case: Misuse) -> None:
    w = build_world()
    before = [snapshot(p) for p in w.pools()]
    with pytest.raises(case.error) as info:
        case.call(w)
    assert type(info.value) is case.error
    assert isinstance(info.value, BlockPoolError) and isinstance(info.value, ValueError)
    if case.message is not None:
        assert str(info.value) == case.message
    after = [snapshot(p) for p in w.pools()]
    assert after == before
