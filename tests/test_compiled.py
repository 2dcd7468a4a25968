"""The two builds of kvpool.impl: the same behaviour, plain Python or compiled by mypyc.

Every test here runs on whichever build is loaded: ``.ci/run`` runs this file (and
the lockstep, the misuse refusals, the conformance campaign and the vLLM drop-in
tests) once more on the compiled build, with ``KVPOOL_EXPECT_COMPILED=1`` so that
a plain build loaded by mistake fails instead of passing unseen.
"""

from __future__ import annotations

import copy
import os
import pickle
from types import FunctionType

import pytest

import kvpool.impl
from kvpool.bugs.pools import StoredEventDropsLora, patches_take_effect
from kvpool.impl import BlockPool, KVCacheBlock, Request, get_request_block_hasher
from kvpool.impl.block import KVCacheBlock as BlockOfItsModule


def test_compiled_says_how_the_pool_was_loaded() -> None:
    import kvpool.impl.pool as pool_module

    compiled_file = not (pool_module.__file__ or "").endswith(".py")
    assert kvpool.impl.COMPILED is compiled_file
    expected = os.environ.get("KVPOOL_EXPECT_COMPILED")
    if expected is not None:
        build = "compiled" if expected == "1" else "plain"
        assert kvpool.impl.COMPILED is (expected == "1"), f"expected the {build} build"


def _pool_with_history() -> tuple[BlockPool, Request, list[KVCacheBlock]]:
    pool = BlockPool(8, True, 4, enable_kv_cache_events=True)
    req = Request("r", list(range(12)), block_hasher=get_request_block_hasher(4))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, 4, 0)
    pool.free_blocks(list(reversed(blocks[1:])))
    return pool, req, blocks


def test_blocks_take_vllms_attribute_access() -> None:
    """vLLM's own code reads and sets these fields on the pool's blocks."""
    pool, _req, blocks = _pool_with_history()
    head = pool.free_block_queue.fake_free_list_head
    first = head.next_free_block
    assert first is not None and first.prev_free_block is head
    assert blocks[0].block_hash is not None and blocks[0].ref_cnt == 1
    blocks[0].ref_cnt += 1
    assert blocks[0].ref_cnt == 2
    block = KVCacheBlock(7)
    block.prev_free_block = block.next_free_block = blocks[0]
    assert (block.block_id, block.ref_cnt, block.block_hash, block.next_free_block) == (7, 0, None, blocks[0])
    assert type(block) is BlockOfItsModule


def test_a_pool_pickles_and_deep_copies_with_its_links_index_and_events() -> None:
    pool, req, _blocks = _pool_with_history()
    for twin in (pickle.loads(pickle.dumps(pool)), copy.deepcopy(pool)):
        assert [b.block_id for b in twin.free_block_queue.get_all_free_blocks()] == \
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        found = twin.get_cached_block(req.block_hashes[0], [0])
        assert found is not None and found[0] is twin.blocks[1] and found[0].ref_cnt == 1
        assert twin.take_events() == pool.kv_event_queue
        twin.touch([twin.blocks[3]])  # the copy is a pool of its own: its blocks are its own
        assert twin.blocks[3].ref_cnt == 1 and pool.blocks[3].ref_cnt == 0


def test_a_python_subclass_overrides_what_the_pool_calls_on_itself() -> None:
    dropped: list[int] = []

    class Watching(BlockPool):
        def _drop_hashes(self, blocks: list[KVCacheBlock]) -> list[bytes]:
            dropped.extend(block.block_id for block in blocks if block.block_hash is not None)
            return super()._drop_hashes(blocks)

    pool = Watching(4, True, 4)
    req = Request("r", list(range(4)), block_hasher=get_request_block_hasher(4))
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, [block], 0, 1, 4, 0)
    pool.free_blocks([block])
    pool.get_new_blocks(3)  # the cached block is reused last, and its hash dropped then
    assert dropped == [block.block_id]


def test_seeded_bugs_of_shared_code_take_effect_only_on_the_plain_build() -> None:
    assert patches_take_effect(StoredEventDropsLora) is not kvpool.impl.COMPILED
    assert patches_take_effect(BlockPool)


@pytest.mark.parametrize("call", [
    lambda p: p.get_new_blocks("2"),
    lambda p: p.touch([object()]),
    lambda p: p.free_blocks([3]),
    lambda p: p.get_cached_block(b"h", [1.0]),
    lambda p: p.is_block_writable(KVCacheBlock(1)),
])
def test_wrongly_typed_arguments_get_the_pools_typed_refusal(call: object) -> None:
    """Compiled entry points check annotated types: the pool's checks must come first."""
    pool = BlockPool(4, True, 4)
    with pytest.raises(kvpool.impl.BlockPoolError):
        call(pool)  # type: ignore[operator]


def test_event_classes_are_built_by_compiled_code_in_the_compiled_build() -> None:
    """One event per evicted key: compiled, the classes' ``__init__`` is compiled too (the
    one ``dataclass`` generates would stay Python); interpreted, it is a Python function."""
    from kvpool.impl.events import BlockRemoved, BlockStored

    for cls in (BlockRemoved, BlockStored):
        assert isinstance(cls.__init__, FunctionType) is not kvpool.impl.COMPILED
