"""The pool (``kvpool.impl.pool``): every public method of ``BlockPool``, one section each.

Reference: vLLM 0.31.0 ``block_pool.py`` (``vllm_block_pool.txt``); line numbers in comments
point there.  Choices the reference leaves open follow the model (``kvpool.model.pool``).
"""


import itertools
import types
from typing import Any, cast

import pytest
from impl_helpers import (
    BS,
    HBS,
    TOKENS,
    RecordingWatcher,
    cache_blocks,
    ext,
    free_ids,
    ids,
    index_of,
    key,
    make_pool,
    make_request,
    removed,
    stored,
    taken,
)

from kvpool.impl import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHashToBlockMap,
    BlockNotInUseError,
    BlockPool,
    BlockStored,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    LoRARequest,
    NotEnoughFreeBlocksError,
    Request,
    UnknownBlockError,
    get_group_id,
    make_block_hash_with_group_id,
)
from kvpool.impl.hashing import resolve_block_hashes
from kvpool.model import ACTIONS, QUERIES, initial_state
from kvpool.oracle.core.lockstep import MetricsRecorder
from kvpool.oracle.core.observe import free_queue_link_errors, snapshot

# --------------------------------------------------------------------- construction


def test_new_pool_exposes_reference_attributes() -> None:
    pool = BlockPool(6, True, HBS)
    assert pool.num_gpu_blocks == 6
    assert pool.enable_caching is True
    assert pool.hash_block_size == HBS
    assert pool.medium == MEDIUM_GPU
    assert pool.enable_kv_cache_events is False
    assert pool.kv_event_queue == []
    assert pool.metrics_collector is None
    assert len(pool.cached_block_hash_to_block) == 0
    assert isinstance(pool.cached_block_hash_to_block, BlockHashToBlockMap)
    assert isinstance(pool.free_block_queue, FreeKVCacheBlockQueue)


def test_new_pool_blocks_belong_to_it_and_all_but_null_are_free_in_id_order() -> None:
    pool = make_pool(6)
    assert ids(pool.blocks) == [0, 1, 2, 3, 4, 5]
    assert all(b.pool is pool and b.ref_cnt == 0 and b.block_hash is None for b in pool.blocks)
    assert free_ids(pool) == [1, 2, 3, 4, 5]
    assert pool.get_num_free_blocks() == 5


def test_null_block_is_block_zero_marked_null_and_not_free() -> None:
    pool = make_pool(4)
    assert pool.null_block is pool.blocks[0]
    assert pool.null_block.is_null
    assert not any(b.is_null for b in pool.blocks[1:])
    assert pool.null_block.prev_free_block is None and pool.null_block.next_free_block is None


def test_constructor_keeps_medium_and_metrics_collector() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(3, medium=MEDIUM_CPU, metrics=metrics)
    assert pool.medium == MEDIUM_CPU
    assert pool.metrics_collector is metrics


# ------------------------------------------------------------------- get_new_blocks


def test_get_new_blocks_hands_out_the_head_of_the_free_queue_in_order() -> None:
    pool = make_pool(6)
    got = pool.get_new_blocks(3)
    assert ids(got) == [1, 2, 3]
    assert [b.ref_cnt for b in got] == [1, 1, 1]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
    assert free_ids(pool) == [4, 5]
    assert pool.get_num_free_blocks() == 2


def test_get_new_blocks_zero_returns_empty_list_and_changes_nothing() -> None:
    pool = make_pool(4)
    before = snapshot(pool)
    assert pool.get_new_blocks(0) == []
    assert snapshot(pool) == before


def test_get_new_blocks_can_take_every_free_block() -> None:
    pool = make_pool(4)
    assert ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert pool.get_num_free_blocks() == 0
    assert free_ids(pool) == []


def test_get_new_blocks_beyond_free_count_raises_value_error_with_reference_message() -> None:
    pool = make_pool(4)
    with pytest.raises(NotEnoughFreeBlocksError) as info:
        pool.get_new_blocks(4)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "Cannot get 4 free blocks from the pool"  # reference line 682


def test_get_new_blocks_evicts_hash_of_reused_cached_block_and_emits_removals() -> None:
    pool = make_pool(3)
    req = make_request(TOKENS)
    block = cache_blocks(pool, req, 1)[0]
    pool.cache_partial_block(req, block, 2, 0, BS)  # secondary key of the same block
    pool.free_blocks([block])
    taken(pool)
    pool.get_new_blocks(1)  # block 2: unhashed, nothing removed
    assert taken(pool) == []
    again = pool.get_new_blocks(1)[0]
    assert again is block
    assert block.block_hash is None and block.block_hash_num_tokens is None
    assert index_of(pool) == {}
    assert pool.cached_block_hashes_by_block == {}
    assert taken(pool) == [removed(key(req, 1)), removed(key(req, 0))]  # primary first


