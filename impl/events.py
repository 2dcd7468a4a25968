"""KV-cache events, field for field as vLLM publishes them.

Plain dataclasses rather than msgspec structs so that the pool has no runtime
dependency; equality is by value, so events from vLLM can be compared after
converting them with :func:`from_fields`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .keys import ExternalBlockHash

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


@dataclass(slots=True)
class KVCacheEvent:
    """Base of every event the pool emits."""


@dataclass(slots=True)
class BlockStored(KVCacheEvent):
    """Blocks became reachable under ``block_hashes`` (a chain, parent first)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


@dataclass(slots=True)
class BlockRemoved(KVCacheEvent):
    """One index entry went away."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(slots=True)
class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was dropped."""


EVENT_TYPES: dict[str, type[KVCacheEvent]] = {
    cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)
}


def event_fields(event: Any) -> dict[str, Any]:
    """The fields of a kvpool or vLLM event as a plain dict, tagged with its type."""
    cls = EVENT_TYPES.get(type(event).__name__)
    if cls is None:
        raise TypeError(f"not a KV-cache event: {event!r}")
    out: dict[str, Any] = {"type": cls.__name__}
    for f in fields(cls):
        out[f.name] = getattr(event, f.name)
    return out


def from_fields(data: dict[str, Any]) -> KVCacheEvent:
    """Rebuild a kvpool event from :func:`event_fields` output."""
    payload = dict(data)
    cls = EVENT_TYPES[payload.pop("type")]
    return cls(**payload)


__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "event_fields",
    "from_fields",
]
