"""The hook a metrics collector implements (vLLM's KVCacheMetricsCollector)."""

from __future__ import annotations

from typing import Protocol

from .block import KVCacheBlock


class KVCacheMetricsCollector(Protocol):
    """Told about block residency; user code, so it may raise."""

    def on_block_allocated(self, block: KVCacheBlock) -> None: ...

    def on_block_accessed(self, block: KVCacheBlock) -> None: ...

    def on_block_evicted(self, block: KVCacheBlock) -> None: ...

    def reset(self) -> None: ...
