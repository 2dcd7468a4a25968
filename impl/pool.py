"""The block pool: allocation, freeing and prefix caching of KV-cache blocks.

Same public names, signatures and observable behaviour as vLLM's ``BlockPool``
(0.31.0), with three differences a caller can rely on:

* misuse raises a typed :class:`~kvpool.impl.errors.BlockPoolError` and is
  refused before anything changes (vLLM uses ``assert`` or corrupts state);
* the choices vLLM leaves open follow :mod:`kvpool.model.actions`;
* user callbacks (reuse watchers, the metrics collector) run after the pool
  has reached its new state.  Every callback due is called once, in vLLM's
  order, even if an earlier one raised; then the first exception propagates
  (later ones are attached as notes).  The operation stays done, except in
  ``get_new_blocks``: there the caller would lose the blocks, so they go back
  to the head of the free queue, in order, before the exception propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from operator import length_hint
from typing import Any, Final, TypeAlias, TypeVar

from .block import KVCacheBlock
from .errors import (
    BlockHashConflictError,
    BlockNotInUseError,
    CachingDisabledError,
    InvalidArgumentError,
    NotEnoughFreeBlocksError,
    NullBlockError,
    UnknownBlockError,
)
from .events import (
    MEDIUM_GPU,
    KVCacheEvent,
    all_blocks_cleared,
    announce_removed,
    block_stored,
    extra_keys_of_blocks,
    extra_keys_of_chunk,
)
from .free_queue import FreeKVCacheBlockQueue
from .hash_index import BlockHashToBlockMap, earliest
from .hashing import resolve_block_hashes
from .keys import (
    MAX_GROUP_ID,
    BlockHash,
    BlockHashWithGroupId,
    ExternalBlockHash,
    maybe_convert_block_hash,
)
from .metrics import KVCacheMetricsCollector
from .native import mypyc_attr

logger = logging.getLogger("kvpool")
logger.addHandler(logging.NullHandler())

ReuseWatcher = Callable[[KVCacheBlock], None]
_Call = tuple[Callable[..., Any], tuple[Any, ...]]
_SUFFIXES: Final = [g.to_bytes(4, "big") for g in range(64)]
# Group 0 (most models have one group) takes its suffix without a call: CPython keeps one int 0,
# so an identity test is an exact check for it, and any other value goes to _group_suffix.
_INT_0: Final = 0
_SUFFIX_0: Final = _SUFFIXES[0]

_T = TypeVar("_T")
# An argument the pool checks itself: what a caller should pass, or anything else,
# refused with a typed BlockPoolError.  (A plain ``int`` or ``KVCacheBlock`` would be
# checked first by the entry points of the compiled build, which raise TypeError.)
Checked: TypeAlias = _T | Any


def _group_suffix(group_id: Checked[int]) -> bytes:
    """The 4 bytes a group id adds to a key; refuses ids that do not fit."""
    if type(group_id) is int:
        small: int = group_id  # typed: compiled, compared and indexed as a machine integer
        if 0 <= small < 64:
            return _SUFFIXES[small]
    if not isinstance(group_id, int) or not 0 <= group_id <= MAX_GROUP_ID:
        raise InvalidArgumentError(f"kv_cache_group_id {group_id!r} is not a 32-bit id")
    return group_id.to_bytes(4, "big")


def _run(calls: list[_Call]) -> BaseException | None:
    """Call each callback once; return the first exception, others as notes.

    An interrupt (a ``BaseException`` that is not an ``Exception``) stops the
    remaining callbacks, but is returned like any other so that the caller
    still leaves the pool consistent before re-raising it.
    """
    first: BaseException | None = None
    for fn, args in calls:
        try:
            fn(*args)
        except BaseException as exc:  # user code: finish our own work, report afterwards
            if first is None:
                first = exc
            else:
                first.add_note(f"kvpool: a later callback also raised {exc!r}")
            if not isinstance(exc, Exception):
                break
    return first


@mypyc_attr(allow_interpreted_subclasses=True)  # callers subclass and pickle it
class BlockPool:
    """Allocates, frees and caches KV-cache blocks; see the module docstring.

    The free queue is the eviction order.  Freed blocks without a hash go to
    its head (reused first, their KV is worthless); hashed ones to its tail,
    so idle cached prefixes are evicted least-recently-freed first.  A cached
    block's hash is removed lazily, when the block is handed out again.
    """

    def __init__(
        self,
        num_gpu_blocks: Checked[int],
        enable_caching: bool,
        hash_block_size: Checked[int],
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
        medium: str = MEDIUM_GPU,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks <= 0:
            raise InvalidArgumentError(f"num_gpu_blocks must be a positive int, got {num_gpu_blocks!r}")
        if not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise InvalidArgumentError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.medium = medium
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        # The queue makes itself every block's holder, and this pool the holder of those it lets go.
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks, owner=self)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Secondary (partial-prefix) keys per block, as an insertion-ordered set.
        self.cached_block_hashes_by_block: dict[int, dict[BlockHashWithGroupId, None]] = {}
        # Block 0 stands in for skipped positions in block tables; never free, never cached.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector
        self._reuse_watchers: dict[int, ReuseWatcher] = {}

    # ------------------------------------------------------------------ checks

    def _own(self, block: Any) -> KVCacheBlock:
        if not isinstance(block, KVCacheBlock) or (
                block._holder is not self and block._holder is not self.free_block_queue):
            raise UnknownBlockError(f"{block!r} is not a block of this pool")
        return block

    def _check_block_size(self, block_size: Any) -> int:
        if not isinstance(block_size, int) or block_size <= 0 or block_size % self.hash_block_size:
            raise InvalidArgumentError(
                f"block_size {block_size!r} is not a positive multiple of {self.hash_block_size}")
        return block_size

    @staticmethod
    def _check_count(name: str, value: Any) -> int:
        if not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")
        return value

    def _release(self, blocks: list[Any], what: str) -> list[KVCacheBlock]:
        """Drop one reference per listing of a block of this pool, all or none.

        Returns the real blocks that became idle, in the order they did.
        Callers pass their own blocks only (``free_blocks`` hands each other
        pool its share).
        """
        idle: list[KVCacheBlock] = []
        done = 0
        try:
            for block in blocks:
                block.ref_cnt -= 1
                done += 1
                if block.ref_cnt <= 0 and not block.is_null:
                    if block.ref_cnt < 0:
                        raise BlockNotInUseError(
                            f"{what} block {block.block_id}: more releases than references")
                    idle.append(block)
        except BaseException as exc:
            self._undo_release(blocks[:done])
            if isinstance(exc, AttributeError):
                raise UnknownBlockError(f"{what}: not a KV-cache block: {exc}") from None
            raise
        return idle

    def _undo_release(self, released: list[Any]) -> None:
        """Give back the reference a refused call took from each of this pool's blocks."""
        for block in released:
            if block.pool is self:
                block.ref_cnt += 1

    def _check_release(self, blocks: list[KVCacheBlock], what: str) -> None:
        """Raise as :meth:`_release` would, without changing anything."""
        self._release(blocks, what)
        for block in blocks:
            block.ref_cnt += 1

    # ----------------------------------------------------------- hash entries

    def _drop_hashes(self, blocks: list[KVCacheBlock]) -> list[BlockHashWithGroupId]:
        """Remove every index entry of each block, primary first; the keys removed, in order.

        One call for all the blocks an allocation hands out (not one per block: the
        interpreted build pays for each call).
        """
        removed: list[BlockHashWithGroupId] = []
        index = self.cached_block_hash_to_block
        cache = index._cache
        secondary = self.cached_block_hashes_by_block
        for block in blocks:
            primary = block._block_hash
            if primary is None:
                continue
            if cache.get(primary) is block:  # the usual entry: this block alone under its key
                del cache[primary]
                removed.append(primary)
            elif index.pop(primary, block.block_id) is not None:
                removed.append(primary)
            extra = secondary.pop(block.block_id, None) if secondary else None  # mostly empty: skip the pop
            if extra:
                for key in extra:
                    if index.pop(key, block.block_id) is not None:
                        removed.append(key)
            block._block_hash = None
            block._block_hash_num_tokens = None
        return removed

    def _emit_removed(self, removed: list[BlockHashWithGroupId]) -> None:
        if self.enable_kv_cache_events and removed:
            announce_removed(self.kv_event_queue, removed, self.medium)

    def _add_key(self, key: BlockHashWithGroupId, block: KVCacheBlock, num_tokens: int | None) -> None:
        """Index ``block`` under ``key``: as its primary key if it has none."""
        if block._block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id):
            return
        if block._block_hash is None:
            block._block_hash = key
            block._block_hash_num_tokens = num_tokens
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, {})[key] = None
        self.cached_block_hash_to_block.insert(key, block)

    # ------------------------------------------------------------- prefix cache

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[Checked[int]]
    ) -> list[KVCacheBlock] | None:
        """The first block cached under ``block_hash`` in each group, or None on any miss."""
        cache = self.cached_block_hash_to_block._cache
        # Typed as a list, so that the compiled build walks it natively (one call per block looked up).
        group_ids: list[Any] = (
            kv_cache_group_ids if type(kv_cache_group_ids) is list else list(kv_cache_group_ids))
        if len(group_ids) == 1:  # the usual call: the result list made at its size, no append
            group_id = group_ids[0]
            entry = cache.get(block_hash + (_SUFFIX_0 if group_id is _INT_0 else _group_suffix(group_id)))
            if entry is None:
                return None
            return [entry if type(entry) is KVCacheBlock else earliest(entry)]  # type: ignore[arg-type]
        out: list[KVCacheBlock] = []
        for group_id in group_ids:
            entry = cache.get(block_hash + _group_suffix(group_id))
            if entry is None:
                for later in group_ids:  # a miss does not excuse a bad id further on
                    _group_suffix(later)
                return None
            out.append(entry if type(entry) is KVCacheBlock else earliest(entry))  # type: ignore[arg-type]
        return out

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[Checked[KVCacheBlock]],
        num_cached_blocks: Checked[int],
        num_full_blocks: Checked[int],
        block_size: Checked[int],
        kv_cache_group_id: Checked[int],
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Index the blocks that became full since the last call.

        ``blocks[num_cached_blocks:num_full_blocks]`` get the request's hashes at
        ``block_size`` granularity; null and masked-out blocks are skipped.  A
        block that already has a hash must be a partial entry being promoted.
        """
        num_cached_blocks = self._check_count("num_cached_blocks", num_cached_blocks)
        num_full_blocks = self._check_count("num_full_blocks", num_full_blocks)
        block_size = self._check_block_size(block_size)
        suffix = _group_suffix(kv_cache_group_id)
        if num_cached_blocks >= num_full_blocks:
            return
        if not self.enable_caching:
            raise CachingDisabledError("cache_full_blocks on a pool without prefix caching")
        if num_full_blocks > len(blocks):
            raise InvalidArgumentError(f"num_full_blocks {num_full_blocks} > {len(blocks)} blocks")
        # The refusals in the model's order: unknown blocks, the mask, the hashes, conflicts.
        listed: list[Any] = blocks if type(blocks) is list else list(blocks)  # a list: sliced natively
        new_blocks = [self._own(blk) for blk in listed[num_cached_blocks:num_full_blocks]]
        if block_mask is not None and len(block_mask) != len(new_blocks):
            raise InvalidArgumentError(
                f"block_mask has {len(block_mask)} entries, want {len(new_blocks)}")
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        hash_list: list[BlockHash] | None = hashes if type(hashes) is list else None  # indexed natively
        needed = num_cached_blocks if self.enable_kv_cache_events else 0
        end_tokens = num_cached_blocks * block_size
        conflict: KVCacheBlock | None = None
        for i, blk in enumerate(new_blocks):
            end_tokens += block_size
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
            needed = num_cached_blocks + i + 1
            if blk._block_hash is not None and conflict is None:
                covered = blk._block_hash_num_tokens
                if covered is None or covered >= end_tokens:
                    conflict = blk
        if len(hashes) < needed:
            raise InvalidArgumentError(f"request has {len(hashes)} block hashes, want {needed}")
        if conflict is not None:
            raise BlockHashConflictError(
                f"block {conflict.block_id} is already cached at a prefix this long")

        events = self.enable_kv_cache_events
        stored: list[Any] = []
        cache = self.cached_block_hash_to_block._cache
        num_tokens = num_cached_blocks * block_size
        pos = num_cached_blocks
        for i, blk in enumerate(new_blocks):
            num_tokens += block_size
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                pos += 1
                continue
            block_hash = hash_list[pos] if hash_list is not None else hashes[pos]
            pos += 1
            if blk._block_hash is not None:
                self._emit_removed(self._drop_hashes([blk]))
            key = block_hash + suffix
            # An unhashed block has no secondary keys, so this is a plain insert.
            blk._block_hash = key
            blk._block_hash_num_tokens = num_tokens
            entry = cache.setdefault(key, blk)  # one probe when the key is new, as it mostly is
            if entry is not blk:  # the key was there: its blocks, then this one
                if type(entry) is KVCacheBlock:
                    cache[key] = {entry.block_id: entry, blk.block_id: blk}
                else:
                    entry[blk.block_id] = blk  # type: ignore[index]
            if events:
                stored.append(maybe_convert_block_hash(block_hash))
        if events:
            parent = (maybe_convert_block_hash(hashes[num_cached_blocks - 1])
                      if num_cached_blocks else None)
            # The blocks announced: all of them unless some were null or masked out.
            indices: Sequence[int] = range(num_cached_blocks, num_full_blocks)
            if len(stored) != len(new_blocks):
                indices = [
                    i for i in indices
                    if not new_blocks[i - num_cached_blocks].is_null
                    and (block_mask is None or block_mask[i - num_cached_blocks])
                ]
            self.kv_event_queue.append(block_stored(
                request, stored, parent, num_cached_blocks * block_size,
                num_full_blocks * block_size, block_size, kv_cache_group_id, self.medium,
                extra_keys_of_blocks(request, indices, block_size)))

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: Checked[int], block_size: Checked[int],
        kv_cache_group_id: Checked[int],
    ) -> None:
        """Announce prefix-cache hits to event consumers; blocks are unchanged."""
        num_cached_blocks = self._check_count("num_cached_blocks", num_cached_blocks)
        block_size = self._check_block_size(block_size)
        _group_suffix(kv_cache_group_id)
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        if num_cached_blocks > len(hashes):
            raise InvalidArgumentError(
                f"request has {len(hashes)} block hashes, want {num_cached_blocks}")
        published: list[ExternalBlockHash] = []
        for i in range(num_cached_blocks):
            published.append(maybe_convert_block_hash(hashes[i]))
        self.kv_event_queue.append(block_stored(
            request, published, None,
            0, num_cached_blocks * block_size, block_size, kv_cache_group_id, self.medium,
            extra_keys_of_blocks(request, range(num_cached_blocks), block_size)))

    def cache_partial_block(
        self,
        request: Any,
        block: Checked[KVCacheBlock],
        num_tokens: Checked[int],
        kv_cache_group_id: Checked[int],
        block_size: Checked[int],
        replace_existing_hashes: bool = False,
    ) -> BlockHashWithGroupId | None:
        """Make ``block`` reachable from a prefix boundary that ends inside it.

        Lets a request hit a block that is not full yet without copying it.
        Entries covering a shorter prefix are dropped first (the block grew);
        with ``replace_existing_hashes`` all are (its contents were replaced).
        Returns the key, or None for the null block.
        """
        block = self._own(block)
        if block.is_null:
            return None
        hbs = self.hash_block_size
        block_size = self._check_block_size(block_size)
        suffix = _group_suffix(kv_cache_group_id)
        if not isinstance(num_tokens, int) or num_tokens <= 0 or num_tokens % hbs:
            raise InvalidArgumentError(f"num_tokens {num_tokens!r} is not a positive multiple of {hbs}")
        if not replace_existing_hashes and not (block_size > hbs and num_tokens % block_size):
            raise InvalidArgumentError("a partial entry must end inside a block")
        num_hash_blocks = num_tokens // hbs
        if num_hash_blocks > len(request.block_hashes):
            raise InvalidArgumentError(
                f"request has only {len(request.block_hashes)} block hashes")
        if not self.enable_caching:
            raise CachingDisabledError("cache_partial_block on a pool without prefix caching")

        block_hash: BlockHash = request.block_hashes[num_hash_blocks - 1]
        key = block_hash + suffix
        already = block._block_hash == key or self.cached_block_hash_to_block.contain(
            key, block.block_id)
        if replace_existing_hashes:
            self._emit_removed(self._drop_hashes([block]))
            already = False
        elif (not already and block._block_hash_num_tokens is not None
              and block._block_hash_num_tokens < num_tokens):
            self._emit_removed(self._drop_hashes([block]))
        self._add_key(key, block, num_tokens)
        if self.enable_kv_cache_events and not already:
            start = (num_hash_blocks - 1) * hbs
            parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
            self.kv_event_queue.append(block_stored(
                request, [maybe_convert_block_hash(block_hash)],
                maybe_convert_block_hash(parent) if parent is not None else None,
                start, num_tokens, num_tokens - start, kv_cache_group_id, self.medium,
                [extra_keys_of_chunk(request, start, num_tokens)]))
        return key

    def move_block_hashes(self, src_block: Checked[KVCacheBlock], dst_block: Checked[KVCacheBlock]) -> None:
        """Re-point ``src_block``'s entries at ``dst_block``, a private copy of it.

        The owner of ``src_block`` goes on writing into it, so the cache keeps
        the copy under the same keys.  The entries stay live: no events.
        """
        src_block = self._own(src_block)
        dst_block = self._own(dst_block)
        if dst_block._block_hash is not None or dst_block.block_id in self.cached_block_hashes_by_block:
            raise BlockHashConflictError(f"block {dst_block.block_id} already has hashes")
        if dst_block.is_null and src_block._block_hash is not None:
            raise NullBlockError("hashes cannot be moved onto the null block")
        num_tokens = src_block._block_hash_num_tokens
        for key in self._drop_hashes([src_block]):
            self._add_key(key, dst_block, num_tokens)

    def _insert_block_hash(
        self, block_hash_with_group_id: Checked[BlockHashWithGroupId], block: Checked[KVCacheBlock],
        num_tokens: Checked[int | None],
    ) -> None:
        """Index ``block`` under a key copied from elsewhere (vLLM's CPU offload pool does this).

        The caller copied the KV that the key names into ``block``; the key becomes
        the block's primary key if it has none (covering ``num_tokens`` tokens), else
        a secondary one.  A key the block already has changes nothing.  No events:
        the announcement is the caller's.
        """
        key = block_hash_with_group_id
        block = self._own(block)
        if type(key) is not bytes or len(key) <= 4:
            raise InvalidArgumentError(f"{key!r} is not an index key (a block hash and 4 group bytes)")
        if block.is_null:
            raise NullBlockError("the null block cannot be indexed")
        if not self.enable_caching:
            raise CachingDisabledError("_insert_block_hash on a pool without prefix caching")
        if block._block_hash is None and not (
                isinstance(num_tokens, int) and num_tokens > 0 and num_tokens % self.hash_block_size == 0):
            raise InvalidArgumentError(
                f"num_tokens {num_tokens!r} of a primary key is not a positive multiple of "
                f"{self.hash_block_size}")
        self._add_key(key, block, num_tokens)

    def _maybe_evict_cached_block(self, block: Checked[KVCacheBlock]) -> bool:
        """Drop ``block`` from the prefix cache; whether it had any entry.

        ``evict_blocks`` for one block object: vLLM's single-type manager calls it on
        a checkpoint block it is about to overwrite.  A metrics collector is told of
        the eviction, hashed or not.
        """
        block = self._own(block)
        removed = self._drop_hashes([block])
        self._emit_removed(removed)
        if self.metrics_collector:
            self._notify_each(self.metrics_collector.on_block_evicted, [block])
        return bool(removed)

    # ------------------------------------------------------- allocate and free

    def get_new_blocks(self, num_blocks: Checked[int]) -> list[KVCacheBlock]:
        """Hand out ``num_blocks`` blocks from the head of the free queue.

        Does not look in the prefix cache; a block's old hash is dropped here,
        when its KV is about to be overwritten, not when it was freed.
        """
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise InvalidArgumentError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        calls: list[_Call] | None = None
        watchers = self._reuse_watchers
        if watchers:
            calls = []
            for block in ret:
                watcher = watchers.pop(block.block_id, None)
                if watcher is not None:
                    calls.append((watcher, (block,)))
        for block in ret:
            block.ref_cnt = 1
        if self.enable_caching:  # lazy eviction: the old keys of the blocks handed out, announced at once
            self._emit_removed(self._drop_hashes(ret))
        metrics = self.metrics_collector
        if metrics:
            calls = calls or []
            for block in ret:
                if self.enable_caching:
                    calls.append((metrics.on_block_evicted, (block,)))
                calls.append((metrics.on_block_allocated, (block,)))
        if calls:
            exc = _run(calls)
            if exc is not None:
                for block in ret:
                    block.ref_cnt = 0
                self.free_block_queue.prepend_n(ret)
                raise exc
        return ret

    def unpin_blocks(self, blocks: Iterable[Checked[KVCacheBlock]], on_reuse: ReuseWatcher) -> None:
        """Release references to blocks that stay readable until reused.

        They join the tail of the free queue (evicted last, cached or not) and
        count as free; ``on_reuse`` fires when ``get_new_blocks`` hands one out
        or the cache is reset, so the reader knows to stop.
        """
        if not callable(on_reuse):
            raise InvalidArgumentError("on_reuse must be callable")
        # every block is this pool's before the null block is refused
        owned = [self._own(block) for block in blocks]
        for block in owned:
            if block.is_null:
                raise NullBlockError("the null block cannot be unpinned")
        released = self._release(owned, "unpin")
        watchers = self._reuse_watchers
        for block in owned:
            watchers[block.block_id] = on_reuse
        self.free_block_queue.append_n(released)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on each block for a request that hit it in the cache.

        An idle block leaves the free queue, so it can no longer be evicted.
        """
        # Typed as a list of blocks, so that the compiled build reads blocks natively.
        items: list[KVCacheBlock] = blocks if type(blocks) is list else list(blocks)
        queue = self.free_block_queue
        unlinked: list[KVCacheBlock] | None = None  # each taken idle block, then its predecessor
        try:
            for block in items:
                if block._holder is not self:
                    if block._holder is not queue:
                        raise UnknownBlockError(f"{block!r} is not a block of this pool")
                    # The free queue's remove, inlined: touch is the prefix-hit hot path.
                    prev = block.prev_free_block
                    nxt = block.next_free_block
                    if prev is None or nxt is None:
                        raise UnknownBlockError(f"block {block.block_id} is not in the free queue")
                    if unlinked is None:
                        unlinked = []
                    unlinked.append(block)
                    unlinked.append(prev)
                    prev.next_free_block = nxt
                    nxt.prev_free_block = prev
                    block.prev_free_block = block.next_free_block = None
                    block._holder = self
                block.ref_cnt += 1
        except (UnknownBlockError, AttributeError, TypeError) as exc:  # TypeError: compiled, not a block
            self._undo_touch(items, unlinked or [])
            raise UnknownBlockError(f"touch: {exc}") from None
        if unlinked:  # counted once, here, so a refused call never changed the count
            queue.num_free_blocks -= len(unlinked) // 2
        if self.metrics_collector:
            self._notify_each(self.metrics_collector.on_block_accessed, items)

    @staticmethod
    def _notify_each(callback: Callable[[KVCacheBlock], None], blocks: Sequence[KVCacheBlock]) -> None:
        """Tell a metrics hook about each block (kept out of the callers: a
        comprehension there would turn their hot locals into closure cells)."""
        failure = _run([(callback, (block,)) for block in blocks])
        if failure is not None:
            raise failure

    def _undo_touch(self, blocks: Sequence[Any], unlinked: list[KVCacheBlock]) -> None:
        """Reverse a touch that stopped at a block it could not take.

        Blocks are relinked in reverse order of removal, each after its old
        predecessor, which restores the free queue exactly.
        """
        # Blocks before the failing one were all taken, so all now have this pool as holder.
        stop = next(i for i, b in enumerate(blocks) if getattr(b, "_holder", None) is not self)
        for block in blocks[:stop]:
            block.ref_cnt -= 1
        queue = self.free_block_queue
        for i in reversed(range(0, len(unlinked), 2)):  # last taken first
            block, prev = unlinked[i], unlinked[i + 1]
            nxt = prev.next_free_block
            block.prev_free_block = prev
            block.next_free_block = nxt
            prev.next_free_block = block
            nxt.prev_free_block = block  # type: ignore[union-attr]
            block._holder = queue

    def is_block_writable(self, block: Checked[KVCacheBlock]) -> bool:
        """Whether the block's sole owner may write into it: no one shares it, no hash names it."""
        block = self._own(block)
        return not block.is_null and block.ref_cnt == 1 and block._block_hash is None

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per listed block; idle blocks rejoin the free queue.

        List blocks in the order they should be evicted.  Unhashed blocks go
        to the head (reused first, for locality); cached ones to the tail, in
        LRU order.  Blocks of other pools are handed to their own pool.
        """
        blocks: list[KVCacheBlock] = (
            ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks))
        caching = self.enable_caching
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        others: dict[Any, list[KVCacheBlock]] | None = None
        # Every refusal comes before its block changes, so on one the blocks
        # already counted down are those the iterator has passed, less one;
        # asking the iterator then keeps a counter out of the hot loop.
        pending = iter(blocks)
        try:
            for block in pending:
                if block._holder is not self:
                    if block._holder is self.free_block_queue:
                        raise BlockNotInUseError(
                            f"free block {block.block_id}: more releases than references")
                    others = self._foreign(others, block)
                    continue
                ref_cnt = block.ref_cnt - 1
                if ref_cnt <= 0 and not block.is_null:
                    if ref_cnt < 0:
                        raise BlockNotInUseError(
                            f"free block {block.block_id}: more releases than references")
                    if caching and block._block_hash is not None:
                        last.append(block)
                    else:
                        first.append(block)
                block.ref_cnt = ref_cnt
        except BaseException as exc:
            self._undo_release(blocks[:len(blocks) - length_hint(pending) - 1])
            if isinstance(exc, (AttributeError, TypeError)):  # TypeError: compiled, not a block
                raise UnknownBlockError(f"free: not a KV-cache block: {exc}") from None
            if isinstance(exc, BlockNotInUseError):
                # as the model checks every id before counting: an unknown block later on wins
                rest: Iterable[Any] = pending  # untyped: the compiled build would check each item
                for later in rest:
                    if not isinstance(later, KVCacheBlock) or later.pool is None:
                        raise UnknownBlockError(f"{later!r} is not a block of this pool") from None
            raise
        if others:
            try:
                for pool, theirs in others.items():
                    if isinstance(pool, BlockPool):
                        pool._check_release(theirs, "free")
            except BaseException:
                self._undo_release(blocks)
                raise
        self.free_block_queue.prepend_n(first)
        self.free_block_queue.append_n(last)
        if others:
            for pool, theirs in others.items():
                pool.free_blocks(theirs)

    @staticmethod
    def _foreign(
        others: dict[Any, list[KVCacheBlock]] | None, block: KVCacheBlock
    ) -> dict[Any, list[KVCacheBlock]]:
        """Set aside a block of another pool; refuse one of no pool."""
        if block.pool is None:
            raise UnknownBlockError(f"{block!r} belongs to no pool")
        if others is None:
            others = {}
        others.setdefault(block.pool, []).append(block)
        return others

    def evict_blocks(self, block_ids: Iterable[Checked[int]]) -> None:
        """Drop the given blocks from the prefix cache (by id).

        Blocks in use stay allocated and idle ones keep their queue place;
        only their index entries go.
        """
        ids = list(block_ids)
        n = len(self.blocks)
        for block_id in ids:
            if not isinstance(block_id, int) or not 0 <= block_id < n:
                raise UnknownBlockError(f"Invalid block_id {block_id!r}: not in [0, {n})")
        blocks = [self.blocks[block_id] for block_id in ids]
        self._emit_removed(self._drop_hashes(blocks))
        if self.metrics_collector:
            self._notify_each(self.metrics_collector.on_block_evicted, blocks)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after a weight update).

        Refused, returning False and changing nothing, while any block other
        than the null block is in use: their hashes would outlive the reset.
        """
        in_use = self.num_gpu_blocks - self.get_num_free_blocks()
        if in_use != 1:
            logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet",
                           in_use - 1)
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block.clear()
        calls: list[_Call] = [(w, (self.blocks[b],)) for b, w in self._reuse_watchers.items()]
        self._reuse_watchers.clear()
        for block in self.blocks:
            block._block_hash = None
            block._block_hash_num_tokens = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(all_blocks_cleared())
        if self.metrics_collector:
            calls.append((self.metrics_collector.reset, ()))
        logger.info("Successfully reset prefix cache")
        exc = _run(calls)
        if exc is not None:
            raise exc
        return True

    # ----------------------------------------------------------------- queries

    def get_num_free_blocks(self) -> int:
        """How many blocks the free queue holds."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the real (non-null) blocks in use, between 0 and 1."""
        real = self.num_gpu_blocks - 1
        if not real:
            return 0.0
        return 1.0 - self.free_block_queue.num_free_blocks / real

    def take_events(self) -> list[KVCacheEvent]:
        """Hand over the pending events and start a new list."""
        if not self.enable_kv_cache_events:
            return []
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events


__all__ = ["BlockPool", "ReuseWatcher"]
