"""How the oracle reads a pool: its concrete keys, events and refusals as the model's.

The reference API (vLLM 0.31.0) fixes how a pool spells what the model
states abstractly:

* an index key is the block hash with the KV-cache group id appended as four
  big-endian bytes (the model: a pair ``(hash, group)``);
* an event is an object of a class named ``BlockStored``, ``BlockRemoved`` or
  ``AllBlocksCleared`` with vLLM's field names, each hash published as the
  low 64 bits of its big-endian value, or as the raw bytes when
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is off (the model: ``Stored``,
  ``Removed``, ``Cleared`` with the opaque hashes of the request);
* a refusal is an exception: kvpool's pool raises one typed error per kind,
  vLLM's raises ``ValueError`` when it runs out of blocks (the model: a
  ``Refusal`` with a kind).

This module is the only place that knows those forms, and it is written
here, not borrowed from ``kvpool.impl``: code shared by the pool and its
checker is code the check cannot see.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from itertools import groupby
from typing import Any

from kvpool.model.events import Cleared, Event, Removed
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.state import Key

GROUP_BYTES = 4
_LOW_64_BITS = (1 << 64) - 1

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    "AllBlocksCleared": (),
}
"""vLLM's event classes and their fields, in declaration order."""

REFUSAL_NAMES: dict[RefusalKind, str] = {
    RefusalKind.NOT_ENOUGH_FREE_BLOCKS: "NotEnoughFreeBlocksError",
    RefusalKind.INVALID_ARGUMENT: "InvalidArgumentError",
    RefusalKind.UNKNOWN_BLOCK: "UnknownBlockError",
    RefusalKind.NULL_BLOCK: "NullBlockError",
    RefusalKind.NOT_IN_USE: "BlockNotInUseError",
    RefusalKind.HASH_CONFLICT: "BlockHashConflictError",
    RefusalKind.CACHING_DISABLED: "CachingDisabledError",
}
"""The name of the error a pool with typed refusals raises for each kind (kvpool's)."""

_KIND_OF_NAME = {name: kind for kind, name in REFUSAL_NAMES.items()}


# ---------------------------------------------------------------- keys


def key_of(concrete: bytes) -> Key:
    """A pool's index key as the model's ``(hash, group)``."""
    return bytes(concrete[:-GROUP_BYTES]), int.from_bytes(concrete[-GROUP_BYTES:], "big")


def concrete_key(key: Key) -> bytes:
    """The model's key as a pool spells it (for traces written in the pool's terms)."""
    block_hash, group = key
    return block_hash + group.to_bytes(GROUP_BYTES, "big")


def published(block_hash: bytes) -> int | bytes:
    """A hash as events publish it (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    raw = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES")
    if raw is not None and raw.strip().lower() in ("0", "false", "no", "off", ""):
        return block_hash
    return int.from_bytes(block_hash, "big") & _LOW_64_BITS


# ---------------------------------------------------------------- events


def event_type(event: Any) -> str | None:
    """Which of vLLM's event types ``event`` is, by its class name (None: not an event)."""
    name = type(event).__name__
    return name if name in EVENT_FIELDS else None


def pool_event(event: Any) -> dict[str, Any]:
    """A pool's event as ``{"type": ..., field: value}``, read by vLLM's field names.

    Any class works, vLLM's msgspec structs, kvpool's dataclasses or a pool's
    own, as long as it is named like vLLM's and has its fields; a field the
    class lacks reads as ``None`` (vLLM's default for every optional field).
    """
    kind = event_type(event)
    if kind is None:
        return {"type": type(event).__name__}
    return {"type": kind, **{name: _plain(getattr(event, name, None)) for name in EVENT_FIELDS[kind]}}


def model_event(event: Event) -> dict[str, Any]:
    """The model's event as a reference pool must emit it, in :func:`pool_event`'s form (sequences
    as lists, every field the model does not state ``None``), so the two compare field by field."""
    if isinstance(event, Cleared):
        return {"type": "AllBlocksCleared"}
    stated: dict[str, Any]
    if isinstance(event, Removed):
        kind, stated = "BlockRemoved", {"block_hashes": [published(event.hash)]}
    else:
        kind, stated = "BlockStored", {
            "block_hashes": [published(h) for h in event.hashes],
            "parent_block_hash": None if event.parent is None else published(event.parent),
            "token_ids": list(event.token_ids), "block_size": event.block_size, "lora_id": event.lora_id,
            "lora_name": event.lora_name, "extra_keys": _plain(event.extra_keys),
            "session_id": event.session_id}
    return {"type": kind, **dict.fromkeys(EVENT_FIELDS[kind]), **stated, "medium": event.medium,
            "group_idx": event.group}


_SCALARS = frozenset((int, str, bytes, bool, float, type(None)))