def test_get_new_blocks_reports_allocation_and_eviction_to_metrics_in_reference_order() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(4, metrics=metrics)
    pool.get_new_blocks(2)
    # reference lines 690-696: evicted (via _maybe_evict_cached_block) then allocated, per block
    assert metrics.log == [("evicted", 1), ("allocated", 1), ("evicted", 2), ("allocated", 2)]


def test_get_new_blocks_without_caching_reports_only_allocation() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(4, caching=False, metrics=metrics)
    pool.get_new_blocks(2)
    assert metrics.log == [("allocated", 1), ("allocated", 2)]


# ---------------------------------------------------------------------- free_blocks


def test_free_blocks_puts_unhashed_blocks_at_the_head_in_the_given_order() -> None:
    pool = make_pool(6)
    a, b, _c = pool.get_new_blocks(3)
    pool.free_blocks([b, a])
    assert free_ids(pool) == [2, 1, 4, 5]
    assert a.ref_cnt == b.ref_cnt == 0


def test_free_blocks_puts_hashed_blocks_at_the_tail_in_the_given_order() -> None:
    pool = make_pool(6)
    a, b = cache_blocks(pool, make_request(TOKENS), 2)
    plain = pool.get_new_blocks(1)[0]
    pool.free_blocks([b, plain, a])
    assert free_ids(pool) == [3, 4, 5, 2, 1]


def test_free_blocks_without_caching_puts_every_block_at_the_head() -> None:
    pool = make_pool(5, caching=False)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a, b])
    assert free_ids(pool) == [1, 2, 3, 4]


def test_free_blocks_of_a_shared_block_only_drops_one_reference() -> None:
    pool = make_pool(4)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    pool.free_blocks([block])
    assert block.ref_cnt == 1
    assert 1 not in free_ids(pool)


def test_free_blocks_listing_a_block_k_times_drops_k_references() -> None:
    pool = make_pool(4)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block, block])
    pool.free_blocks([block, block, block])
    assert block.ref_cnt == 0
    assert free_ids(pool) == [1, 2, 3]


def test_free_blocks_accepts_any_iterable() -> None:
    pool = make_pool(4)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(b for b in blocks)
    assert pool.get_num_free_blocks() == 3


def test_free_blocks_of_the_null_block_is_legal_and_never_frees_it() -> None:
    pool = make_pool(4)
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == -1  # the reference's counter moves, meaningless
    assert free_ids(pool) == [1, 2, 3]


def test_free_blocks_delegates_blocks_of_a_second_pool_to_that_pool() -> None:
    mine, theirs = make_pool(4), make_pool(4)
    my_block = mine.get_new_blocks(1)[0]
    their_block = theirs.get_new_blocks(1)[0]
    mine.free_blocks([their_block, my_block])
    assert my_block.ref_cnt == their_block.ref_cnt == 0
    assert free_ids(mine) == [1, 2, 3]
    assert free_ids(theirs) == [1, 2, 3]


def test_free_blocks_over_free_in_the_second_pool_is_refused_before_either_changes() -> None:
    mine, theirs = make_pool(4), make_pool(4)
    my_block = mine.get_new_blocks(1)[0]
    their_block = theirs.get_new_blocks(1)[0]
    before = (snapshot(mine), snapshot(theirs))
    with pytest.raises(BlockNotInUseError):
        mine.free_blocks([my_block, their_block, their_block])
    assert (snapshot(mine), snapshot(theirs)) == before
    assert my_block.ref_cnt == 1


