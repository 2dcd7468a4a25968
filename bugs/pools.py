"""Seeded bugs as broken pools: the lockstep against the model must catch each.

Each class is kvpool's pool with one classic mistake, in the shape real
block managers have made it.  Point ``kvpool conform --impl
kvpool.bugs.pools:NAME`` at one to see its divergence.  The mutants of the
pool's event and hashing code (:func:`mutant`) change one function of
``kvpool.impl`` while the pool runs: code that the model used to share with
the pool, where a differential check saw nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import kvpool.impl
from kvpool.impl import BlockPool, NotEnoughFreeBlocksError, UnknownBlockError
from kvpool.impl.block import KVCacheBlock
from kvpool.model import POOL_OPERATIONS

from .actions import patched

OPERATIONS: tuple[str, ...] = POOL_OPERATIONS
"""The pool's operations, the private ones vLLM's engine calls included (as the model declares
them): a mutant is active while any of them runs."""


def _queue_blocks(pool: BlockPool) -> list[KVCacheBlock]:
    return pool.free_block_queue.get_all_free_blocks()


def _null_block(pool: BlockPool) -> object:
    return pool.null_block


def _wrapping(name: str, story: str, methods: Iterable[str],
              context: Callable[[BlockPool], contextlib.AbstractContextManager[Any]],
              **attrs: Any) -> type[BlockPool]:
    """kvpool's pool with each of ``methods`` run inside ``context(pool)``."""

    def wrap(op: str) -> Callable[..., Any]:
        method = getattr(BlockPool, op)

        @functools.wraps(method)
        def run(self: BlockPool, *args: Any, **kwargs: Any) -> Any:
            with context(self):
                return method(self, *args, **kwargs)

        return run

    namespace: dict[str, Any] = {op: wrap(op) for op in methods}
    namespace.update(__doc__=story, __module__=__name__, __qualname__=name, **attrs)
    return type(name, (BlockPool,), namespace)


def flagged(name: str, story: str, methods: Iterable[str],
            target: Callable[[BlockPool], object] = lambda pool: pool, **flags: Any) -> type[BlockPool]:
    """kvpool's pool with attributes of ``target(pool)`` (the pool itself, or its null block) set
    to ``flags`` while any of ``methods`` runs: a check or a setting the pool skips."""
    return _wrapping(name, story, methods, lambda pool: patched(target(pool), **flags))


# ---------------------------------------------------------------- freeing


class FreeWithoutRefcountCheck(BlockPool):
    """A double free passes silently: blocks nobody references are skipped, not refused."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        super().free_blocks([b for b in ordered_blocks if b.ref_cnt > 0 or b.is_null])


class FreeSameBlockTwice(BlockPool):
    """A block listed twice in one call is released once."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        super().free_blocks(list({id(b): b for b in ordered_blocks}.values()))


class FreeAppendsListingTwice(BlockPool):
    """vLLM's regression: each listing of a block that reached 0 is queued, so [b, b] queues b twice."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)
        listed = Counter(id(b) for b in blocks)
        again = [b for b in {id(b): b for b in blocks}.values()
                 if listed[id(b)] > 1 and b.ref_cnt == 0 and not b.is_null and b.pool is self]
        for block in again:
            for _ in range(listed[id(block)] - 1):
                self.free_block_queue.append(block)


class FreeHashedNotQueued(BlockPool):
    """Idle cached blocks leak: they never return to the free queue, so they are never evicted."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        super().free_blocks(ordered_blocks)
        for block in _queue_blocks(self):
            if block.block_hash is not None and self.enable_caching:
                self.free_block_queue.remove(block)


FreeHashedToHead = flagged(
    "FreeHashedToHead", "Cached blocks rejoin the free queue at the head, so hot prefixes are evicted first.",
    ["free_blocks"], enable_caching=False)


