"""KV-cache events, field for field as vLLM publishes them.

Dataclasses rather than msgspec structs so that the pool has no runtime
dependency; equality is by value, so events from vLLM can be compared after
converting them with :func:`from_fields`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeAlias, TypeVar

from .hashing import generate_block_hash_extra_keys, get_mm_features_in_window, to_event_extra_keys
from .keys import BlockHashWithGroupId, ExternalBlockHash, get_group_id, key_event_hash
from .native import mypyc_attr

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


_T = TypeVar("_T")
# A field's type as events carry it, or anything else: events keep what they are given
# (a request's token sequence need not be a list), and a compiled field typed ``T``
# would refuse other values with TypeError.
Kept: TypeAlias = _T | Any


# Dataclasses in either build: compared by value, pickled, copied, ``dataclasses.fields``.
# Compiled, they are native classes whose hand-written ``__init__`` is compiled too (the one
# ``dataclass`` generates stays Python, and the pool builds one event per evicted key), and
# ``acyclic``: like vLLM's msgspec events (``gc=False``), the collector does not track them
# (an event holds lists of numbers and strings, never itself).
@mypyc_attr(allow_interpreted_subclasses=True, acyclic=True)
@dataclass(slots=True)
class KVCacheEvent:
    """Base of every event the pool emits."""


@mypyc_attr(allow_interpreted_subclasses=True, acyclic=True)
@dataclass(slots=True)
class BlockStored(KVCacheEvent):
    """Blocks became reachable under ``block_hashes`` (a chain, parent first)."""

    block_hashes: Kept[list[ExternalBlockHash]]
    parent_block_hash: Kept[ExternalBlockHash | None]
    token_ids: Kept[list[int]]
    block_size: Kept[int]
    lora_id: Kept[int | None]
    medium: Kept[str | None]
    lora_name: Kept[str | None]
    extra_keys: Kept[list[tuple[Any, ...] | None] | None] = None
    group_idx: Kept[int | None] = None
    kv_cache_spec_kind: Kept[str | None] = None
    kv_cache_spec_sliding_window: Kept[int | None] = None
    locality: Kept[str | None] = None
    ownership: Kept[str | None] = None
    session_id: Kept[str | None] = None

    def __init__(
        self, block_hashes: Any, parent_block_hash: Any, token_ids: Any, block_size: Any,
        lora_id: Any, medium: Any, lora_name: Any, extra_keys: Any = None, group_idx: Any = None,
        kv_cache_spec_kind: Any = None, kv_cache_spec_sliding_window: Any = None,
        locality: Any = None, ownership: Any = None, session_id: Any = None,
    ) -> None:
        self.block_hashes = block_hashes
        self.parent_block_hash = parent_block_hash
        self.token_ids = token_ids
        self.block_size = block_size
        self.lora_id = lora_id
        self.medium = medium
        self.lora_name = lora_name
        self.extra_keys = extra_keys
        self.group_idx = group_idx
        self.kv_cache_spec_kind = kv_cache_spec_kind
        self.kv_cache_spec_sliding_window = kv_cache_spec_sliding_window
        self.locality = locality
        self.ownership = ownership
        self.session_id = session_id


@mypyc_attr(allow_interpreted_subclasses=True, acyclic=True)
@dataclass(slots=True)
class BlockRemoved(KVCacheEvent):
    """One index entry went away."""

    block_hashes: Kept[list[ExternalBlockHash]]
    medium: Kept[str | None]
    group_idx: Kept[int | None] = None
    locality: Kept[str | None] = None
    ownership: Kept[str | None] = None

    def __init__(self, block_hashes: Any, medium: Any, group_idx: Any = None, locality: Any = None,
                 ownership: Any = None) -> None:
        self.block_hashes = block_hashes
        self.medium = medium
        self.group_idx = group_idx
        self.locality = locality
        self.ownership = ownership


@mypyc_attr(allow_interpreted_subclasses=True, acyclic=True)
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
    "EventClasses",
    "KVCacheEvent",
    "all_blocks_cleared",
    "announce_removed",
    "block_removed",
    "block_stored",
    "event_fields",
    "extra_keys_of_blocks",
    "extra_keys_of_chunk",
    "from_fields",
    "use_event_classes",
    "use_vllm_event_classes",
]


class EventClasses:
    """The classes events are built from; vLLM's own inside a vLLM engine.

    vLLM's KV-cache manager annotates events with ``isinstance(event,
    BlockStored)`` against its msgspec classes and publishes them with
    msgspec, so a pool running inside vLLM must emit those classes:
    :func:`use_vllm_event_classes` switches to them.
    """

    stored: ClassVar[Any] = BlockStored
    removed: ClassVar[Any] = BlockRemoved
    cleared: ClassVar[Any] = AllBlocksCleared


def use_event_classes(stored: Any, removed: Any, cleared: Any) -> tuple[Any, Any, Any]:
    """Build events from these classes from now on; returns the previous ones."""
    previous = (EventClasses.stored, EventClasses.removed, EventClasses.cleared)
    EventClasses.stored, EventClasses.removed, EventClasses.cleared = stored, removed, cleared
    return previous


def use_vllm_event_classes() -> tuple[Any, Any, Any]:
    """Emit ``vllm.distributed.kv_events`` classes (for use inside a vLLM engine)."""

    kv_events = importlib.import_module("vllm.distributed.kv_events")
    return use_event_classes(kv_events.BlockStored, kv_events.BlockRemoved,
                             kv_events.AllBlocksCleared)


def _removed(cls: Any, key_hash: ExternalBlockHash, medium: str, group_id: int) -> Any:
    if cls is BlockRemoved:  # one per evicted key: positional, in this class's field order, is cheaper
        return BlockRemoved([key_hash], medium, group_id)
    return cls(block_hashes=[key_hash], medium=medium, group_idx=group_id)


def block_removed(key_hash: ExternalBlockHash, medium: str, group_id: int) -> Any:
    """The ``BlockRemoved`` (of the classes in use) for one index entry."""
    return _removed(EventClasses.removed, key_hash, medium, group_id)


def announce_removed(queue: list[Any], keys: list[BlockHashWithGroupId], medium: str) -> None:
    """Append the ``BlockRemoved`` of each removed index key to ``queue``, in order.

    One call per allocation, not per evicted key: the classes in use are looked up once.
    """
    cls = EventClasses.removed
    for key in keys:
        queue.append(_removed(cls, key_event_hash(key), medium, get_group_id(key)))


def all_blocks_cleared() -> Any:
    """The ``AllBlocksCleared`` of a reset."""
    return EventClasses.cleared()


def block_stored(
    request: Any, block_hashes: list[ExternalBlockHash], parent: ExternalBlockHash | None,
    start: int, end: int, block_size: int, group_id: int, medium: str,
    extra_keys: list[tuple[Any, ...] | None],
) -> Any:
    """The ``BlockStored`` (of the classes in use) announcing ``request``'s tokens ``[start, end)``."""
    lora = request.lora_request
    token_ids = request.all_token_ids[start:end]
    lora_id = lora.adapter_id if lora else None
    lora_name = lora.name if lora else None
    keys = to_event_extra_keys(extra_keys)
    session_id = request.session_id
    cls = EventClasses.stored
    if cls is BlockStored:  # positional, in field order: compiled, a direct call of its __init__
        return BlockStored(block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
                           keys, group_id, None, None, None, None, session_id)
    return cls(
        block_hashes=block_hashes, parent_block_hash=parent, token_ids=token_ids,
        block_size=block_size, lora_id=lora_id, medium=medium, lora_name=lora_name,
        extra_keys=keys, group_idx=group_id, session_id=session_id)