@pytest.mark.parametrize("bad", [0, 1, 2])
@pytest.mark.parametrize("how", ["unpin", "free", "free_iter"])
def test_refused_release_changes_no_reference(how: str, bad: int) -> None:
    """An over-release anywhere in the list is refused and every count stays as it was."""
    pool = BlockPool(8, True, 2)
    blocks = pool.get_new_blocks(4)
    pool.touch([blocks[0]])
    listed = [blocks[0], blocks[1], blocks[2]]
    listed[bad] = pool.blocks[6]  # a free block: one release too many
    before = snapshot(pool)
    with pytest.raises(BlockNotInUseError):
        if how == "unpin":
            pool.unpin_blocks(listed, RecordingWatcher())
        elif how == "free":
            pool.free_blocks(listed)
        else:
            pool.free_blocks(x for x in listed)
    assert snapshot(pool) == before
    assert [b.ref_cnt for b in pool.blocks] == [0, 2, 1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_refused_free_with_a_block_of_another_pool_changes_no_reference(order: tuple[int, ...]) -> None:
    mine, theirs = BlockPool(6, True, 2), BlockPool(4, True, 2)
    used = mine.get_new_blocks(2)
    (their_block,) = theirs.get_new_blocks(1)
    listed = [[used[0], their_block, mine.blocks[5]][i] for i in order] + [used[1]]
    before = snapshot(mine), snapshot(theirs)
    with pytest.raises(BlockNotInUseError):
        mine.free_blocks(listed)
    assert (snapshot(mine), snapshot(theirs)) == before


@pytest.mark.parametrize("holder", [False, True])
def test_object_posing_as_a_block_of_another_pool_is_refused(holder: bool) -> None:
    """Refused by this pool, or (naming a holder too) by the pool it claims; nothing changes."""
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    (own,) = mine.get_new_blocks(1)
    poser: Any = types.SimpleNamespace(pool=theirs, **({"_holder": theirs} if holder else {}))
    with pytest.raises(UnknownBlockError, match=r"^free: not a KV-cache block: "):
        mine.free_blocks([own, block, poser])
    assert block.ref_cnt == 1 and theirs.get_num_free_blocks() == 2
    assert own.ref_cnt == 1 and mine.get_num_free_blocks() == 2


def test_freeing_a_shared_block_of_another_pool_keeps_its_other_references() -> None:
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    theirs.touch([block, block])  # three references
    mine.free_blocks([block])
    assert block.ref_cnt == 2 and theirs.get_num_free_blocks() == 2
    mine.free_blocks([block, block])
    assert block.ref_cnt == 0 and theirs.get_num_free_blocks() == 3


def test_over_freeing_a_block_of_another_pool_is_refused_and_named() -> None:
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    with pytest.raises(ValueError, match=f"free block {block.block_id}: more releases"):
        mine.free_blocks([block, block])
    assert block.ref_cnt == 1


def test_block_of_no_pool_is_refused_and_named() -> None:
    pool = BlockPool(4, True, 2)
    stray = type(pool.blocks[1])(7)
    with pytest.raises(UnknownBlockError, match="belongs to no pool"):
        pool.free_blocks([stray])


# ---------------------------------------------------------------------------- touch


def test_touch_takes_an_idle_cached_block_out_of_the_middle_of_the_free_queue() -> None:
    pool = make_pool(6)
    a, b = cache_blocks(pool, make_request(TOKENS), 2)
    pool.free_blocks([a, b])
    assert free_ids(pool) == [3, 4, 5, 1, 2]
    pool.touch([a])
    assert a.ref_cnt == 1
    assert free_ids(pool) == [3, 4, 5, 2]
    assert pool.get_num_free_blocks() == 4


def test_touch_of_several_idle_blocks_counts_each_out_once() -> None:
    """Listed twice, an idle block leaves the queue once; the count stays an exact int."""
    pool = make_pool(6)
    blocks = pool.blocks
    pool.touch([blocks[2], blocks[4], blocks[2], pool.null_block, blocks[5]])
    assert [b.ref_cnt for b in blocks[1:]] == [0, 2, 0, 1, 1]
    assert free_ids(pool) == [1, 3]
    assert type(pool.get_num_free_blocks()) is int and pool.get_num_free_blocks() == 2
    assert free_queue_link_errors(pool.free_block_queue) == []


def test_touch_of_a_block_in_use_only_adds_a_reference() -> None:
    pool = make_pool(4)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    assert block.ref_cnt == 2
    assert free_ids(pool) == [2, 3]


def test_touch_of_the_null_block_is_legal_and_leaves_the_free_queue_alone() -> None:
    pool = make_pool(4)
    pool.touch([pool.null_block])
    assert pool.null_block.ref_cnt == 1
    assert free_ids(pool) == [1, 2, 3]


def test_touch_reports_each_access_to_metrics() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(4, metrics=metrics)
    block = pool.get_new_blocks(1)[0]
    metrics.log.clear()
    pool.touch([block, pool.null_block, block])
    assert metrics.log == [("accessed", 1), ("accessed", 0), ("accessed", 1)]


def test_touch_takes_any_iterable_of_blocks() -> None:
    metrics = MetricsRecorder()
    pool = BlockPool(6, True, 2, metrics_collector=metrics)
    b = pool.blocks
    pool.touch((b[2], b[3]))
    pool.touch(cast(Any, (x for x in [b[4], b[2]])))  # any iterable, not only sequences
    assert metrics.log == [("accessed", i) for i in (2, 3, 4, 2)]
    assert [b[i].ref_cnt for i in range(1, 6)] == [0, 2, 1, 1, 0]
    with pytest.raises(UnknownBlockError):
        pool.touch(cast(Any, (x for x in [b[5], b[1], BlockPool(3, True, 2).blocks[1]])))
    assert [x.block_id for x in pool.free_block_queue.get_all_free_blocks()] == [1, 5]
    assert b[1].ref_cnt == b[5].ref_cnt == 0 and metrics.log == [("accessed", i) for i in (2, 3, 4, 2)]


def test_refused_touch_relinks_the_free_queue_both_ways() -> None:
    pool = BlockPool(8, True, 2)
    stranger = BlockPool(4, True, 2).blocks[1]
    b = pool.blocks
    with pytest.raises(UnknownBlockError):
        pool.touch([b[3], b[5], b[4], stranger])
    assert free_queue_link_errors(pool.free_block_queue) == []
    pool.touch([b[4]])  # unlinking uses both neighbours' links
    pool.touch([b[6]])
    pool.touch([b[3]])
    assert [x.block_id for x in pool.free_block_queue.get_all_free_blocks()] == [1, 2, 5, 7]
    assert free_queue_link_errors(pool.free_block_queue) == []


def _links(pool: BlockPool) -> list[tuple[int, Any, Any]]:
    """Every block's ref count and free-queue neighbours, by id (a full picture of the queue)."""
    return [(b.ref_cnt, getattr(b.prev_free_block, "block_id", b.prev_free_block),
             getattr(b.next_free_block, "block_id", b.next_free_block)) for b in pool.blocks]


def test_touch_unlinks_an_idle_block_completely() -> None:
    """A touched idle block leaves the queue with both links None, as vLLM's remove() leaves it."""
    pool = BlockPool(6, True, 1)
    block = pool.blocks[3]
    pool.touch([block])
    assert block.prev_free_block is None and block.next_free_block is None
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [1, 2, 4, 5]


def test_refused_touch_undoes_by_what_it_unlinked_not_by_ref_counts() -> None:
    """A block the caller took out of the queue by hand (idle, yet held) is not relinked on undo."""
    pool = BlockPool(8, True, 1)
    loose = pool.blocks[4]
    pool.free_block_queue.remove(loose)
    before, free_before = _links(pool), pool.get_num_free_blocks()
    with pytest.raises(UnknownBlockError, match=r"^touch: "):
        pool.touch([pool.blocks[2], loose, pool.blocks[6], pool.blocks[2], KVCacheBlock(3)])
    assert _links(pool) == before and pool.get_num_free_blocks() == free_before
    assert [b.ref_cnt for b in pool.blocks] == [0] * 8
    assert free_queue_link_errors(pool.free_block_queue) == []


@pytest.mark.parametrize("cut", ["both", "prev", "next"])
def test_touch_refuses_an_idle_block_missing_from_the_queue_and_changes_nothing(cut: str) -> None:
    """An idle block not (fully) linked into the queue is refused by name; earlier blocks are undone."""
    pool = BlockPool(8, True, 1)
    held = pool.get_new_blocks(1)[0]
    loose = pool.blocks[5]
    if cut == "both":
        loose.prev_free_block = loose.next_free_block = None
    elif cut == "prev":
        loose.prev_free_block = None
    else:
        loose.next_free_block = None
    before, free_before = _links(pool), pool.get_num_free_blocks()
    with pytest.raises(UnknownBlockError, match=r"^touch: block 5 is not in the free queue$"):
        pool.touch([held, pool.blocks[2], pool.blocks[3], loose, pool.blocks[4]])
    assert _links(pool) == before and pool.get_num_free_blocks() == free_before


# --------------------------------------------------------------------- unpin_blocks


def test_unpin_blocks_releases_to_the_tail_and_registers_the_watcher() -> None:
    pool = make_pool(5)
    a, b = pool.get_new_blocks(2)
    watcher = RecordingWatcher()
    pool.unpin_blocks([b, a], watcher)
    assert a.ref_cnt == b.ref_cnt == 0
    assert free_ids(pool) == [3, 4, 2, 1]
    assert pool.get_num_free_blocks() == 4
    assert watcher.seen == []
    assert snapshot(pool)[2] == [(2, id(watcher)), (1, id(watcher))]


def test_unpin_blocks_of_a_shared_block_keeps_it_in_use_but_watched() -> None:
    pool = make_pool(4)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    pool.unpin_blocks([block], RecordingWatcher())
    assert block.ref_cnt == 1
    assert 1 not in free_ids(pool)
    assert snapshot(pool)[0].watched == (1,)


def test_watcher_fires_when_get_new_blocks_hands_the_block_out() -> None:
    pool = make_pool(3)
    a, b = pool.get_new_blocks(2)
    watcher = RecordingWatcher()
    pool.unpin_blocks([a], watcher)
    pool.free_blocks([b])  # b to the head, a stays at the tail
    pool.get_new_blocks(1)
    assert watcher.seen == []
    pool.get_new_blocks(1)
    assert watcher.seen == [1]
    assert snapshot(pool)[0].watched == ()


def test_unpinned_hashed_block_keeps_its_hash_and_watcher_and_can_be_hit() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = cache_blocks(pool, req, 1)[0]
    watcher = RecordingWatcher()
    pool.unpin_blocks([block], watcher)
    assert block.block_hash == key(req, 1)
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [block]
    pool.touch([block])
    assert block.ref_cnt == 1
    assert snapshot(pool)[0].watched == (1,)
    assert watcher.seen == []


def test_unpin_again_replaces_the_watcher() -> None:
    pool = make_pool(4)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    first, second = RecordingWatcher(), RecordingWatcher()
    pool.unpin_blocks([block], first)
    pool.unpin_blocks([block], second)
    pool.get_new_blocks(3)
    assert first.seen == [] and second.seen == [1]


# ----------------------------------------------------------------- is_block_writable


def test_is_block_writable_only_for_sole_owner_of_unhashed_real_block() -> None:
    pool = make_pool(6)
    fresh, shared, idle = pool.get_new_blocks(3)
    hashed = cache_blocks(pool, make_request(TOKENS), 1)[0]
    pool.touch([shared])
    pool.free_blocks([idle])
    assert pool.is_block_writable(fresh) is True
    assert pool.is_block_writable(shared) is False
    assert pool.is_block_writable(idle) is False
    assert pool.is_block_writable(hashed) is False
    assert pool.is_block_writable(pool.null_block) is False


# -------------------------------------------------------------- get_cached_block


def test_get_cached_block_returns_the_block_of_every_group_or_none_on_any_miss() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS)
    g0 = cache_blocks(pool, req, 1, group=0)[0]
    g3 = cache_blocks(pool, req, 1, group=3)[0]
    assert pool.get_cached_block(req.block_hashes[1], [0, 3]) == [g0, g3]
    assert pool.get_cached_block(req.block_hashes[1], [3]) == [g3]
    assert pool.get_cached_block(req.block_hashes[1], [0, 1]) is None
    assert pool.get_cached_block(req.block_hashes[3], [0]) is None
    assert pool.get_cached_block(req.block_hashes[1], []) == []
    # any iterable of ids, read once (the pool makes a list of what is not one)
    assert pool.get_cached_block(req.block_hashes[1], iter([3])) == [g3]
    assert pool.get_cached_block(req.block_hashes[1], (g for g in (0, 3))) == [g0, g3]