class FreePushesHeadOneByOne(BlockPool):
    """Freed unhashed blocks are pushed onto the head one at a time: a batch lands reversed."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        before = len(_queue_blocks(self))
        head = {id(b) for b in _queue_blocks(self)}
        super().free_blocks(blocks)
        fresh = [b for b in _queue_blocks(self)[: len(_queue_blocks(self)) - before]
                 if id(b) not in head]
        if len(fresh) > 1 and all(b is q for b, q in zip(fresh, _queue_blocks(self), strict=False)):
            queue = self.free_block_queue
            queue.prepend_n(list(reversed(queue.popleft_n(len(fresh)))))


class RefusedFreeKeepsPartialEffect(BlockPool):
    """A refused free keeps the references it already dropped: the refusal changes the pool."""

    def _undo_release(self, released: list[Any]) -> None:
        pass


# ---------------------------------------------------------------- hits


class TouchLeavesBlockFree(BlockPool):
    """A prefix hit takes a reference but leaves the block in the free queue (evictable)."""

    def touch(self, blocks: Any) -> None:
        for block in blocks:
            self._own(block)
        for block in blocks:
            block.ref_cnt += 1


class TouchSwapRemove(BlockPool):
    """A hit leaves an array-backed free list by swap-with-last: the tail block jumps into its place."""

    def touch(self, blocks: Any) -> None:
        queue = self.free_block_queue
        for block in list(blocks):
            last = queue.fake_free_list_tail.prev_free_block
            linked = block.prev_free_block is not None and block.next_free_block is not None
            if linked and last is not None and last is not block and last is not queue.fake_free_list_head:
                queue.remove(last)
                prev = block.prev_free_block
                if prev is None:
                    continue
                last.prev_free_block, last.next_free_block = prev, block
                prev.next_free_block = block.prev_free_block = last
                last._holder = queue
                queue.num_free_blocks += 1
        super().touch(blocks)


class RefusedTouchKeepsPartialEffect(BlockPool):
    """A refused touch keeps the blocks it already took out of the free queue."""

    def _undo_touch(self, blocks: Any, unlinked: list[KVCacheBlock]) -> None:
        pass


# ---------------------------------------------------------------- allocation


AllocKeepsOldHash = flagged(
    "AllocKeepsOldHash",
    "Allocation without lazy eviction: a reallocated block keeps its hash; a hit serves stale KV.",
    ["get_new_blocks"], enable_caching=False)


class AllocForgetsPrimaryOnly(BlockPool):
    """Allocation clears the block's hash but not the index: a writable block stays reachable."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        with patched(self, enable_caching=False):
            got = super().get_new_blocks(num_blocks)
        for block in got:
            block._block_hash = block._block_hash_num_tokens = None
            self.cached_block_hashes_by_block.pop(block.block_id, None)
        return got


class AllocPopsTail(BlockPool):
    """The free list used as a stack: allocation takes the most recently freed blocks."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        queue = self.free_block_queue
        everything = queue.popleft_n(queue.num_free_blocks)
        queue.append_n(everything[::-1])
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            rest = queue.popleft_n(queue.num_free_blocks)
            queue.append_n(rest[::-1])


class CounterBeforeCheck(BlockPool):
    """get_new_blocks takes blocks one by one and only then finds the queue too short."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        queue = self.free_block_queue
        if isinstance(num_blocks, int) and num_blocks > queue.num_free_blocks:
            for block in queue.popleft_n(queue.num_free_blocks):
                block.ref_cnt += 1
            raise NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
        return super().get_new_blocks(num_blocks)


class ReuseNoticeNamesPosition(BlockPool):
    """The reuse callback gets the block at the batch position's id, not the reused block."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        ahead = _queue_blocks(self)[: max(0, num_blocks)] if isinstance(num_blocks, int) else []
        for position, block in enumerate(ahead):
            watcher = self._reuse_watchers.get(block.block_id)
            if watcher is not None:
                wrong = self.blocks[position]
                self._reuse_watchers[block.block_id] = functools.partial(
                    lambda w, b, _block: w(b), watcher, wrong)
        return super().get_new_blocks(num_blocks)


# ---------------------------------------------------------------- the null block


class NullBlockHandedOut(BlockPool):
    """The null block sits in the free queue, so get_new_blocks hands it out as a real block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.free_block_queue.append(self.null_block)


