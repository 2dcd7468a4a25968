"""The prefix-cache index (``kvpool.impl.hash_index``): ``BlockHashToBlockMap``, one key to many blocks.

Reference: vLLM 0.31.0 ``block_pool.py`` (``vllm_block_pool.txt``).
"""




import pytest

from kvpool.impl import (
    BlockHashToBlockMap,
    KVCacheBlock,
)
from kvpool.impl.hash_index import earliest

# ------------------------------------------------------------- BlockHashToBlockMap


def test_hash_map_single_block_entry() -> None:
    index = BlockHashToBlockMap()
    block = KVCacheBlock(4)
    assert index.get_one_block(b"k") is None
    assert not index.contain(b"k", 4)
    index.insert(b"k", block)
    assert index.get_one_block(b"k") is block
    assert index.contain(b"k", 4) and not index.contain(b"k", 5)
    assert len(index) == 1


def _two_blocks_under_one_key() -> tuple[BlockHashToBlockMap, KVCacheBlock, KVCacheBlock]:
    """An index holding blocks 4 then 2 under key ``k``."""
    index = BlockHashToBlockMap()
    first, second = KVCacheBlock(4), KVCacheBlock(2)
    index.insert(b"k", first)
    index.insert(b"k", second)
    return index, first, second


def test_hash_map_several_blocks_under_one_key_return_the_first() -> None:
    index, first, _ = _two_blocks_under_one_key()
    assert index.get_one_block(b"k") is first
    assert index.contain(b"k", 2) and index.contain(b"k", 4)
    assert len(index) == 1


def test_hash_map_pop_removes_only_the_matching_block() -> None:
    index, first, second = _two_blocks_under_one_key()
    assert index.pop(b"k", 4) is first
    assert index.get_one_block(b"k") is second
    assert index.pop(b"k", 2) is second
    assert len(index) == 0
    assert index.pop(b"k", 2) is None


def test_hash_map_pop_of_a_non_matching_id_keeps_the_entry() -> None:
    index = BlockHashToBlockMap()
    single, a, b = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    index.insert(b"one", single)
    index.insert(b"two", a)
    index.insert(b"two", b)
    assert index.pop(b"one", 9) is None
    assert index.pop(b"two", 9) is None
    assert index.get_one_block(b"one") is single
    assert index.contain(b"two", 2) and index.contain(b"two", 3)
    assert len(index) == 2


def test_hash_map_len_counts_keys_not_blocks() -> None:
    index = BlockHashToBlockMap()
    for i, k in enumerate([b"a", b"b", b"a"]):
        index.insert(k, KVCacheBlock(i))
    assert len(index) == 2


def test_an_empty_entry_is_named_not_returned() -> None:
    """The index never keeps an empty entry; were one ever read, it is a named error, not None."""
    with pytest.raises(LookupError, match=r"^an empty index entry$"):
        earliest({})