def test_get_cached_block_with_duplicates_returns_the_first_cached() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS)
    first = cache_blocks(pool, req, 1)[0]
    second = cache_blocks(pool, req, 1)[0]
    assert index_of(pool) == {key(req, 1): [first.block_id, second.block_id]}
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [first]
    other = cache_blocks(pool, req, 1, group=2)[0]  # several groups: the first of each too
    assert pool.get_cached_block(req.block_hashes[1], [0, 2]) == [first, other]
    assert pool.get_cached_block(req.block_hashes[1], [2, 0, 0]) == [other, first, first]


# ------------------------------------------------------------- cache_full_blocks


def test_cache_full_blocks_indexes_new_full_blocks_and_emits_one_stored_event() -> None:
    pool = make_pool(6, hbs=BS)
    req = make_request(TOKENS, hbs=BS)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    assert [b.block_hash for b in blocks] == [key(req, 0), key(req, 1), None]
    assert [b.block_hash_num_tokens for b in blocks] == [4, 8, None]
    assert index_of(pool) == {key(req, 0): [1], key(req, 1): [2]}
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[0]), ext(req.block_hashes[1])],
        token_ids=TOKENS[:8], extra_keys=[None, None])]


def test_cache_full_blocks_takes_any_sequence_of_blocks() -> None:
    """Blocks given as a tuple (any sequence: the pool takes its length first) work as a list."""
    pool = make_pool(6, hbs=BS)
    req = make_request(TOKENS, hbs=BS)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, tuple(blocks), 0, 2, BS, 0)
    assert index_of(pool) == {key(req, 0): [1], key(req, 1): [2]}