NullBlockHashed = flagged(
    "NullBlockHashed", "Caching does not skip the null block: sliding-window placeholders get hashed.",
    ["cache_full_blocks"], _null_block, is_null=False)


class UnpinNull(BlockPool):
    """unpin_blocks accepts the null block and registers a reuse watcher on it."""

    def unpin_blocks(self, blocks: Any, on_reuse: Any) -> None:
        blocks = list(blocks)
        if any(getattr(b, "is_null", False) for b in blocks) and callable(on_reuse):
            self._reuse_watchers[0] = on_reuse
            blocks = [b for b in blocks if not getattr(b, "is_null", False)]
        super().unpin_blocks(blocks, on_reuse)


MoveOntoNull = flagged(
    "MoveOntoNull", "move_block_hashes moves hashes onto the null block, which then stands in the index.",
    ["move_block_hashes"], _null_block, is_null=False)


InsertIndexesNull = flagged(
    "InsertIndexesNull",
    "_insert_block_hash without the null-block check, as vLLM's has none: the null block is indexed.",
    ["_insert_block_hash"], _null_block, is_null=False)


class InsertOverwritesPrimary(BlockPool):
    """_insert_block_hash makes the key the block's primary even when it has one."""

    def _insert_block_hash(self, block_hash_with_group_id: Any, block: Any, num_tokens: Any) -> None:
        old, tokens = block._block_hash, block._block_hash_num_tokens
        super()._insert_block_hash(block_hash_with_group_id, block, num_tokens)
        extra = self.cached_block_hashes_by_block.get(block.block_id, {})
        if old is not None and block_hash_with_group_id in extra:
            del extra[block_hash_with_group_id]
            block._block_hash = block_hash_with_group_id
            block._block_hash_num_tokens = num_tokens if num_tokens is not None else tokens


# ---------------------------------------------------------------- the prefix cache


class EvictForgetsIndex(BlockPool):
    """Eviction clears the block's own hash but leaves its index entries behind."""

    def evict_blocks(self, block_ids: Any) -> None:
        ids = list(block_ids)
        for block_id in ids:
            if not isinstance(block_id, int) or not 0 <= block_id < len(self.blocks):
                raise UnknownBlockError(f"Invalid block_id {block_id!r}")
        for block_id in ids:
            block = self.blocks[block_id]
            block._block_hash = block._block_hash_num_tokens = None
            self.cached_block_hashes_by_block.pop(block_id, None)


class EvictKeepsSecondaries(BlockPool):
    """Eviction removes a block's primary hash only: its partial-prefix entries outlive it."""

    def evict_blocks(self, block_ids: Any) -> None:
        ids = list(block_ids)
        for block_id in ids:
            if isinstance(block_id, int):
                self.cached_block_hashes_by_block.pop(block_id, None)
        super().evict_blocks(ids)


EvictWithoutEvents = flagged(
    "EvictWithoutEvents", "Eviction tells no event consumer: a router's view of the cache goes stale.",
    ["evict_blocks"], enable_kv_cache_events=False)


class PartialKeptAfterPromotion(BlockPool):
    """When a partial entry is promoted to a full hash, the partial entry stays indexed."""

    def cache_full_blocks(self, request: Any, blocks: Any, num_cached_blocks: int,
                          num_full_blocks: int, *args: Any, **kwargs: Any) -> None:
        old = {b.block_id: b._block_hash for b in blocks[num_cached_blocks:num_full_blocks]
               if getattr(b, "_block_hash", None) is not None}
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                  *args, **kwargs)
        for block_id, key in old.items():
            if self.blocks[block_id]._block_hash != key:
                self._add_key(key, self.blocks[block_id], None)


