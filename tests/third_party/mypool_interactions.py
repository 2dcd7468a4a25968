"""The two bugs of issue 26 in ``mypool.BlockPool``: each shows only where features meet.

Found first by the campaign alone: the state machine missed them in thousands
of examples, and the campaign reported the last 12 of some 1,800 calls.
Standard library only, like ``mypool`` (loaded from beside this file).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any


def _mypool() -> Any:
    if "mypool" not in sys.modules:
        spec = importlib.util.spec_from_file_location("mypool", Path(__file__).with_name("mypool.py"))
        assert spec is not None and spec.loader is not None
        sys.modules["mypool"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["mypool"])
    return sys.modules["mypool"]


if TYPE_CHECKING:
    from mypool import Block, BlockPool
else:
    BlockPool, Block = _mypool().BlockPool, _mypool().Block


class PromotionKeepsPartialKeys(BlockPool):
    """A block holding a partial entry, cached whole, keeps its partial keys.

    The promotion path was written for a block's primary key: the old keys
    stay indexed as secondaries, so a hit on the shorter prefix finds a block
    that now holds more, and no ``BlockRemoved`` tells a router.
    """

    _promoting = False

    def cache_full_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._promoting = True
        try:
            super().cache_full_blocks(*args, **kwargs)
        finally:
            self._promoting = False

    def _drop_keys(self, block: Block) -> list[bytes]:
        if not self._promoting:
            return super()._drop_keys(block)
        kept = ([block.block_hash] if block.block_hash is not None else []) + block.secondary_keys
        block.block_hash = block.block_hash_num_tokens = None
        block.secondary_keys = kept
        return []


class EvictionAnnouncesPrimaryOnly(BlockPool):
    """An eviction drops all of a block's keys but announces only the primary key's removal.

    A router then keeps the partial prefixes of an evicted block.
    """

    def _evict(self, block: Block) -> None:
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        self._removed(self._drop_keys(block)[:1])
