"""The prefix-cache index: key -> one block, or several with the same key.

Identical prefixes computed by different requests are not merged (block
tables are append-only, so a block id never changes), hence a multimap.  The
common single-block case stores the block itself rather than a one-entry
dict, which keeps garbage-collector work down.
"""

from __future__ import annotations

from collections.abc import Iterator

from .block import KVCacheBlock
from .keys import BlockHashWithGroupId
from .native import mypyc_attr

Entry = KVCacheBlock | dict[int, KVCacheBlock]


def earliest(blocks: dict[int, KVCacheBlock]) -> KVCacheBlock:
    """The first block of a several-block entry (an entry is never empty)."""
    for block in blocks.values():  # compiled: a native walk, no iterator object looked up by name
        return block
    raise LookupError("an empty index entry")


@mypyc_attr(allow_interpreted_subclasses=True)  # pickled with its pool
class BlockHashToBlockMap:
    """Key -> blocks, in insertion order; a lookup returns the earliest."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, Entry] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The earliest block still indexed under ``key``."""
        entry = self._cache.get(key)
        if entry is None or type(entry) is KVCacheBlock:
            return entry
        return earliest(entry)  # type: ignore[arg-type]

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        """Whether ``key`` maps to the block with ``block_id``."""
        entry = self._cache.get(key)
        if entry is None:
            return False
        if type(entry) is KVCacheBlock:
            return entry.block_id == block_id
        return block_id in entry  # type: ignore[operator]

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Index ``block`` under ``key`` (after any blocks already there)."""
        entry = self._cache.get(key)
        if entry is None:
            self._cache[key] = block
        elif type(entry) is KVCacheBlock:
            self._cache[key] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block  # type: ignore[index]

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove the entry (key, block_id); the removed block, or None."""
        entry = self._cache.get(key)
        if entry is None:
            return None
        if type(entry) is KVCacheBlock:
            if entry.block_id != block_id:
                return None
            del self._cache[key]
            return entry
        block = entry.pop(block_id, None)  # type: ignore[union-attr]
        if not entry:
            del self._cache[key]
        return block

    def blocks_of(self, key: BlockHashWithGroupId) -> list[KVCacheBlock]:
        """Every block under ``key``, earliest first."""
        entry = self._cache.get(key)
        if entry is None:
            return []
        if type(entry) is KVCacheBlock:
            return [entry]
        return list(entry.values())  # type: ignore[union-attr]

    def keys(self) -> Iterator[BlockHashWithGroupId]:
        """Every key with at least one block."""
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)
