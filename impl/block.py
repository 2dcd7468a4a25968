"""Block metadata: one object per physical KV-cache block."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import BlockHashConflictError
from .keys import BlockHashWithGroupId
from .native import mypyc_attr

if TYPE_CHECKING:
    from .free_queue import FreeKVCacheBlockQueue
    from .pool import BlockPool


# Compiled, as interpreted: pickled, copied and subclassed like any Python class.
@mypyc_attr(allow_interpreted_subclasses=True)
class KVCacheBlock:
    """A block's id, reference count, primary hash and free-list links.

    Only the pool changes these fields; the links belong to the free queue.
    The constructor takes vLLM's fields; unlike vLLM's dataclass, blocks
    compare (and hash) by identity: two blocks are equal only if they are one.

    ``_holder`` says who has the block: its pool's free queue while it waits
    there, its pool while requests hold it (or it is the null block), None for
    a block of no pool.  ``touch`` and ``free_blocks`` need "a block of this
    pool, not in its free queue" for every block, and this makes that one
    identity test; the free queue keeps it in step as blocks enter and leave.
    """

    # Hot fields first: touch and free read ref_cnt, _holder and is_null of every block.
    __slots__ = (  # noqa: RUF023
        "ref_cnt",
        "_holder",
        "is_null",
        "_block_hash",
        "block_id",
        "prev_free_block",
        "next_free_block",
        "_block_hash_num_tokens",
    )

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: BlockHashWithGroupId | None = None,
        _block_hash_num_tokens: int | None = None,
        prev_free_block: KVCacheBlock | None = None,
        next_free_block: KVCacheBlock | None = None,
        is_null: bool = False,
        *,
        pool: BlockPool | None = None,
    ) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self._holder: BlockPool | FreeKVCacheBlockQueue | None = pool
        self._block_hash = _block_hash
        self._block_hash_num_tokens = _block_hash_num_tokens
        self.prev_free_block = prev_free_block
        self.next_free_block = next_free_block
        self.is_null = is_null

    @property
    def pool(self) -> BlockPool | None:
        """The pool this block belongs to (None for a block made outside any pool)."""
        from .free_queue import FreeKVCacheBlockQueue  # here: that module imports this one

        holder = self._holder
        return holder.owner if isinstance(holder, FreeKVCacheBlockQueue) else holder

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        """The primary index key, while the block is cached."""
        return self._block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        """How many prefix tokens the primary key covers."""
        return self._block_hash_num_tokens

    def set_block_hash(self, block_hash: BlockHashWithGroupId, num_tokens: int | None = None) -> None:
        """Give an unhashed block its primary key."""
        if self._block_hash is not None:
            raise BlockHashConflictError(f"block {self.block_id} already has a hash")
        self._block_hash = block_hash
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Forget the primary key (the block left the prefix cache)."""
        self._block_hash = None
        self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, "
            f"_block_hash_num_tokens={self._block_hash_num_tokens}, "
            f"prev_free_block={prev_id}, next_free_block={next_id})"
        )
