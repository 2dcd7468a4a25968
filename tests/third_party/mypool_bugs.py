"""Broken variants of ``mypool.BlockPool``: one classic block-pool mistake each.

Every variant is a legal-call bug: it corrupts the pool, or what it tells
others, on calls vLLM's own pool gets right, and a careful oracle must catch
it.  Each docstring tells where the mistake comes from and what it breaks.
Standard library only, like ``mypool``, which is loaded from beside this file
when it has not been imported yet.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any


def _sibling(name: str) -> Any:
    """The module ``name`` from this directory (tests/third_party is no package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


if TYPE_CHECKING:
    from mypool import Block, BlockPool, BlockStored
else:
    BlockPool, Block = _sibling("mypool").BlockPool, _sibling("mypool").Block


class QueuesPerListing(BlockPool):
    """(a) ``free_blocks`` queues a block once per listing, not once per release.

    The tempting two-pass free (drop every reference, then queue every listed
    block whose count is zero) was vLLM's own code for a long time: a block a
    request holds twice (a prefix hit on its own block) and lists twice is
    queued twice, so vLLM's linked list held it twice and handed it to two
    requests.  In this OrderedDict queue the second push cannot duplicate it;
    it moves it instead, so the block lands at the wrong place in eviction
    order whenever another block sits between its two listings.
    """

    def free_blocks(self, ordered_blocks: Iterable[Block]) -> None:
        mine, others = self._split_by_pool(ordered_blocks)
        for block in mine:
            block.ref_cnt -= 1
        idle = [b for b in mine if b.ref_cnt == 0 and not b.is_null]
        self.free_block_queue.push_front([b for b in idle if self._goes_to_head(b)])
        self.free_block_queue.push_back([b for b in idle if not self._goes_to_head(b)])
        for pool, theirs in others.items():
            pool.free_blocks(theirs)


class CachedFreedToHead(BlockPool):
    """(b) Cached blocks are freed to the head of the free queue, not the tail.

    Written by someone who kept "freed blocks are reused first, for
    locality" and forgot the prefix cache: a finished request's cached
    prefix is the first thing the next allocation evicts, so the cache
    behaves MRU-evicting and a system prompt shared by every request is
    recomputed again and again.  Nothing crashes; only the order shows it.
    """

    def _goes_to_head(self, block: Block) -> bool:
        return True


class TouchLeavesQueued(BlockPool):
    """(c) ``touch`` takes a reference but leaves an idle block in the free queue.

    The hit path only bumps the count, as if every hit block were in use.
    A hit on an idle cached block then leaves it both referenced and free:
    the free count is one too high and the next allocation may hand the
    block, KV and all, to a second request that overwrites it under the
    first.
    """

    def touch(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            block.ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_accessed(block)


class ForgetsLazyEviction(BlockPool):
    """(d) ``get_new_blocks`` hands out a cached block without dropping its keys.

    Keys are dropped lazily, when a block is reused, not when it is freed;
    a pool that forgets that step leaves the index pointing at a block that
    now holds another request's KV: a later prefix hit serves wrong tokens,
    and event consumers never hear the ``BlockRemoved``.
    """

    def get_new_blocks(self, num_blocks: int) -> list[Block]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        blocks = self.free_block_queue.take(num_blocks)
        self._notify_reuse(blocks)
        for block in blocks:
            if self.enable_caching and self.metrics_collector:
                self.metrics_collector.on_block_evicted(block)
            block.ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated(block)
        return blocks


class StoredWithoutLoraId(BlockPool):
    """(e) ``BlockStored`` events leave out the LoRA id.

    vLLM deprecated ``lora_id`` in favour of ``lora_name`` but still fills
    it; a pool written against the new field alone sends ``None``, and a
    router that still keys on the id files LoRA blocks as base-model blocks.
    """

    def _stored(self, *args: Any, **kwargs: Any) -> BlockStored:
        event = super()._stored(*args, **kwargs)
        event.lora_id = None
        return event


class EvictKeepsSecondaryKeys(BlockPool):
    """(f) ``evict_blocks`` removes a block's primary key but not its partial-prefix keys.

    Partial entries came later than full-block keys, and an eviction path
    written for one key per block still drops only ``block_hash``: the
    secondary keys stay in the index, so a hit on a partial prefix finds
    an evicted block (whose KV the connector reported gone), and their
    ``BlockRemoved`` events are missing until the block is reused.
    """

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            block = self.blocks[block_id]
            if self.metrics_collector:
                self.metrics_collector.on_block_evicted(block)
            key = block.block_hash
            if key is not None:
                block.block_hash = block.block_hash_num_tokens = None
                if self._unindex(key, block):
                    self._removed([key])