def _plain(value: Any) -> Any:
    """Sequences as lists, recursively, so that tuples and lists compare equal."""
    if type(value) not in _SCALARS and isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def removals_in_order(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with each run of consecutive ``BlockRemoved`` in one canonical order.

    vLLM keeps a block's partial-entry keys in a set and removes them in its
    iteration order: within a run of removals the order is no promise (and
    means nothing to a consumer, who counts copies per key).
    """
    if sum(1 for e in events if e.get("type") == "BlockRemoved") < 2:
        return list(events)  # no run to put in order
    out: list[dict[str, Any]] = []
    for removed, run in groupby(events, key=lambda e: e.get("type") == "BlockRemoved"):
        group = list(run)
        out += sorted(group, key=repr) if removed else group
    return out


def event_differences(model: Sequence[Event], pool: Sequence[Any]) -> list[str]:
    """Where a pool's events differ from the model's (empty when they agree): only the differing
    fields, by name and value, whatever classes the pool's events are (:func:`removals_in_order`)."""
    out = []
    wants = removals_in_order([model_event(m) for m in model])
    gots = removals_in_order([pool_event(p) for p in pool])
    for i, (want, got) in enumerate(zip(wants, gots, strict=False)):
        if want["type"] != got["type"]:
            out.append(f"event {i}: model {want['type']} | pool {got['type']}")
            continue
        for name in EVENT_FIELDS[want["type"]]:
            if want[name] != got[name]:
                out.append(f"event {i} ({want['type']}).{name}: model {short(want[name])} "
                           f"| pool {short(got[name])}")
    if len(model) != len(pool):
        extra = (f"model also {[model_event(e)['type'] for e in model[len(pool):]]}"
                 if len(model) > len(pool) else
                 f"pool also {[pool_event(e)['type'] for e in pool[len(model):]]}")
        out.append(f"events: model {len(model)} | pool {len(pool)} ({extra})")
    return out


# ---------------------------------------------------------------- refusals


def refusal_kind(error: BaseException | None) -> RefusalKind | None:
    """The kind of a typed refusal, by the class name of the error or of a base class."""
    return next((_KIND_OF_NAME[c.__name__] for c in type(error).__mro__ if c.__name__ in _KIND_OF_NAME), None)


def refusal_name(error: BaseException) -> str:
    """How a refusal is named in reports and traces: kvpool's error class for a model refusal."""
    if isinstance(error, Refusal):
        return REFUSAL_NAMES[error.kind]
    return type(error).__name__


def same_refusal(model_error: Exception, pool_error: Exception | None) -> bool:
    """Strict: the pool refused with the typed error of the model's kind."""
    return isinstance(model_error, Refusal) and refusal_kind(pool_error) is model_error.kind


def _out_of_blocks(error: BaseException) -> bool:
    return isinstance(error, Refusal) and error.kind is RefusalKind.NOT_ENOUGH_FREE_BLOCKS


def vllm_refusal(model_error: Exception, pool_error: Exception | None) -> bool:
    """vLLM's pool: out of blocks is a plain ``ValueError`` with the model's message."""
    return any_value_error(model_error, pool_error) and (
        not _out_of_blocks(model_error) or str(pool_error) == str(model_error))


def any_value_error(model_error: Exception, pool_error: Exception | None) -> bool:
    """A pool other than kvpool's: out of blocks is any ``ValueError``, whatever its message
    (``--strict-messages`` asks for vLLM's exact one: :func:`vllm_refusal`)."""
    if _out_of_blocks(model_error):
        return isinstance(pool_error, ValueError) and (
            refusal_kind(pool_error) in (None, RefusalKind.NOT_ENOUGH_FREE_BLOCKS))
    return same_refusal(model_error, pool_error)


def names_refusal(recorded: str | None, model_error: BaseException | None, *,
                  vllm_errors: bool = False) -> bool:
    """Whether an error class name recorded in a trace is the model's refusal."""
    if model_error is None or recorded is None:
        return model_error is None and recorded is None
    if not isinstance(model_error, Refusal):
        return recorded == type(model_error).__name__
    if recorded == REFUSAL_NAMES[model_error.kind]:
        return True
    return vllm_errors and _out_of_blocks(model_error) and recorded == "ValueError"


SHOWN_EVENTS = 4
"""Events of one result a message shows (the rest are counted): a line stays readable."""


def short(value: Any) -> str:
    """A value as messages show it: a hash by its last three bytes (``…a1b2c3``, as pictures
    name it), a key as ``…a1b2c3/g0``, a request by its id, an event by its fields so shortened."""
    if type(value) is list and all(type(v) is int for v in value):  # block ids, on every call: at once
        return repr(value)
    if hasattr(value, "request_id"):
        return f"<request {value.request_id}>"
    if isinstance(value, bytes):
        return "…" + value[-3:].hex()
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bytes)
            and isinstance(value[1], int)):
        return f"{short(value[0])}/g{value[1]}"
    if isinstance(value, (list, tuple)):
        shown = value
        if len(value) > SHOWN_EVENTS and all(is_dataclass(v) for v in value):  # a long take of events
            shown = value[:SHOWN_EVENTS]
        inner = ", ".join(short(v) for v in shown) + (f", … {len(value) - len(shown)} more"
                                                      if len(shown) < len(value) else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if is_dataclass(value) and not isinstance(value, type):
        named = ", ".join(f"{f.name}={short(getattr(value, f.name))}" for f in fields(value))
        return f"{type(value).__name__}({named})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {short(v)}" for k, v in value.items()) + "}"
    return repr(value)