CacheWithoutCaching = flagged(
    "CacheWithoutCaching", "A pool built without prefix caching indexes blocks anyway.",
    ["cache_full_blocks", "cache_partial_block"], enable_caching=True)


class ResetWhileInUse(BlockPool):
    """The prefix cache is reset even while blocks are in use."""

    def reset_prefix_cache(self) -> bool:
        with patched(self, get_num_free_blocks=lambda: self.num_gpu_blocks - 1):
            return super().reset_prefix_cache()


class UnpinKeepsReference(BlockPool):
    """unpin_blocks registers the watcher but keeps the reference: the block leaks."""

    def unpin_blocks(self, blocks: Any, on_reuse: Any) -> None:
        blocks = list(blocks)
        super().unpin_blocks(blocks, on_reuse)
        for block in dict.fromkeys(blocks):
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += blocks.count(block)


class AllocRefusesLastBlock(BlockPool):
    """``if num_blocks >= free: raise`` (off by one): the last free block is never handed out."""

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if isinstance(num_blocks, int) and 0 < num_blocks == self.get_num_free_blocks():
            raise NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
        return super().get_new_blocks(num_blocks)


class CacheFullWithoutConflictCheck(BlockPool):
    """cache_full_blocks re-caches a block already cached at a prefix as long: it drops the
    block's entries and indexes it again, announcing the key twice."""

    def cache_full_blocks(self, request: Any, blocks: Any, num_cached_blocks: int,
                          num_full_blocks: int, *args: Any, **kwargs: Any) -> None:
        for block in blocks[num_cached_blocks:num_full_blocks]:
            if getattr(block, "_block_hash", None) is not None and not block.is_null:
                block._block_hash_num_tokens = 0
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                  *args, **kwargs)


# ---------------------------------------------------------------- events


class RemovedEventDropsGroup(BlockPool):
    """Eviction's BlockRemoved leaves out the KV-cache group: a per-group router misses it."""

    def evict_blocks(self, block_ids: Any) -> None:
        start = len(self.kv_event_queue)
        super().evict_blocks(block_ids)
        for event in self.kv_event_queue[start:]:
            if type(event).__name__ == "BlockRemoved":
                event.group_idx = None  # type: ignore[attr-defined]


StoredEventWhenDisabled = flagged(
    "StoredEventWhenDisabled",
    "cache_full_blocks queues BlockStored although events are off: the queue grows forever.",
    ["cache_full_blocks"], enable_kv_cache_events=True)


# ---------------------------------------------------------------- mutants of shared code


Patch = tuple[str, str, Callable[[Any], Any]]
"""(module of kvpool.impl, attribute, a function of the original giving the replacement)."""


@contextlib.contextmanager
def _patched(patches: tuple[Patch, ...]) -> Iterator[None]:
    """Replace each attribute in its module and wherever ``kvpool.impl`` bound it by name."""
    undo: list[tuple[Any, str, Any]] = []
    try:
        for module_name, attr, mutate in patches:
            owner: Any = importlib.import_module(f"kvpool.impl.{module_name}")
            path = attr.split(".")
            for part in path[:-1]:
                owner = getattr(owner, part)
            original = getattr(owner, path[-1])
            replacement = mutate(original)
            homes = [owner] + [m for name, m in list(sys.modules.items())
                               if name.startswith("kvpool.impl") and len(path) == 1
                               and getattr(m, path[-1], None) is original and m is not owner]
            for home in homes:
                undo.append((home, path[-1], original))
                setattr(home, path[-1], replacement)
        yield
    finally:
        for home, name, original in reversed(undo):
            setattr(home, name, original)


def mutant(name: str, story: str, *patches: Patch) -> type[BlockPool]:
    """kvpool's pool with functions of ``kvpool.impl`` changed while any operation runs."""
    return _wrapping(name, story, OPERATIONS, lambda _pool: _patched(patches), patches=patches)


