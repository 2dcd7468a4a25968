"""The JSONL trace format (``oracle/TRACE_FORMAT.md``) as data: versions, limits, field kinds.

The reader (:mod:`.read`) and the writer (:mod:`.write`) both go by these
tables, made from the model's operations and the oracle's event fields, so a
new operation or a renamed parameter cannot be silently left out of traces.
"""

from __future__ import annotations

import json
from typing import Any

from kvpool.model import OPERATIONS

from ..core import abstraction

VERSION = 1
DEFAULT_REFERENCE = "0.31"
MAX_NUM_BLOCKS = 1 << 20
"""Largest pool a trace may declare: the model allocates per-block tuples."""
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
"""Every integer in a trace fits in 64 bits (signed or unsigned)."""
USAGE_TOLERANCE = 1e-9

Json = Any
TRACE_KIND: dict[str, str] = {
    "count": "int", "block": "int", "blocks": "ints", "block_ids": "ints", "request": "request",
    "watcher": "watcher", "hash": "hash", "group": "int", "groups": "ints", "size": "int",
    "tokens": "int", "tokens?": "int?", "flag": "bool", "mask?": "bools?",
}
"""How each kind of argument the model declares is written in a trace (blocks by their ids)."""
TRACE_RESULT: dict[str, str | None] = {
    "none": None, "blocks": "ints", "blocks?": "ints?", "key?": "hash?", "bool": "bool", "count": "int",
    "fraction": "number", "events": "events",
}
"""How each kind of result is written (None: the call returns nothing)."""

TRACED = {name: op for name, op in OPERATIONS.items() if op.role != "caller"}
"""The operations a trace records: every pool operation (the caller's own writes are not seen)."""
ARG_KINDS: dict[str, dict[str, str]] = {
    name: {a.name: TRACE_KIND[a.kind] for a in op.args} for name, op in TRACED.items()}
"""Per operation, its arguments by the model's names, and how each is written."""
OPTIONAL_ARGS = {(name, a.name) for name, op in TRACED.items() for a in op.args if a.optional}
RESULT_KINDS: dict[str, str] = {
    name: kind for name, op in TRACED.items() if (kind := TRACE_RESULT[op.result]) is not None}
"""Result kinds when the call did not raise."""
HEADER_FIELDS = {"kvpool_trace": "int", "num_blocks": "int", "enable_caching": "bool",
                 "hash_block_size": "int", "enable_kv_cache_events": "bool", "medium": "str"}
STEP_FIELDS = {"op", "args", "result", "error", "events", "fired", "observation"}
REQUEST_LINE = "kvpool_request"
"""The field of a request line (a request written once, then named by its number in call lines)."""
OBSERVATION_FIELDS = ("ref", "free", "primary", "secondary", "index", "watched", "num_free")
REQUIRED_OBSERVATION = ("ref", "free", "primary", "num_free")
"""What any pool shows; the other fields are recorded where the pool exposes them."""
EVENT_KINDS: dict[str, str] = {
    "block_hashes": "hashes", "parent_block_hash": "ehash?", "token_ids": "ints", "block_size": "int",
    "lora_id": "int?", "medium": "str?", "lora_name": "str?", "extra_keys": "any", "group_idx": "int?",
    "kv_cache_spec_kind": "str?", "kv_cache_spec_sliding_window": "int?", "locality": "str?",
    "ownership": "str?", "session_id": "str?"}
"""How each field of vLLM's events is written (whichever event has it)."""
REQUIRED_EVENT_FIELDS = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                         "lora_name"}
"""The fields every release of vLLM writes; the others may be left out, and default to null."""
EVENT_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    kind: {name: (EVENT_KINDS[name], name in REQUIRED_EVENT_FIELDS) for name in names}
    for kind, names in abstraction.EVENT_FIELDS.items()}
"""Per event type, its fields in the oracle's order (:mod:`kvpool.oracle.core.abstraction`, so that a
renamed field cannot be left out of traces): name -> (kind, required)."""


class TraceError(ValueError):
    """A trace (or event stream) file that cannot be read; says where and why."""

    def __init__(self, path: str, line: int, what: str):
        super().__init__(f"{path}:{line}: {what}" if line else f"{path}: {what}")
        self.path, self.line, self.what = path, line, what


class FieldError(Exception):
    """A field of one JSON value is wrong; the reader adds file and line (-> TraceError)."""


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


__all__ = ["ARG_KINDS", "DEFAULT_REFERENCE", "EVENT_FIELDS", "HEADER_FIELDS", "INT_MAX", "INT_MIN",
           "MAX_NUM_BLOCKS", "OBSERVATION_FIELDS", "OPTIONAL_ARGS", "REQUEST_LINE", "RESULT_KINDS",
           "STEP_FIELDS", "TRACED", "USAGE_TOLERANCE", "VERSION", "FieldError", "Json", "TraceError",
           "is_int", "show"]
