"""An independent KV-cache block pool with vLLM 0.31.0's ``BlockPool`` API.

Written the way a third-party engine author would write it: against vLLM's
public surface (names, signatures, results, eviction order, KV events,
callbacks) and nothing else.  It uses only the standard library, and its
internals are its own:

* the free queue is an ``OrderedDict`` keyed by block id, head first; there
  are no linked-list fields on blocks;
* the prefix-cache index is ``{key: {block_id: block}}``; the inner dict's
  insertion order is the lookup order (the first block indexed under a key
  wins), so one shape serves one block or many;
* a block keeps its secondary (partial-prefix) keys itself, in a list in the
  order they were added;
* reuse watchers live in ``_watch``, pending events in ``_outbox``.

Like vLLM, misuse is not refused with typed errors; legal calls are exact.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Key = bytes  # a block hash with its 4-byte big-endian group id appended
ExternalHash = bytes | int
EventKeys = tuple[Any, ...] | None


@dataclass
class BlockStored:
    """A run of blocks became reachable in the prefix cache (vLLM's fields, in order)."""

    block_hashes: list[ExternalHash]
    parent_block_hash: ExternalHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[EventKeys] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


@dataclass
class BlockRemoved:
    """One key left the prefix cache."""

    block_hashes: list[ExternalHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared:
    """The whole prefix cache was reset."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class MetricsCollector(Protocol):
    """What the pool tells a residency collector (vLLM's KVCacheMetricsCollector)."""

    def on_block_allocated(self, block: Block) -> None: ...
    def on_block_accessed(self, block: Block) -> None: ...
    def on_block_evicted(self, block: Block) -> None: ...
    def reset(self) -> None: ...


@dataclass(eq=False)
class Block:
    """One physical block.  Compared by identity: two blocks are equal only if one.

    ``pool`` lets ``free_blocks`` hand a block to the pool that owns it, since
    a caller's deferred frees may mix pools.  ``secondary_keys`` are the
    partial-prefix keys indexed for this block beside its primary key.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: Key | None = None
    block_hash_num_tokens: int | None = None
    is_null: bool = False
    pool: BlockPool | None = field(default=None, repr=False)
    secondary_keys: list[Key] = field(default_factory=list, repr=False)


class FreeQueue:
    """Idle blocks in eviction order: the head is handed out (or evicted) first.

    An ``OrderedDict`` gives O(1) removal from the middle (a prefix hit on an
    idle block) without per-block links.  Pushing a block that is already
    queued cannot make it appear twice; the pool never does it.
    """

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._order: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._order)

    def get_all_free_blocks(self) -> list[Block]:
        """The queued blocks, head first."""
        return list(self._order.values())

    def take(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the head."""
        return [self._order.popitem(last=False)[1] for _ in range(n)]

    def remove(self, block: Block) -> None:
        del self._order[block.block_id]

    def push_front(self, blocks: Sequence[Block]) -> None:
        """Queue ``blocks`` at the head, ``blocks[0]`` becoming the new head."""
        for block in reversed(blocks):
            self._order[block.block_id] = block
            self._order.move_to_end(block.block_id, last=False)

    def push_back(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            self._order[block.block_id] = block


def _embeds_digest(request: Any, start: int, end: int) -> bytes:
    """SHA-256 of the prompt embeddings of ``[start, end)``, cached on the request as vLLM does."""
    cache: dict[tuple[int, int], bytes] = request._prompt_embeds_per_block_hashes
    digest = cache.get((start, end))
    if digest is None:
        chunk = request.prompt_embeds[start:end]
        torch = sys.modules.get("torch")  # a tensor implies torch is already imported
        if torch is not None and isinstance(chunk, torch.Tensor):
            raw = bytes(chunk.flatten().cpu().contiguous().view(torch.uint8).numpy().data)
        else:
            raw = bytes(memoryview(chunk))
        digest = cache[(start, end)] = hashlib.sha256(raw).digest()
    return digest


def event_extra_keys(request: Any, start: int, end: int, mm_idx: int) -> tuple[EventKeys, int]:
    """The event form of the extra keys of tokens ``[start, end)``, and the next mm index.

    Events carry the keys untagged: the LoRA name, ``(identifier, offset)``
    per multimodal item overlapping the chunk, the cache salt on the first
    chunk, the prompt-embeddings digest; None when there are none.
    """
    keys: list[Any] = []
    lora = request.lora_request
    if lora:
        keys.append(lora.lora_name)
    features = request.mm_features
    last = features[-1].mm_position if features else None
    if last is not None and start < last.offset + last.length:  # else no item reaches this far
        while mm_idx < len(features):
            pos = features[mm_idx].mm_position
            if end <= pos.offset:  # items are sorted: the rest start later still
                break
            if start < pos.offset + pos.length:
                keys.append((features[mm_idx].identifier, pos.offset - start))
                if end < pos.offset + pos.length:  # it runs on into the next chunk
                    break
            mm_idx += 1
    if start == 0 and request.cache_salt:
        keys.append(request.cache_salt)
    if getattr(request, "prompt_embeds", None) is not None:
        keys.append(_embeds_digest(request, start, end))
    return (tuple(keys) if keys else None), mm_idx


def coarse_hash(fine_hashes: Sequence[bytes], hash_block_size: int, block_size: int, i: int) -> bytes:
    """The hash of block ``i`` at ``block_size``: fine hashes chain over the whole
    prefix, so the last fine hash inside the block names it."""
    return fine_hashes[(i + 1) * (block_size // hash_block_size) - 1]


class BlockPool:
    """Allocates, frees and prefix-caches KV-cache blocks, as vLLM 0.31.0 does.

    Freed unhashed blocks go to the head of the free queue (reused first,
    warm in GPU caches); freed cached blocks to the tail (LRU eviction).  A
    cached block keeps its keys while idle, so a later request can hit it;
    they are dropped only when ``get_new_blocks`` hands it out again.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, metrics_collector: MetricsCollector | None = None,
                 medium: str = "GPU") -> None:
        assert isinstance(num_gpu_blocks, int) and num_gpu_blocks > 0
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.metrics_collector = metrics_collector
        self.medium = medium
        self.blocks = [Block(i, pool=self) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeQueue(self.blocks[1:])
        # Block 0 fills skipped positions of block tables: never queued, never cached.
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self._index: dict[Key, dict[int, Block]] = {}
        self._watch: dict[int, Callable[[Block], None]] = {}
        self._outbox: list[Event] = []
        # Events carry a hash's low 64 bits as an int unless vLLM's switch says raw bytes.
        flag = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1").strip().lower()
        self._int_hashes = flag not in ("0", "false", "no", "off", "")

    # ---------------------------------------------------------------- keys

    def _external(self, block_hash: bytes) -> ExternalHash:
        return int.from_bytes(block_hash[-8:], "big") if self._int_hashes else block_hash

    def _add_key(self, key: Key, block: Block, num_tokens: int | None) -> None:
        """Index ``block`` under ``key``: as its primary key if it has none yet."""
        if block.block_hash == key or block.block_id in self._index.get(key, ()):
            return
        if block.block_hash is None:
            block.block_hash, block.block_hash_num_tokens = key, num_tokens
        else:
            block.secondary_keys.append(key)
        self._index.setdefault(key, {})[block.block_id] = block

    def _unindex(self, key: Key, block: Block) -> bool:
        bucket = self._index.get(key)
        if bucket is None or bucket.pop(block.block_id, None) is None:
            return False
        if not bucket:
            del self._index[key]
        return True

    def _drop_keys(self, block: Block) -> list[Key]:
        """Unindex every key of ``block``, primary first; return those that were indexed."""
        keys = ([block.block_hash] if block.block_hash is not None else []) + block.secondary_keys
        block.block_hash = block.block_hash_num_tokens = None
        block.secondary_keys = []
        return [key for key in keys if self._unindex(key, block)]

    # -------------------------------------------------------------- events

    def _removed(self, keys: Iterable[Key]) -> None:
        if self.enable_kv_cache_events:
            self._outbox.extend(
                BlockRemoved([self._external(k[:-4])], self.medium, int.from_bytes(k[-4:], "big"))
                for k in keys)

    def _stored(self, request: Any, hashes: list[ExternalHash], parent: ExternalHash | None,
                start: int, end: int, block_size: int, group: int,
                keys: list[EventKeys]) -> BlockStored:
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes, parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end], block_size=block_size,
            lora_id=lora.adapter_id if lora else None, medium=self.medium,
            lora_name=lora.name if lora else None, extra_keys=keys or None,
            group_idx=group, session_id=request.session_id)

    def take_events(self) -> list[Event]:
        """Hand over the pending events (none when events are off)."""
        if not self.enable_kv_cache_events:
            return []
        events, self._outbox = self._outbox, []
        return events

    # -------------------------------------------------------- prefix cache

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[Block] | None:
        """The first block cached under ``block_hash`` in each group, or None on any miss."""
        found = []
        for group in kv_cache_group_ids:
            bucket = self._index.get(block_hash + group.to_bytes(4, "big"))
            if not bucket:
                return None
            found.append(next(iter(bucket.values())))
        return found

    def cache_full_blocks(self, request: Any, blocks: list[Block], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        """Index ``blocks[num_cached_blocks:num_full_blocks]``, which just became full.

        Null and masked-out blocks are skipped.  A block that already has a
        key is a partial entry growing full: its old keys go first.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        fine, hbs, group = request.block_hashes, self.hash_block_size, kv_cache_group_id
        suffix = group.to_bytes(4, "big")
        hashes: list[ExternalHash] = []
        keys: list[EventKeys] = []
        mm_idx = 0
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            block_hash = coarse_hash(fine, hbs, block_size, i)
            if block.block_hash is not None:
                assert block.block_hash_num_tokens is not None
                assert block.block_hash_num_tokens < (i + 1) * block_size
                self._removed(self._drop_keys(block))
            self._add_key(block_hash + suffix, block, (i + 1) * block_size)
            if self.enable_kv_cache_events:
                hashes.append(self._external(block_hash))
                key, mm_idx = event_extra_keys(request, i * block_size, (i + 1) * block_size, mm_idx)
                keys.append(key)
        if self.enable_kv_cache_events:
            parent = (self._external(coarse_hash(fine, hbs, block_size, num_cached_blocks - 1))
                      if num_cached_blocks else None)
            self._outbox.append(self._stored(
                request, hashes, parent, num_cached_blocks * block_size,
                num_full_blocks * block_size, block_size, group, keys))

    def emit_cached_block_events(self, request: Any, num_cached_blocks: int, block_size: int,
                                 kv_cache_group_id: int) -> None:
        """Tell event consumers about a prefix hit of ``num_cached_blocks`` blocks.

        The hit blocks are already cached; only a ``BlockStored`` is emitted,
        so that a router learns this replica holds them.
        """
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        hashes: list[ExternalHash] = []
        keys: list[EventKeys] = []
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._external(
                coarse_hash(request.block_hashes, self.hash_block_size, block_size, i)))
            key, mm_idx = event_extra_keys(request, i * block_size, (i + 1) * block_size, mm_idx)
            keys.append(key)
        self._outbox.append(self._stored(request, hashes, None, 0, num_cached_blocks * block_size,
                                         block_size, kv_cache_group_id, keys))

    def cache_partial_block(self, request: Any, block: Block, num_tokens: int, kv_cache_group_id: int,
                            block_size: int, replace_existing_hashes: bool = False) -> Key | None:
        """Make ``block`` reachable from the prefix of ``num_tokens`` tokens, which ends inside it.

        Keys covering a shorter prefix are dropped first (the block grew);
        with ``replace_existing_hashes`` every key is (its contents changed).
        Returns the key, or None for the null block.
        """
        if block.is_null:
            return None
        hbs = self.hash_block_size
        assert block_size % hbs == 0 and num_tokens % hbs == 0
        assert replace_existing_hashes or (block_size > hbs and num_tokens % block_size != 0)
        n = num_tokens // hbs
        assert 0 < n <= len(request.block_hashes)
        block_hash: bytes = request.block_hashes[n - 1]
        key = block_hash + kv_cache_group_id.to_bytes(4, "big")
        known = block.block_hash == key or block.block_id in self._index.get(key, {})
        if replace_existing_hashes:
            self._removed(self._drop_keys(block))
            known = False
        elif (not known and block.block_hash_num_tokens is not None
              and block.block_hash_num_tokens < num_tokens):
            self._removed(self._drop_keys(block))
        self._add_key(key, block, num_tokens)
        if self.enable_kv_cache_events and not known:
            start = num_tokens - hbs
            parent = self._external(request.block_hashes[n - 2]) if n > 1 else None
            # Start the multimodal scan at the first item still running at ``start``.
            ends = [f.mm_position.offset + f.mm_position.length for f in request.mm_features or ()]
            mm_idx = next((i for i, e in enumerate(ends) if e > start), len(ends)) if start else 0
            extra, _ = event_extra_keys(request, start, num_tokens, mm_idx)
            self._outbox.append(self._stored(request, [self._external(block_hash)], parent, start,
                                             num_tokens, hbs, kv_cache_group_id, [extra]))
        return key

    def move_block_hashes(self, src_block: Block, dst_block: Block) -> None:
        """Re-point ``src_block``'s keys at ``dst_block``, a private copy of it.

        The owner of ``src_block`` keeps writing into it, so the cache keeps
        the copy under the same keys.  Nothing leaves the cache: no events.
        """
        assert dst_block.block_hash is None and not dst_block.secondary_keys
        num_tokens = src_block.block_hash_num_tokens
        for key in self._drop_keys(src_block):
            self._add_key(key, dst_block, num_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache; their ref counts and queue places stay."""
        for block_id in block_ids:
            assert 0 <= block_id < len(self.blocks), f"Invalid block_id {block_id}"
            self._evict(self.blocks[block_id])

    def _evict(self, block: Block) -> None:
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        self._removed(self._drop_keys(block))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after a weight update); only when nothing is in use."""
        in_use = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # the null block always is
        if in_use:
            logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet",
                           in_use)
            return False
        self._index = {}
        for block in self.blocks:
            block.secondary_keys = []
        self._notify_reuse([self.blocks[i] for i in list(self._watch)])
        for block in self.blocks:
            block.block_hash = block.block_hash_num_tokens = None
        if self.metrics_collector:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self._outbox.append(AllBlocksCleared())
        return True

    # ----------------------------------------------------- allocate, free

    def get_new_blocks(self, num_blocks: int) -> list[Block]:
        """Hand out ``num_blocks`` blocks from the head of the free queue.

        A reused block's old keys are dropped here, when its KV is about to be
        overwritten, not when it was freed: until then it could still be hit.
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        blocks = self.free_block_queue.take(num_blocks)
        self._notify_reuse(blocks)
        for block in blocks:
            if self.enable_caching:
                self._evict(block)
            assert block.ref_cnt == 0
            block.ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated(block)
        return blocks

    def _notify_reuse(self, blocks: Iterable[Block]) -> None:
        """Call, once, the watcher of each block about to be overwritten."""
        for block in blocks:
            watcher = self._watch.pop(block.block_id, None)
            if watcher is not None:
                watcher(block)

    def unpin_blocks(self, blocks: Iterable[Block], on_reuse: Callable[[Block], None]) -> None:
        """Release references to blocks someone still reads until they are reused.

        Idle ones join the tail of the free queue, cached or not (evicted last);
        ``on_reuse`` fires when one is handed out again or the cache is reset.
        """
        idle = []
        for block in blocks:
            assert block.ref_cnt > 0 and not block.is_null
            block.ref_cnt -= 1
            self._watch[block.block_id] = on_reuse
            if block.ref_cnt == 0:
                idle.append(block)
        self.free_block_queue.push_back(idle)

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on each block a request hit in the prefix cache.

        An idle block leaves the free queue, so it cannot be evicted under the
        request.  (0.31.0 counts references on the null block too.)
        """
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_accessed(block)

    def _goes_to_head(self, block: Block) -> bool:
        """Whether a freed block is reused first: its KV is worth nothing to the cache."""
        return block.block_hash is None or not self.enable_caching

    def free_blocks(self, ordered_blocks: Iterable[Block]) -> None:
        """Drop one reference per listing; blocks left idle rejoin the free queue.

        List blocks in eviction order.  A block listed twice drops two
        references and is queued once, when the last one goes.  Blocks of
        another pool are handed to it, after this pool's own.
        """
        mine, others = self._split_by_pool(ordered_blocks)
        head: list[Block] = []
        tail: list[Block] = []
        for block in mine:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                (head if self._goes_to_head(block) else tail).append(block)
        self.free_block_queue.push_front(head)
        self.free_block_queue.push_back(tail)
        for pool, theirs in others.items():
            pool.free_blocks(theirs)

    def _split_by_pool(self, blocks: Iterable[Block]) -> tuple[list[Block], dict[BlockPool, list[Block]]]:
        """This pool's blocks, and the others' grouped by pool in order of first appearance."""
        mine: list[Block] = []
        others: dict[BlockPool, list[Block]] = {}
        for block in blocks:
            if block.pool is None or block.pool is self:
                mine.append(block)
            else:
                others.setdefault(block.pool, []).append(block)
        return mine, others

    # ------------------------------------------------------------- queries

    def is_block_writable(self, block: Block) -> bool:
        """Whether the sole owner may write into the block: unshared and not cached."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the real (non-null) blocks in use."""
        real = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / real if real else 0.0
