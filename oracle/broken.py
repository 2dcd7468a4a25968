"""Deliberately broken pools, to show that the oracle catches real bugs.

Each is kvpool's pool with one classic block-pool mistake; point
``kvpool conform --impl kvpool.oracle.broken:NAME`` at one to see a divergence.
"""

from __future__ import annotations

from typing import Any

from kvpool.impl import BlockPool


class FreesHashedBlocksAtHead(BlockPool):
    """Cached blocks rejoin the free queue at the head, so hot prefixes are evicted first."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        enable = self.enable_caching
        self.enable_caching = False
        try:
            super().free_blocks(ordered_blocks)
        finally:
            self.enable_caching = enable


class ForgetsLazyEviction(BlockPool):
    """Reallocated blocks keep their old hash: a later hit serves another request's KV."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        enable = self.enable_caching
        self.enable_caching = False
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            self.enable_caching = enable


class TouchLeavesInFreeQueue(BlockPool):
    """A prefix hit takes a reference but leaves the block in the free queue (evictable)."""

    def touch(self, blocks: Any) -> None:
        for block in blocks:
            self._own(block)
        for block in blocks:
            block.ref_cnt += 1