def extra_keys_of_blocks(
    request: Any, block_indices: Sequence[int], block_size: int
) -> list[tuple[Any, ...] | None]:
    """Extra keys of the given blocks, scanning multimodal items from the first."""
    if not request.mm_features and getattr(request, "prompt_embeds", None) is None:
        # Most requests: the same keys for every block (the LoRA adapter, if any), and the
        # cache salt on the first chunk, as generate_block_hash_extra_keys gives them.
        lora = request.lora_request
        salt = request.cache_salt
        rest: tuple[Any, ...] = (("lora", lora.lora_name, lora.lora_path),) if lora else ()
        later = rest or None
        shared = [later] * len(block_indices)  # made at its size: one event per caching call
        if salt:
            first = (*rest, ("cache_salt", salt))
            for j, i in enumerate(block_indices):
                if i == 0:
                    shared[j] = first
        return shared
    out: list[tuple[Any, ...] | None] = []
    mm_idx = 0
    for i in block_indices:
        keys, mm_idx = generate_block_hash_extra_keys(
            request, i * block_size, (i + 1) * block_size, mm_idx)
        out.append(keys)
    return out


def extra_keys_of_chunk(request: Any, start: int, end: int) -> tuple[Any, ...] | None:
    """Extra keys of one chunk, finding its first multimodal item by window."""
    mm_idx = 0
    features = request.mm_features
    if start > 0 and features:
        last = features[-1].mm_position
        if last.offset + last.length > start:
            mm_idx, _ = get_mm_features_in_window(features, start, end)
    keys, _ = generate_block_hash_extra_keys(request, start, end, mm_idx)
    return keys
