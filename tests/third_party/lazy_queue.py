"""``mypool.BlockPool`` with a faster free queue: a list with lazy deletion, compacted now and then.

A prefix hit on an idle block takes it out of the middle of the free queue.
``LazyFreeQueue`` does not shift the list for that: it leaves a hole, which
``take`` skips when the head reaches it, and squeezes the holes out when they
outnumber the live blocks.  Blocks pushed to the front go into the room the
head left behind (the list is regrown with room when there is none).

The compaction has a one-word bug: it collects the live blocks in the order of
the position map (a dict, in the order blocks were queued) instead of sorted
by position.  The two orders agree until a block pushed to the front is still
queued when a compaction runs; then that block moves from the head to where
its insertion falls, and the eviction order is broken.  That takes many
removals from the middle of a queue that the head does not sweep: a
long-lived pool with many hits on idle cached blocks between allocations.
Short runs on small pools never compact (``tests/test_long_lived.py``).
Standard library only, like ``mypool``.
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
    from mypool import Block, BlockPool
else:
    BlockPool, Block = _sibling("mypool").BlockPool, _sibling("mypool").Block

COMPACT_AT = 64
"""Holes that may wait before a compaction (and only once they outnumber the live blocks)."""
ROOM = 16
"""Room kept before the head for blocks pushed to the front."""


class LazyFreeQueue:
    """Idle blocks in eviction order: a list with holes for blocks taken out of the middle."""

    def __init__(self, blocks: Iterable[Block], fixed: bool = False) -> None:
        self._slots: list[Block | None] = []
        self._head = 0
        self._at: dict[int, int] = {}
        """Each queued block's position in ``_slots``, by block id."""
        self._holes = 0
        self.fixed = fixed
        """Whether the compaction sorts by position (the correct queue)."""
        self.compactions = 0
        self._regrow(ROOM, list(blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._at)

    def get_all_free_blocks(self) -> list[Block]:
        return [b for b in self._slots[self._head:] if b is not None]

    def take(self, n: int) -> list[Block]:
        out: list[Block] = []
        while len(out) < n:
            block = self._slots[self._head]
            self._slots[self._head] = None
            self._head += 1
            if block is None:
                self._holes -= 1
                continue
            del self._at[block.block_id]
            out.append(block)
        return out

    def remove(self, block: Block) -> None:
        self._slots[self._at.pop(block.block_id)] = None
        self._holes += 1
        if self._holes > COMPACT_AT and self._holes > len(self._at):
            self._compact()

    def push_front(self, blocks: Sequence[Block]) -> None:
        if self._head < len(blocks):
            self._regrow(len(blocks) + ROOM, [b for b in self._slots[self._head:] if b is not None])
        for block in reversed(blocks):
            self._head -= 1
            self._slots[self._head] = block
            self._at[block.block_id] = self._head

    def push_back(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            self._at[block.block_id] = len(self._slots)
            self._slots.append(block)

    def _regrow(self, room: int, live: list[Block]) -> None:
        """The queued blocks, in order, after ``room`` empty slots."""
        self._slots = [None] * room + list(live)
        self._head = room
        self._holes = 0
        self._at = {b.block_id: room + i for i, b in enumerate(live)}

    def _compact(self) -> None:
        """Squeeze the holes out (the planted bug: the live blocks in the map's order)."""
        self.compactions += 1
        places = sorted(self._at.values()) if self.fixed else list(self._at.values())
        self._regrow(ROOM, [self._slots[i] for i in places])  # type: ignore[misc]


class LazyQueuePool(BlockPool):
    """``mypool.BlockPool`` on :class:`LazyFreeQueue` (with its compaction bug)."""

    fixed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.free_block_queue = LazyFreeQueue(self.free_block_queue.get_all_free_blocks(), self.fixed)


class FixedLazyQueuePool(LazyQueuePool):
    """The same pool with the compaction sorted by position: agrees with the model."""

    fixed = True