def test_cache_full_blocks_continuation_names_the_last_cached_block_as_parent() -> None:
    pool = make_pool(6, hbs=BS)
    req = make_request(TOKENS, hbs=BS)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    taken(pool)
    pool.cache_full_blocks(req, blocks, 1, 3, BS, 0)
    assert blocks[2].block_hash_num_tokens == 12
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[1]), ext(req.block_hashes[2])],
        parent_block_hash=ext(req.block_hashes[0]), token_ids=TOKENS[4:12],
        extra_keys=[None, None])]


def test_cache_full_blocks_with_nothing_new_changes_nothing() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    blocks = pool.get_new_blocks(2)
    before = snapshot(pool)
    pool.cache_full_blocks(req, blocks, 1, 1, BS, 0)
    assert snapshot(pool) == before


def test_cache_full_blocks_with_hash_block_size_below_block_size_uses_last_chunk_hash() -> None:
    pool = make_pool(6)  # hash_block_size 2, block_size 4
    req = make_request(TOKENS)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    assert [b.block_hash for b in blocks] == [key(req, 1), key(req, 3)]
    assert [b.block_hash_num_tokens for b in blocks] == [4, 8]
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[1]), ext(req.block_hashes[3])],
        token_ids=TOKENS[:8], extra_keys=[None, None])]


