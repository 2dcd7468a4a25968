"""The free queue: a doubly linked list threaded through the blocks.

Its order is the eviction order: ``popleft`` hands out the head.  Links live
in the blocks themselves, so removing a block from the middle (a prefix hit
on an idle cached block) is O(1) and no node objects are allocated.  Two
sentinels bracket the list so that no operation needs an emptiness branch.
Every block entering the queue gets the queue as its holder, and every block
leaving it gets the queue's owner (see ``KVCacheBlock``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from .block import KVCacheBlock
from .errors import NotEnoughFreeBlocksError, UnknownBlockError
from .native import mypyc_attr

if TYPE_CHECKING:
    from .pool import BlockPool


@mypyc_attr(allow_interpreted_subclasses=True)  # pickled with its pool
class FreeKVCacheBlockQueue:
    """Free blocks, head first; ``num_free_blocks`` is kept in step."""

    __slots__ = ("fake_free_list_head", "fake_free_list_tail", "num_free_blocks", "owner")

    def __init__(self, blocks: Sequence[KVCacheBlock], *, owner: BlockPool | None = None) -> None:
        self.owner = owner  # the pool whose idle blocks these are; holds blocks taken out
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.num_free_blocks = 0
        self._splice(self.fake_free_list_head, self.fake_free_list_tail, blocks)

    def popleft(self) -> KVCacheBlock:
        """Take the head block."""
        if self.num_free_blocks == 0:
            raise NotEnoughFreeBlocksError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first ``n`` blocks, in order."""
        if n > self.num_free_blocks or n < 0:
            raise NotEnoughFreeBlocksError(f"Cannot get {n} free blocks from the pool")
        if n == 0:
            return []
        head = self.fake_free_list_head
        # Inside the sentinels every link is a block: typed so, the compiled build reads them natively.
        block: KVCacheBlock = head.next_free_block  # type: ignore[assignment]
        out = [block] * n  # made at its size, filled in place: no append per block
        owner = self.owner
        for i in range(n):
            out[i] = block
            nxt: KVCacheBlock = block.next_free_block  # type: ignore[assignment]
            block.prev_free_block = block.next_free_block = None
            block._holder = owner
            block = nxt
        head.next_free_block = block
        block.prev_free_block = head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue."""
        prev = block.prev_free_block
        nxt = block.next_free_block
        if prev is None or nxt is None:
            raise UnknownBlockError(f"block {block.block_id} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        block._holder = self.owner
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (evicted last)."""
        self.append_n((block,))

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the tail, in order."""
        tail = self.fake_free_list_tail
        self._splice(tail.prev_free_block, tail, blocks)  # type: ignore[arg-type]

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the head, in order (the first is handed out first)."""
        head = self.fake_free_list_head
        self._splice(head, head.next_free_block, blocks)  # type: ignore[arg-type]

    def _splice(self, prev: KVCacheBlock, after: KVCacheBlock, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks``, in order, between the adjacent ``prev`` and ``after``."""
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            block._holder = self
            prev = block
        prev.next_free_block = after
        after.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """Free blocks in eviction order, after ``cursor`` (from the head if None)."""
        block = (cursor or self.fake_free_list_head).next_free_block
        tail = self.fake_free_list_tail
        while block is not None and block is not tail:
            yield block
            block = block.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block, head first."""
        return list(self.iter_blocks_after(None))
