"""The block (``kvpool.impl.block``): ``KVCacheBlock``'s fields, its hash, its repr, identity.

Reference: vLLM 0.31.0 ``kv_cache_utils.py`` (``vllm_kv_cache_utils.txt``).
"""



import pytest
from impl_helpers import (
    make_pool,
)

from kvpool.impl import (
    BlockHashConflictError,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
)

# -------------------------------------------------------------------- KVCacheBlock


def test_kv_cache_block_defaults() -> None:
    block = KVCacheBlock(3)
    assert (block.block_id, block.ref_cnt, block.pool, block.is_null) == (3, 0, None, False)
    assert block.block_hash is None and block.block_hash_num_tokens is None
    assert block.prev_free_block is None and block.next_free_block is None
    pool = make_pool(2)
    assert KVCacheBlock(7, 2, pool=pool).pool is pool


def test_kv_cache_block_set_and_reset_hash() -> None:
    block = KVCacheBlock(1)
    block.set_block_hash(b"k" * 36, num_tokens=8)
    assert block.block_hash == b"k" * 36 and block.block_hash_num_tokens == 8
    with pytest.raises(BlockHashConflictError):
        block.set_block_hash(b"j" * 36)
    assert block.block_hash == b"k" * 36
    block.reset_hash()
    assert block.block_hash is None and block.block_hash_num_tokens is None
    block.set_block_hash(b"j" * 36)
    assert block.block_hash_num_tokens is None


def test_kv_cache_block_repr_names_neighbours_by_id() -> None:
    blocks = [KVCacheBlock(i) for i in range(3)]
    FreeKVCacheBlockQueue(blocks)
    assert repr(blocks[1]) == (
        "KVCacheBlock(block_id=1, ref_cnt=0, _block_hash=None, _block_hash_num_tokens=None, "
        "prev_free_block=0, next_free_block=2)")


def test_kv_cache_block_compares_and_hashes_by_identity() -> None:
    # A documented difference: vLLM's dataclass compares fields and is unhashable.
    a, b = KVCacheBlock(3), KVCacheBlock(3)
    assert a != b and a == a and len({a, b}) == 2


def test_kv_cache_block_takes_the_reference_dataclass_fields() -> None:
    head = KVCacheBlock(-1)
    blk = KVCacheBlock(4, 2, b"k", 8, head, None, True, pool=None)
    assert (blk.block_id, blk.ref_cnt, blk.block_hash, blk.block_hash_num_tokens) == (4, 2, b"k", 8)
    assert blk.prev_free_block is head and blk.is_null


def test_block_constructor_keeps_vllms_fields() -> None:
    prev, nxt = KVCacheBlock(1), KVCacheBlock(3)
    block = KVCacheBlock(2, 5, b"key", 8, prev, nxt, True)
    assert (block.block_id, block.ref_cnt, block.block_hash, block.block_hash_num_tokens) == (2, 5, b"key", 8)
    assert block.prev_free_block is prev and block.next_free_block is nxt and block.is_null is True
    assert block.pool is None
    assert repr(block) == ("KVCacheBlock(block_id=2, ref_cnt=5, _block_hash=b'key', "
                           "_block_hash_num_tokens=8, prev_free_block=1, next_free_block=3)")


def test_block_hash_conflict_names_the_block() -> None:
    pool = BlockPool(4, True, 2)
    block = pool.blocks[2]
    block.set_block_hash(b"k" * 8, 2)
    with pytest.raises(BlockHashConflictError, match="block 2 "):
        block.set_block_hash(b"j" * 8, 4)
    assert block.block_hash == b"k" * 8 and block.block_hash_num_tokens == 2