def test_cache_full_blocks_skips_null_and_masked_out_blocks() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS)
    a, b, c = pool.get_new_blocks(3)
    table = [pool.null_block, a, b, c]
    pool.cache_full_blocks(req, table, 0, 4, BS, 0, block_mask=[True, True, False, True])
    assert pool.null_block.block_hash is None
    assert [x.block_hash for x in (a, b, c)] == [key(req, 3), None, key(req, 7)]
    assert index_of(pool) == {key(req, 3): [1], key(req, 7): [3]}
    # token_ids cover the whole range; hashes and extra keys only the cached blocks
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[3]), ext(req.block_hashes[7])],
        token_ids=TOKENS[:16], extra_keys=[None, None])]


def test_cache_full_blocks_with_every_block_skipped_still_emits_an_empty_stored_event() -> None:
    # reference lines 303-344: the event is emitted whenever events are on
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_full_blocks(req, [pool.null_block, block], 0, 2, BS, 0, block_mask=[True, False])
    assert index_of(pool) == {}
    assert taken(pool) == [stored(token_ids=TOKENS[:8])]


def test_cache_full_blocks_event_carries_lora_salt_session_and_group() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS, lora_request=LoRARequest("adapter", 7, "/p"),
                       cache_salt="salt", session_id="sess")
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 5)
    assert get_group_id(blocks[0].block_hash or b"") == 5
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[1]), ext(req.block_hashes[3])],
        token_ids=TOKENS[:8], lora_id=7, lora_name="adapter",
        extra_keys=[("adapter", "salt"), ("adapter",)], group_idx=5, session_id="sess")]


def test_cache_full_blocks_promotes_a_partial_entry_of_the_same_block() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, block, 2, 0, BS)
    taken(pool)
    pool.cache_full_blocks(req, [block], 0, 1, BS, 0)
    assert block.block_hash == key(req, 1)
    assert block.block_hash_num_tokens == 4
    assert index_of(pool) == {key(req, 1): [1]}
    events = taken(pool)
    assert events[0] == removed(key(req, 0))
    assert events[1]["type"] == "BlockStored"


def test_cache_full_blocks_without_events_queues_nothing() -> None:
    pool = make_pool(4, events=False)
    cache_blocks(pool, make_request(TOKENS), 2)
    assert pool.kv_event_queue == []
    assert pool.take_events() == []


def test_cache_full_blocks_with_more_cached_than_full_is_a_no_op_as_in_vllm() -> None:
    # vLLM's sparse-attention coordinator may report fewer ready blocks than are cached.
    pool = BlockPool(6, True, 4, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    before = snapshot(pool)
    pool.cache_full_blocks(Request("r", list(range(8))), blocks, 2, 1, 4, 0)
    assert snapshot(pool) == before


# -------------------------------------------------------- emit_cached_block_events


def test_emit_cached_block_events_announces_a_hit_prefix_without_changing_the_pool() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS, session_id="s")
    before = snapshot(pool)[0]
    pool.emit_cached_block_events(req, 2, BS, 1)
    assert snapshot(pool)[0] == before
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[1]), ext(req.block_hashes[3])],
        token_ids=TOKENS[:8], extra_keys=[None, None], group_idx=1, session_id="s")]


def test_emit_cached_block_events_is_silent_for_zero_blocks_or_disabled_events() -> None:
    req = make_request(TOKENS)
    on, off = make_pool(4), make_pool(4, events=False)
    on.emit_cached_block_events(req, 0, BS, 0)
    off.emit_cached_block_events(req, 2, BS, 0)
    assert on.kv_event_queue == [] and off.kv_event_queue == []


# ------------------------------------------------------------- cache_partial_block


def test_cache_partial_block_on_unhashed_block_becomes_its_primary_key() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    got = pool.cache_partial_block(req, block, 2, 0, BS)
    assert got == key(req, 0)
    assert block.block_hash == key(req, 0)
    assert block.block_hash_num_tokens == 2
    assert index_of(pool) == {key(req, 0): [1]}
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[0])], token_ids=TOKENS[:2], block_size=HBS,
        extra_keys=[None])]


def test_cache_partial_block_event_names_the_previous_chunk_as_parent() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, block, 6, 2, BS)
    assert block.block_hash == key(req, 2, group=2)
    assert taken(pool) == [stored(
        block_hashes=[ext(req.block_hashes[2])], parent_block_hash=ext(req.block_hashes[1]),
        token_ids=TOKENS[4:6], block_size=HBS, extra_keys=[None], group_idx=2)]


