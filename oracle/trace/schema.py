"""The JSONL trace format (``oracle/TRACE_FORMAT.md``) as data: versions, limits, field kinds.

The reader (:mod:`.read`) and the writer (:mod:`.write`) both go by these
tables, and :func:`schema_gaps` checks them against the model's operations
and the oracle's event fields, so a new operation or a renamed parameter
cannot be silently left out of traces.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from kvpool.model import ACTIONS, QUERIES

from .. import abstraction

VERSION = 1
DEFAULT_REFERENCE = "0.31"
MAX_NUM_BLOCKS = 1 << 20
"""Largest pool a trace may declare: the model allocates per-block tuples."""
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
"""Every integer in a trace fits in 64 bits (signed or unsigned)."""
USAGE_TOLERANCE = 1e-9

Json = Any
# Argument kinds: "int", "ints" (list of int), "request", "watcher", "hash" (hex bytes),
# "bool", "bools?" (list of bool or null).
ARG_KINDS: dict[str, dict[str, str]] = {
    "get_new_blocks": {"num_blocks": "int"},
    "free_blocks": {"block_ids": "ints"},
    "touch": {"block_ids": "ints"},
    "unpin_blocks": {"block_ids": "ints", "on_reuse": "watcher"},
    "evict_blocks": {"block_ids": "ints"},
    "reset_prefix_cache": {},
    "cache_full_blocks": {
        "request": "request", "block_ids": "ints", "num_cached_blocks": "int",
        "num_full_blocks": "int", "block_size": "int", "kv_cache_group_id": "int",
        "block_mask": "bools?"},
    "cache_partial_block": {
        "request": "request", "block_id": "int", "num_tokens": "int", "kv_cache_group_id": "int",
        "block_size": "int", "replace_existing_hashes": "bool"},
    "move_block_hashes": {"src_id": "int", "dst_id": "int"},
    "emit_cached_block_events": {
        "request": "request", "num_cached_blocks": "int", "block_size": "int",
        "kv_cache_group_id": "int"},
    "take_events": {},
    "_insert_block_hash": {
        "request": "request", "prefix_tokens": "int", "kv_cache_group_id": "int", "block_id": "int",
        "num_tokens": "int?"},
    "_maybe_evict_cached_block": {"block_id": "int"},
    "get_cached_block": {"block_hash": "hash", "kv_cache_group_ids": "ints"},
    "is_block_writable": {"block_id": "int"},
    "get_num_free_blocks": {},
    "get_usage": {},
}
OPTIONAL_ARGS = {("cache_full_blocks", "block_mask"), ("cache_partial_block", "replace_existing_hashes")}
# Result kinds when the call did not raise.
RESULT_KINDS: dict[str, str] = {
    "get_new_blocks": "ints", "get_cached_block": "ints?", "cache_partial_block": "hash?",
    "reset_prefix_cache": "bool", "is_block_writable": "bool", "get_num_free_blocks": "int",
    "get_usage": "number", "take_events": "events", "_maybe_evict_cached_block": "bool",
}
HEADER_FIELDS = {"kvpool_trace": "int", "num_blocks": "int", "enable_caching": "bool",
                 "hash_block_size": "int", "enable_kv_cache_events": "bool", "medium": "str"}
STEP_FIELDS = {"op", "args", "result", "error", "events", "fired", "observation"}
OBSERVATION_FIELDS = ("ref", "free", "primary", "secondary", "index", "watched", "num_free")
REQUIRED_OBSERVATION = ("ref", "free", "primary", "num_free")
"""What any pool shows; the other fields are recorded where the pool exposes them."""
# Event fields: name -> (kind, required).  Optional ones default to null.
EVENT_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "BlockStored": {
        "block_hashes": ("hashes", True), "parent_block_hash": ("ehash?", True),
        "token_ids": ("ints", True), "block_size": ("int", True), "lora_id": ("int?", True),
        "medium": ("str?", True), "lora_name": ("str?", True), "extra_keys": ("any", False),
        "group_idx": ("int?", False), "kv_cache_spec_kind": ("str?", False),
        "kv_cache_spec_sliding_window": ("int?", False), "locality": ("str?", False),
        "ownership": ("str?", False), "session_id": ("str?", False)},
    "BlockRemoved": {
        "block_hashes": ("hashes", True), "medium": ("str?", True), "group_idx": ("int?", False),
        "locality": ("str?", False), "ownership": ("str?", False)},
    "AllBlocksCleared": {},
}



def schema_gaps() -> set[str]:
    """Operations (or event types) whose trace schema and the code disagree (empty when in step).

    The model may grow an operation or rename a parameter; this names it
    rather than letting traces silently miss it (a test asserts it is empty).
    """
    ops = set(ACTIONS) | set(QUERIES)
    gaps = set(ARG_KINDS) ^ ops
    for op in ops & set(ARG_KINDS):
        if list(inspect.signature(model_fn(op)).parameters)[1:] != list(ARG_KINDS[op]):
            gaps.add(op)
    for name, names in abstraction.EVENT_FIELDS.items():
        if list(names) != list(EVENT_FIELDS.get(name, {"?": ("", True)})):
            gaps.add(name)
    return gaps


class TraceError(ValueError):
    """A trace (or event stream) file that cannot be read; says where and why."""

    def __init__(self, path: str, line: int, what: str):
        super().__init__(f"{path}:{line}: {what}" if line else f"{path}: {what}")
        self.path, self.line, self.what = path, line, what


class FieldError(Exception):
    """A field of one JSON value is wrong; the reader adds file and line (-> TraceError)."""



def model_fn(op: str) -> Callable[..., Any]:
    """The model's action or query named ``op``; its parameters name a trace line's ``args``."""
    return ACTIONS.get(op) or QUERIES[op]


def is_int(v: Any) -> bool:
    """A JSON integer (``true`` is not one)."""
    return isinstance(v, int) and not isinstance(v, bool)


def show(v: Any) -> str:
    """A short rendering of a value for messages; never fails, even on deep nesting."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = [
    "ARG_KINDS", "DEFAULT_REFERENCE", "EVENT_FIELDS", "HEADER_FIELDS", "INT_MAX", "INT_MIN",
    "MAX_NUM_BLOCKS", "OBSERVATION_FIELDS", "OPTIONAL_ARGS", "RESULT_KINDS", "STEP_FIELDS",
    "USAGE_TOLERANCE", "VERSION", "FieldError", "Json", "TraceError", "is_int", "model_fn",
    "schema_gaps", "show",
]
