"""The free queue (``kvpool.impl.free_queue``): ``FreeKVCacheBlockQueue``'s order, links and holders.

Reference: vLLM 0.31.0 ``kv_cache_utils.py`` (``vllm_kv_cache_utils.txt``).
"""



import pytest
from impl_helpers import (
    ids,
    make_pool,
)

from kvpool.impl import (
    BlockPool,
    BlockPoolError,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    NotEnoughFreeBlocksError,
    UnknownBlockError,
)
from kvpool.oracle.core.observe import free_queue_link_errors

# ---------------------------------------------------------- FreeKVCacheBlockQueue


def make_queue(n: int) -> tuple[FreeKVCacheBlockQueue, list[KVCacheBlock]]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return FreeKVCacheBlockQueue(blocks), blocks


def queue_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return ids(queue.get_all_free_blocks())


def assert_links_consistent(queue: FreeKVCacheBlockQueue) -> None:
    """Forward and backward walks agree and match the count."""
    assert free_queue_link_errors(queue) == []


def test_queue_starts_with_blocks_in_given_order() -> None:
    queue, _ = make_queue(4)
    assert queue_ids(queue) == [0, 1, 2, 3]
    assert queue.num_free_blocks == 4
    assert_links_consistent(queue)


def test_empty_queue_links_head_to_tail() -> None:
    queue, _ = make_queue(0)
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    assert queue.get_all_free_blocks() == []
    assert queue.num_free_blocks == 0


def test_queue_popleft_takes_the_head_and_unlinks_it() -> None:
    queue, blocks = make_queue(3)
    assert queue.popleft() is blocks[0]
    assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None
    assert queue_ids(queue) == [1, 2]
    assert_links_consistent(queue)


def test_queue_popleft_on_empty_raises_value_error() -> None:
    queue, _ = make_queue(0)
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()


def test_queue_popleft_n_takes_the_first_n_in_order() -> None:
    queue, blocks = make_queue(5)
    assert queue.popleft_n(0) == []
    assert queue.popleft_n(3) == blocks[:3]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks[:3])
    assert queue_ids(queue) == [3, 4]
    assert_links_consistent(queue)
    assert queue.popleft_n(2) == blocks[3:]
    assert_links_consistent(queue)


def test_queue_popleft_n_beyond_the_count_is_refused() -> None:
    queue, _ = make_queue(2)
    with pytest.raises(NotEnoughFreeBlocksError):
        queue.popleft_n(3)
    assert queue_ids(queue) == [0, 1]


def test_queue_remove_from_the_middle_relinks_neighbours() -> None:
    queue, blocks = make_queue(5)
    queue.remove(blocks[2])
    assert blocks[1].next_free_block is blocks[3]
    assert blocks[3].prev_free_block is blocks[1]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    assert queue_ids(queue) == [0, 1, 3, 4]
    assert_links_consistent(queue)


def test_queue_remove_of_a_block_not_in_it_is_refused() -> None:
    # The reference raises RuntimeError here (kv_cache_utils line 381); kvpool a typed error.
    queue, blocks = make_queue(2)
    queue.remove(blocks[0])
    with pytest.raises(BlockPoolError):
        queue.remove(blocks[0])
    assert queue_ids(queue) == [1]


def test_queue_append_append_n_and_prepend_n_keep_the_given_order() -> None:
    queue, blocks = make_queue(6)
    queue.popleft_n(6)
    queue.append(blocks[2])
    queue.append_n([blocks[4], blocks[0]])
    queue.prepend_n([blocks[5], blocks[1]])
    queue.append_n([])
    queue.prepend_n([])
    assert queue_ids(queue) == [5, 1, 2, 4, 0]
    assert_links_consistent(queue)


def test_every_queue_operation_keeps_the_holders_in_step() -> None:
    """A block names the queue as holder exactly while linked, and its pool throughout."""
    pool = make_pool(8)
    queue, blocks = pool.free_block_queue, pool.blocks

    def check() -> None:
        linked = set(queue_ids(queue))
        assert [b.block_id for b in blocks if b._holder is queue] == sorted(linked)
        assert all(b._holder is pool for b in blocks if b.block_id not in linked)
        assert all(b.pool is pool for b in blocks)
        assert free_queue_link_errors(queue) == []

    check()
    steps = [
        lambda: queue.popleft(),
        lambda: queue.popleft_n(2),
        lambda: queue.remove(blocks[6]),
        lambda: queue.append(blocks[1]),
        lambda: queue.append_n([blocks[6], blocks[2]]),
        lambda: queue.prepend_n([blocks[3]]),
        lambda: pool.touch([blocks[5], blocks[7]]),
        lambda: pool.free_blocks([blocks[7], blocks[5]]),
    ]
    for step in steps:
        step()
        check()


def test_a_wrong_holder_is_reported_by_the_link_check() -> None:
    pool = make_pool(4)
    pool.blocks[2]._holder = pool  # linked, but claims to be held by the pool
    assert free_queue_link_errors(pool.free_block_queue) == ["blocks [2] name the wrong holder"]
    pool.blocks[2]._holder = pool.free_block_queue
    pool.blocks[0]._holder = pool.free_block_queue  # the null block, unlinked, claims the queue
    assert free_queue_link_errors(pool.free_block_queue) == ["blocks [0] name the wrong holder"]


def test_a_standalone_queue_hands_blocks_to_no_pool() -> None:
    queue, blocks = make_queue(3)
    assert all(b._holder is queue and b.pool is None for b in blocks)
    queue.popleft()
    assert blocks[0]._holder is None and blocks[0].pool is None


def test_queue_iter_blocks_after_walks_from_a_cursor_to_the_tail() -> None:
    queue, blocks = make_queue(4)
    assert ids(list(queue.iter_blocks_after(None))) == [0, 1, 2, 3]
    assert ids(list(queue.iter_blocks_after(blocks[1]))) == [2, 3]
    assert list(queue.iter_blocks_after(blocks[3])) == []


def test_free_queue_sentinels_are_block_minus_one_as_in_vllm() -> None:
    pool = BlockPool(4, True, 2)
    queue = pool.free_block_queue
    assert queue.fake_free_list_head.block_id == queue.fake_free_list_tail.block_id == -1
    assert "prev_free_block=-1" in repr(pool.blocks[1]) and "next_free_block=-1" in repr(pool.blocks[3])


def test_removing_a_sentinel_from_the_free_queue_is_refused() -> None:
    pool = BlockPool(4, True, 2)
    queue = pool.free_block_queue
    for sentinel in (queue.fake_free_list_head, queue.fake_free_list_tail):
        with pytest.raises(UnknownBlockError):
            queue.remove(sentinel)
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 2, 3]