def test_cache_partial_block_that_grew_replaces_the_shorter_entry() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, block, 2, 0, 8)
    taken(pool)
    pool.cache_partial_block(req, block, 4, 0, 8)
    assert block.block_hash == key(req, 1)
    assert block.block_hash_num_tokens == 4
    assert index_of(pool) == {key(req, 1): [1]}
    assert [e["type"] for e in taken(pool)] == ["BlockRemoved", "BlockStored"]


def test_cache_partial_block_on_a_longer_cached_block_adds_a_secondary_key() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = cache_blocks(pool, req, 1)[0]
    taken(pool)
    pool.cache_partial_block(req, block, 2, 0, BS)
    assert block.block_hash == key(req, 1)
    assert block.block_hash_num_tokens == 4
    assert list(pool.cached_block_hashes_by_block[1]) == [key(req, 0)]
    assert index_of(pool) == {key(req, 1): [1], key(req, 0): [1]}
    assert [e["type"] for e in taken(pool)] == ["BlockStored"]


def test_cache_partial_block_already_cached_returns_key_without_event_or_change() -> None:
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, block, 2, 0, BS)
    taken(pool)
    before = snapshot(pool)
    assert pool.cache_partial_block(req, block, 2, 0, BS) == key(req, 0)
    assert snapshot(pool) == before


def test_cache_partial_block_replace_existing_hashes_drops_every_entry_first() -> None:
    pool = make_pool(4)
    req, other = make_request(TOKENS), make_request([7] * 16, name="o")
    block = cache_blocks(pool, req, 1)[0]
    pool.cache_partial_block(req, block, 2, 0, BS)
    taken(pool)
    got = pool.cache_partial_block(other, block, 4, 0, BS, replace_existing_hashes=True)
    assert got == key(other, 1)
    assert block.block_hash == key(other, 1) and block.block_hash_num_tokens == 4
    assert pool.cached_block_hashes_by_block == {}
    assert index_of(pool) == {key(other, 1): [1]}
    events = taken(pool)
    assert events[:2] == [removed(key(req, 1)), removed(key(req, 0))]
    assert events[2]["type"] == "BlockStored"


def test_cache_partial_block_of_the_null_block_returns_none_and_changes_nothing() -> None:
    pool = make_pool(4)
    before = snapshot(pool)
    assert pool.cache_partial_block(make_request(TOKENS), pool.null_block, 2, 0, BS) is None
    assert snapshot(pool) == before


@pytest.mark.parametrize("group", [0, 1, 63, 64, 65, 1000, 2**31, 2**32 - 1, False, True])
def test_any_32_bit_group_id_keys_like_the_model(group: int) -> None:
    req = make_request(range(8))
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    (blk,) = pool.get_new_blocks(1)
    hashes = resolve_block_hashes(req.block_hashes, 2, 4)
    pool.cache_full_blocks(req, [blk], 0, 1, 4, group)
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2, events_on=True), 1)
    state, _ = ACTIONS["cache_full_blocks"](state, req, [1], 0, 1, 4, group)
    primary = state.primary[1]
    assert primary is not None
    assert blk.block_hash == make_block_hash_with_group_id(hashes[0], group)
    assert primary.key == (hashes[0], group)
    assert pool.get_cached_block(hashes[0], [group]) == [blk]
    assert QUERIES["get_cached_block"](state, hashes[0], [group]) == [1]
    key = pool.cache_partial_block(req, blk, 6, group, 8)
    state, model_key = ACTIONS["cache_partial_block"](state, req, 1, 6, group, 8)
    assert key == make_block_hash_with_group_id(req.block_hashes[2], group) == blk.block_hash
    assert model_key == (req.block_hashes[2], group)
    # stored, removed (the block grew), stored
    assert [cast(Any, e).group_idx for e in pool.take_events()] == [group, group, group]


# --------------------------------------------------------------- move_block_hashes


def test_move_block_hashes_repoints_every_entry_without_events() -> None:
    pool = make_pool(5)
    req = make_request(TOKENS)
    src = cache_blocks(pool, req, 1)[0]
    pool.cache_partial_block(req, src, 2, 0, BS)
    dst = pool.get_new_blocks(1)[0]
    taken(pool)
    pool.move_block_hashes(src, dst)
    assert src.block_hash is None and src.block_hash_num_tokens is None
    assert dst.block_hash == key(req, 1) and dst.block_hash_num_tokens == 4
    assert list(pool.cached_block_hashes_by_block[dst.block_id]) == [key(req, 0)]
    assert src.block_id not in pool.cached_block_hashes_by_block
    assert index_of(pool) == {key(req, 1): [2], key(req, 0): [2]}
    assert pool.kv_event_queue == []