def patches_take_effect(form: type[Any]) -> bool:
    """False for a mutant of shared code on the compiled build, whose callers never see a patch."""
    return not (getattr(form, "patches", None) and kvpool.impl.COMPILED)


def _stored_with(**fields: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``block_stored`` with some fields of the event it builds changed."""

    def mutate(original: Any) -> Any:
        def block_stored(*args: Any, **kwargs: Any) -> Any:
            event = original(*args, **kwargs)
            for field, change in fields.items():
                setattr(event, field, change(getattr(event, field)))
            return event

        return block_stored

    return mutate


StoredEventDropsLora = mutant(
    "StoredEventDropsLora", "BlockStored leaves out the LoRA adapter id: a router merges adapters",
    ("events", "block_stored", _stored_with(lora_id=lambda _v: None)))
StoredTokensOneShort = mutant(
    "StoredTokensOneShort", "BlockStored's token ids are one token short (a slice end off by one)",
    ("events", "block_stored", _stored_with(token_ids=lambda v: v[:-1])))
StoredEventDropsSession = mutant(
    "StoredEventDropsSession", "BlockStored leaves out the session id",
    ("events", "block_stored", _stored_with(session_id=lambda _v: None)))
EventHashesMaskedTo32Bits = mutant(
    "EventHashesMaskedTo32Bits", "event hashes published as their low 32 bits: routers see collisions",
    ("keys", "maybe_convert_block_hash",
     lambda f: lambda h: f(h) & 0xFFFF_FFFF if isinstance(f(h), int) else f(h)))
EventExtraKeysKeepTags = mutant(
    "EventExtraKeysKeepTags", "events publish the tagged extra keys consumers cannot parse",
    ("hashing", "to_event_extra_keys", lambda _f: lambda keys: list(keys) or None if keys else None))
CoarseHashOfFirstChunk = mutant(
    "CoarseHashOfFirstChunk",
    "a block coarser than the hash chunk takes its first chunk's hash, which names a shorter prefix",
    ("hashing", "BlockHashListWithBlockSize._at",
     lambda _f: lambda self, idx: self.block_hashes[idx * self.scale_factor]))
def _salt_everywhere(original: Any) -> Any:
    def generate_block_hash_extra_keys(request: Any, start: int, end: int, mm_idx: int) -> Any:
        keys, nxt = original(request, start, end, mm_idx)
        if start and request.cache_salt:
            keys = (*(keys or ()), ("cache_salt", request.cache_salt))
        return keys, nxt

    return generate_block_hash_extra_keys


def _offset_from_item(original: Any) -> Any:
    def mm_extra_keys(request: Any, start: int, end: int, mm_idx: int) -> Any:
        keys, nxt = original(request, start, end, mm_idx)
        return [(tag, ident, -offset) for tag, ident, offset in keys], nxt

    return mm_extra_keys


CacheSaltOnEveryChunk = mutant(
    "CacheSaltOnEveryChunk", "the cache salt enters every chunk's extra keys, not the first only",
    ("hashing", "generate_block_hash_extra_keys", _salt_everywhere))
MultimodalOffsetFlipped = mutant(
    "MultimodalOffsetFlipped", "a multimodal item's offset is measured from the item, not the chunk",
    ("hashing", "_mm_extra_keys", _offset_from_item))
GroupIdLittleEndian = mutant(
    "GroupIdLittleEndian", "index keys pack the group id little-endian, unlike vLLM",
    ("pool", "_group_suffix", lambda f: lambda g: f(g)[::-1]))
RemovedGroupFromWrongBytes = mutant(
    "RemovedGroupFromWrongBytes", "BlockRemoved reads the group id from the key's bytes little-endian",
    ("keys", "get_group_id", lambda _f: lambda key: int.from_bytes(key[-4:], "little")))