def test_move_block_hashes_of_an_unhashed_block_is_a_no_op_even_onto_null() -> None:
    pool = make_pool(4)
    src, dst = pool.get_new_blocks(2)
    before = snapshot(pool)
    pool.move_block_hashes(src, dst)
    pool.move_block_hashes(src, pool.null_block)
    assert snapshot(pool) == before


# -------------------------------------------------------------------- evict_blocks


def test_evict_blocks_drops_entries_but_keeps_ref_counts_and_queue_places() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS)
    a, b = cache_blocks(pool, req, 2)
    pool.cache_partial_block(req, a, 2, 0, BS)
    pool.free_blocks([b])
    taken(pool)
    queue = free_ids(pool)
    pool.evict_blocks({a.block_id, b.block_id})
    assert a.block_hash is None and b.block_hash is None
    assert index_of(pool) == {} and pool.cached_block_hashes_by_block == {}
    assert (a.ref_cnt, b.ref_cnt) == (1, 0)
    assert free_ids(pool) == queue
    assert taken(pool) == [removed(key(req, 1)), removed(key(req, 0)), removed(key(req, 3))]


def test_secondary_keys_are_removed_in_insertion_order_after_the_primary() -> None:
    # model decision: secondary keys keep insertion order (the reference uses a set)
    pool = make_pool(4)
    req = make_request(TOKENS)
    block = pool.get_new_blocks(1)[0]
    pool.cache_full_blocks(req, [block], 0, 1, 8, 0)
    pool.cache_partial_block(req, block, 4, 0, 8)
    pool.cache_partial_block(req, block, 2, 0, 8)
    assert list(pool.cached_block_hashes_by_block[1]) == [key(req, 1), key(req, 0)]
    taken(pool)
    pool.evict_blocks({1})
    assert taken(pool) == [removed(key(req, 3)), removed(key(req, 1)), removed(key(req, 0))]


def test_evict_blocks_of_one_duplicate_leaves_the_other_indexed() -> None:
    pool = make_pool(6)
    req = make_request(TOKENS)
    first = cache_blocks(pool, req, 1)[0]
    second = cache_blocks(pool, req, 1)[0]
    pool.evict_blocks({first.block_id})
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [second]


def test_evict_blocks_reports_every_id_to_metrics_hashed_or_not() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(6, metrics=metrics)
    cache_blocks(pool, make_request(TOKENS), 1)
    metrics.log.clear()
    pool.evict_blocks({0, 1, 4})
    assert metrics.log == [("evicted", 0), ("evicted", 1), ("evicted", 4)]


# --------------------------------------------------------------- reset_prefix_cache


def test_reset_prefix_cache_is_refused_while_a_block_is_in_use() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(4, metrics=metrics)
    cache_blocks(pool, make_request(TOKENS), 1)
    metrics.log.clear()
    before = snapshot(pool)
    assert pool.reset_prefix_cache() is False
    assert snapshot(pool) == before
    assert metrics.log == []


def test_reset_prefix_cache_forgets_every_hash_fires_watchers_and_emits_cleared() -> None:
    metrics = MetricsRecorder()
    pool = make_pool(5, metrics=metrics)
    req = make_request(TOKENS)
    a, b = cache_blocks(pool, req, 2)
    pool.cache_partial_block(req, a, 2, 0, BS)
    watcher = RecordingWatcher()
    pool.unpin_blocks([b], watcher)
    pool.free_blocks([a])
    pool.touch([pool.null_block])  # the null block never counts as in use
    taken(pool)
    queue = free_ids(pool)
    metrics.log.clear()
    assert pool.reset_prefix_cache() is True
    assert all(x.block_hash is None and x.block_hash_num_tokens is None for x in pool.blocks)
    assert len(pool.cached_block_hash_to_block) == 0
    assert pool.cached_block_hashes_by_block == {}
    assert snapshot(pool)[2] == []
    assert watcher.seen == [2]
    assert metrics.log == [("reset", None)]
    assert free_ids(pool) == queue
    assert pool.take_events() == [AllBlocksCleared()]


# ------------------------------------------------------- queries and take_events


def test_get_usage_is_the_fraction_of_real_blocks_in_use() -> None:
    pool = make_pool(5)
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)
    pool.get_new_blocks(3)
    assert pool.get_usage() == pytest.approx(1.0)


def test_get_usage_of_a_pool_with_only_the_null_block_is_zero() -> None:
    pool = make_pool(1)
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 0


def test_take_events_hands_over_pending_events_once() -> None:
    pool = make_pool(4)
    cache_blocks(pool, make_request(TOKENS), 1)
    events = pool.take_events()
    assert [type(e) for e in events] == [BlockStored]
    assert pool.kv_event_queue == []
    assert pool.take_events() == []


def test_take_events_on_a_pool_without_events_returns_empty() -> None:
    pool = make_pool(4, events=False)
    pool.reset_prefix_cache()
    assert pool.take_events() == []
