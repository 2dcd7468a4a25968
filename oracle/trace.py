"""JSONL traces of pool calls: record one from any pool, check one against the model.

A trace lets an implementation that cannot be imported here (another
language, another process) be checked: it writes what each call returned,
raised and emitted, and :func:`check_trace` replays the same calls on the
model and names the first line where they differ.  The format is specified
in ``oracle/TRACE_FORMAT.md``; this module is its reference reader and writer.

The reader is strict on purpose: a writer in another language gets a
:class:`TraceError` naming the file, the line and the field, rather than a
silent mismatch later.  It never raises anything else on bad input.
"""

from __future__ import annotations

import inspect
import json
import math
import random
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import ACTIONS, QUERIES, REFERENCES, Event, initial_state
from kvpool.model.state import PoolState

from . import abstraction
from .abstraction import names_refusal, refusal_name, same_refusal
from .lockstep import Divergence, Lockstep, Watcher
from .observe import Observation, observe_model
from .workload import Config, Workload

VERSION = 1
DEFAULT_REFERENCE = "0.31"
MAX_NUM_BLOCKS = 1 << 20
"""Largest pool a trace may declare: the model allocates per-block tuples."""
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
"""Every integer in a trace fits in 64 bits (signed or unsigned)."""
USAGE_TOLERANCE = 1e-9
_LOW_64 = (1 << 64) - 1

# ------------------------------------------------------------------ schema

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
    "get_usage": "number", "take_events": "events",
}
HEADER_FIELDS = {"kvpool_trace": "int", "num_blocks": "int", "enable_caching": "bool",
                 "hash_block_size": "int", "enable_kv_cache_events": "bool", "medium": "str"}
STEP_FIELDS = {"op", "args", "result", "error", "events", "fired", "observation"}
OBSERVATION_FIELDS = ("ref", "free", "primary", "secondary", "index", "watched", "num_free")
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
        if list(inspect.signature(_model_fn(op)).parameters)[1:] != list(ARG_KINDS[op]):
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


# ------------------------------------------------------------------ encoding (writer side)


def to_json(value: Any) -> Json:
    """Plain JSON form: bytes as lowercase hex, tuples as lists."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def event_to_json(event: Any) -> dict[str, Json]:
    """One event of a pool (any classes named like vLLM's) as a trace/event-stream object."""
    return {k: to_json(v) for k, v in abstraction.pool_event(event).items()}


def model_event_to_json(event: Event) -> dict[str, Json]:
    """One event of the model, as a reference pool would write it."""
    return {k: to_json(v) for k, v in abstraction.model_event(event).items()}


def request_to_json(req: Any) -> dict[str, Json]:
    """The request attributes the pool reads, as they are at this call."""
    if getattr(req, "prompt_embeds", None) is not None:
        raise ValueError("requests with prompt_embeds cannot be traced (format version 1)")
    lora = req.lora_request
    return {
        "request_id": str(req.request_id),
        "all_token_ids": list(req.all_token_ids),
        "block_hashes": [bytes(h).hex() for h in req.block_hashes],
        "lora": None if lora is None else {
            "name": lora.lora_name, "id": lora.lora_int_id, "path": lora.lora_path},
        "mm": [{"identifier": f.identifier, "offset": f.mm_position.offset,
                "length": f.mm_position.length} for f in req.mm_features or ()],
        "cache_salt": req.cache_salt,
        "session_id": req.session_id,
    }


def observation_to_json(obs: Observation) -> dict[str, Json]:
    """An :class:`Observation` with keys as the pool's hex bytes and tuples as lists."""
    key = abstraction.concrete_key
    out: dict[str, Json] = to_json({
        "ref": obs.ref, "free": obs.free,
        "primary": [None if p is None else (key(p[0]), p[1]) for p in obs.primary],
        "secondary": [[key(k) for k in keys] for keys in obs.secondary],
        "index": [(key(k), ids) for k, ids in obs.index],
        "watched": obs.watched, "num_free": obs.num_free,
    })
    return out


def encode_args(op: str, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Json]:
    """Name each argument after the model's parameter and encode it by its kind."""
    params = list(inspect.signature(_model_fn(op)).parameters)[1:]
    named = dict(zip(params, args, strict=False))
    named.update(kwargs)
    out: dict[str, Json] = {}
    for name, value in named.items():
        kind = ARG_KINDS[op][name]
        if kind == "request":
            out[name] = request_to_json(value)
        elif kind == "watcher":
            out[name] = value.name if isinstance(value, Watcher) else repr(value)
        elif kind == "ints":
            out[name] = [getattr(b, "block_id", b) for b in value]
        else:
            out[name] = to_json(getattr(value, "block_id", value))
    return out


def encode_result(op: str, result: Any) -> Json:
    """A pool's return value in the trace's form (blocks as ids)."""
    if result is None:
        return None
    kind = RESULT_KINDS.get(op)
    if kind in ("ints", "ints?"):
        return [getattr(b, "block_id", b) for b in result]
    if kind == "events":
        return [event_to_json(e) for e in result]
    return to_json(result)


def encode_model_result(op: str, result: Any) -> Json:
    """The model's return value in the form a reference pool writes it."""
    if result is None:
        return None
    kind = RESULT_KINDS.get(op)
    if kind == "events":
        return [model_event_to_json(e) for e in result]
    if kind == "hash?":  # a key
        return to_json(abstraction.concrete_key(result))
    return to_json(result)


def _model_fn(op: str) -> Callable[..., Any]:
    return ACTIONS.get(op) or QUERIES[op]


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Header:
    """The pool's configuration, as the trace's first line declares it."""

    num_blocks: int
    enable_caching: bool
    hash_block_size: int
    enable_kv_cache_events: bool
    medium: str
    reference: str = "0.31"
    block_sizes: dict[int, int] | None = None
    meta: dict[str, Json] = field(default_factory=dict)


@dataclass
class TraceStep:
    """One call line: ``args`` are model-ready Python values, the rest stays JSON."""

    line: int
    op: str
    args: dict[str, Any]
    result: Json
    error: str | None
    events: list[dict[str, Json]]
    fired: list[list[Json]] | None
    observation: dict[str, Json] | None


@dataclass
class Trace:
    path: str
    header: Header
    steps: list[TraceStep]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind_ok(kind: str, v: Any, where: str) -> None:
    """Raise :class:`FieldError` unless ``v`` is a JSON value of ``kind``."""
    if kind.endswith("?"):
        if v is None:
            return
        kind = kind[:-1]
    if kind == "int":
        if not _is_int(v):
            raise FieldError(f"{where}: expected an integer, got {_show(v)}")
        if not INT_MIN <= v <= INT_MAX:
            raise FieldError(f"{where}: integer {_show(v)} does not fit in 64 bits")
    elif kind == "number":
        if not (_is_int(v) or isinstance(v, float)):
            raise FieldError(f"{where}: expected a number, got {_show(v)}")
    elif kind == "bool":
        if not isinstance(v, bool):
            raise FieldError(f"{where}: expected true or false, got {_show(v)}")
    elif kind == "str":
        if not isinstance(v, str):
            raise FieldError(f"{where}: expected a string, got {_show(v)}")
    elif kind == "hash":
        _hex(v, where)
    elif kind == "ehash":
        if isinstance(v, str):
            _hex(v, where)
        elif not _is_int(v) or not 0 <= v <= INT_MAX:
            raise FieldError(f"{where}: expected a hash (unsigned 64-bit integer or hex string), "
                       f"got {_show(v)}")
    elif kind in ("ints", "bools", "hashes"):
        if not isinstance(v, list):
            raise FieldError(f"{where}: expected a list, got {_show(v)}")
        item = {"ints": "int", "bools": "bool", "hashes": "ehash"}[kind]
        for i, x in enumerate(v):
            _kind_ok(item, x, f"{where}[{i}]")
    elif kind != "any":
        raise AssertionError(kind)


def _hex(v: Any, where: str) -> bytes:
    if not isinstance(v, str):
        raise FieldError(f"{where}: expected a hex string, got {_show(v)}")
    try:
        if v != v.lower():
            raise ValueError
        return bytes.fromhex(v)
    except ValueError:
        raise FieldError(f"{where}: {_show(v)} is not lowercase hex bytes") from None


def _show(v: Any) -> str:
    """A short rendering of a value for messages; never fails, even on deep nesting."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _object(v: Any, where: str, allowed: Collection[str], required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise FieldError(f"{where}: expected an object, got {_show(v)}")
    for key in v:
        if key not in allowed:
            raise FieldError(f"{where}: unknown field {key!r}")
    for key in required:
        if key not in v:
            raise FieldError(f"{where}: missing field {key!r}")
    return v


def _parse_request(v: Any, where: str) -> Request:
    fields_ = ("request_id", "all_token_ids", "block_hashes", "lora", "mm", "cache_salt",
               "session_id")
    obj = _object(v, where, fields_, fields_[:3])
    _kind_ok("str", obj["request_id"], f"{where}.request_id")
    _kind_ok("ints", obj["all_token_ids"], f"{where}.all_token_ids")
    if not isinstance(obj["block_hashes"], list):
        raise FieldError(f"{where}.block_hashes: expected a list, got {_show(obj['block_hashes'])}")
    hashes = [_hex(h, f"{where}.block_hashes[{i}]") for i, h in enumerate(obj["block_hashes"])]
    lora = None
    if obj.get("lora") is not None:
        lw = f"{where}.lora"
        lo = _object(obj["lora"], lw, ("name", "id", "path"), ("name", "id", "path"))
        _kind_ok("str", lo["name"], f"{lw}.name")
        _kind_ok("int", lo["id"], f"{lw}.id")
        _kind_ok("str", lo["path"], f"{lw}.path")
        lora = LoRARequest(lo["name"], lo["id"], lo["path"])
    mm = obj.get("mm") or []
    if not isinstance(mm, list):
        raise FieldError(f"{where}.mm: expected a list, got {_show(mm)}")
    features = []
    for i, item in enumerate(mm):
        mw = f"{where}.mm[{i}]"
        it = _object(item, mw, ("identifier", "offset", "length"), ("identifier", "offset", "length"))
        _kind_ok("str", it["identifier"], f"{mw}.identifier")
        _kind_ok("int", it["offset"], f"{mw}.offset")
        _kind_ok("int", it["length"], f"{mw}.length")
        features.append(MultiModalFeature(it["identifier"], PlaceholderRange(it["offset"], it["length"])))
    for name in ("cache_salt", "session_id"):
        _kind_ok("str?", obj.get(name), f"{where}.{name}")
    return Request(obj["request_id"], list(obj["all_token_ids"]), block_hashes=hashes,
                   lora_request=lora, mm_features=features, cache_salt=obj.get("cache_salt"),
                   session_id=obj.get("session_id"))


def parse_event(v: Any, where: str) -> dict[str, Json]:
    """Validate one event object; return it with optional fields filled with null."""
    if not isinstance(v, dict):
        raise FieldError(f"{where}: expected an event object, got {_show(v)}")
    kind = v.get("type")
    if not isinstance(kind, str) or kind not in EVENT_FIELDS:
        raise FieldError(f"{where}.type: expected one of {sorted(EVENT_FIELDS)}, got {_show(kind)}")
    spec = EVENT_FIELDS[kind]
    _object(v, where, {"type", *spec}, [k for k, (_, req) in spec.items() if req])
    out: dict[str, Json] = {"type": kind}
    for name, (fkind, _req) in spec.items():
        value = v.get(name)
        _kind_ok(fkind, value, f"{where}.{name}")
        out[name] = value
    return out


def _parse_observation(v: Any, where: str, num_blocks: int) -> dict[str, Json]:
    obj = _object(v, where, OBSERVATION_FIELDS, OBSERVATION_FIELDS)
    for name in ("ref", "free", "watched"):
        _kind_ok("ints", obj[name], f"{where}.{name}")
    _kind_ok("int", obj["num_free"], f"{where}.num_free")
    for name in ("primary", "secondary"):
        if not isinstance(obj[name], list):
            raise FieldError(f"{where}.{name}: expected a list, got {_show(obj[name])}")
    for i, p in enumerate(obj["primary"]):
        pw = f"{where}.primary[{i}]"
        if p is not None:
            if not (isinstance(p, list) and len(p) == 2):
                raise FieldError(f"{pw}: expected null or [hex key, num_tokens], got {_show(p)}")
            _hex(p[0], f"{pw}[0]")
            _kind_ok("int", p[1], f"{pw}[1]")
    for i, keys in enumerate(obj["secondary"]):
        if not isinstance(keys, list):
            raise FieldError(f"{where}.secondary[{i}]: expected a list, got {_show(keys)}")
        for j, k in enumerate(keys):
            _hex(k, f"{where}.secondary[{i}][{j}]")
    if not isinstance(obj["index"], list):
        raise FieldError(f"{where}.index: expected a list, got {_show(obj['index'])}")
    for i, entry in enumerate(obj["index"]):
        ew = f"{where}.index[{i}]"
        if not (isinstance(entry, list) and len(entry) == 2):
            raise FieldError(f"{ew}: expected [hex key, [block ids]], got {_show(entry)}")
        _hex(entry[0], f"{ew}[0]")
        _kind_ok("ints", entry[1], f"{ew}[1]")
    return obj


def parse_header(v: Any) -> Header:
    """Validate the first line; an unknown version is refused before anything else."""
    if not isinstance(v, dict):
        raise FieldError(f"header: expected an object, got {_show(v)}")
    if "kvpool_trace" not in v:
        raise FieldError("header: missing field 'kvpool_trace' (is this a kvpool trace?)")
    if v["kvpool_trace"] != VERSION or not _is_int(v["kvpool_trace"]):
        raise FieldError(f"header: unsupported trace version {_show(v['kvpool_trace'])} "
                   f"(this reader knows version {VERSION})")
    obj = _object(v, "header", {*HEADER_FIELDS, "reference", "block_sizes", "meta"},
                  list(HEADER_FIELDS))
    for name, kind in HEADER_FIELDS.items():
        _kind_ok(kind, obj[name], f"header.{name}")
    if not 1 <= obj["num_blocks"] <= MAX_NUM_BLOCKS:
        raise FieldError(f"header.num_blocks: {obj['num_blocks']} is not in [1, {MAX_NUM_BLOCKS}]")
    if not 1 <= obj["hash_block_size"] <= 1 << 31:
        raise FieldError(f"header.hash_block_size: {obj['hash_block_size']} is not in [1, 2**31]")
    reference = obj.get("reference", DEFAULT_REFERENCE)
    if not isinstance(reference, str) or reference not in REFERENCES:
        raise FieldError(f"header.reference: expected one of {sorted(REFERENCES)}, got {_show(reference)}")
    block_sizes = None
    if obj.get("block_sizes") is not None:
        raw = obj["block_sizes"]
        if not isinstance(raw, dict):
            raise FieldError(f"header.block_sizes: expected an object, got {_show(raw)}")
        block_sizes = {}
        for g, n in raw.items():
            if not (g.isascii() and g.isdigit() and len(g) <= 10):
                raise FieldError(f"header.block_sizes: key {g!r} is not a group id in decimal")
            _kind_ok("int", n, f"header.block_sizes.{g}")
            if n <= 0:
                raise FieldError(f"header.block_sizes.{g}: {n} is not a positive block size")
            block_sizes[int(g)] = n
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise FieldError(f"header.meta: expected an object, got {_show(meta)}")
    return Header(obj["num_blocks"], obj["enable_caching"], obj["hash_block_size"],
                  obj["enable_kv_cache_events"], obj["medium"], reference, block_sizes, meta)


def parse_step(v: Any, line: int, header: Header) -> TraceStep:
    """Validate one call line and decode its arguments for the model."""
    obj = _object(v, "step", STEP_FIELDS, ("op", "args", "result", "error", "events"))
    op = obj["op"]
    if not isinstance(op, str) or op not in ARG_KINDS:
        raise FieldError(f"op: unknown operation {_show(op)}")
    kinds = ARG_KINDS[op]
    required = [n for n in kinds if (op, n) not in OPTIONAL_ARGS]
    raw = _object(obj["args"], "args", kinds, required)
    args: dict[str, Any] = {}
    for name, value in raw.items():
        where, kind = f"args.{name}", kinds[name]
        if kind == "request":
            args[name] = _parse_request(value, where)
        elif kind == "watcher":
            _kind_ok("str", value, where)
            args[name] = value
        elif kind == "hash":
            args[name] = _hex(value, where)
        else:
            _kind_ok(kind, value, where)
            args[name] = value
    error = obj["error"]
    if error is not None and not (isinstance(error, str) and error.isidentifier()):
        raise FieldError(f"error: expected null or an error class name, got {_show(error)}")
    result = obj["result"]
    if error is not None or op not in RESULT_KINDS:
        if result is not None:
            raise FieldError(f"result: must be null for {op}" + (" that raised" if error else ""))
    elif RESULT_KINDS[op] == "events":
        if not isinstance(result, list):
            raise FieldError(f"result: expected a list of events, got {_show(result)}")
        result = [parse_event(e, f"result[{i}]") for i, e in enumerate(result)]
    else:
        _kind_ok(RESULT_KINDS[op], result, "result")
    events = obj["events"]
    if not isinstance(events, list):
        raise FieldError(f"events: expected a list, got {_show(events)}")
    events = [parse_event(e, f"events[{i}]") for i, e in enumerate(events)]
    fired = obj.get("fired")
    if fired is not None:
        if not isinstance(fired, list):
            raise FieldError(f"fired: expected a list, got {_show(fired)}")
        for i, f in enumerate(fired):
            if not (isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and _is_int(f[1])):
                raise FieldError(f"fired[{i}]: expected [watcher name, block id], got {_show(f)}")
    observation = obj.get("observation")
    if observation is not None:
        observation = _parse_observation(observation, "observation", header.num_blocks)
    return TraceStep(line, op, args, result, error, events, fired, observation)


def _reject_constant(name: str) -> Any:
    raise FieldError(f"{name} is not valid JSON")


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's JSON value with its 1-based number; errors as :class:`TraceError`."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(name, 0, f"cannot read: {exc.strerror or exc}") from None
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(name, number, f"not UTF-8 (byte {exc.start})") from None
        try:
            yield number, json.loads(text, parse_constant=_reject_constant)
        except FieldError as exc:
            raise TraceError(name, number, f"bad JSON: {exc}") from None
        except RecursionError:
            raise TraceError(name, number, "bad JSON: nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, and ints beyond Python's digit limit
            raise TraceError(name, number, f"bad JSON: {exc}") from None


def read_trace(path: str | Path) -> Trace:
    """Read and validate a whole trace; raise :class:`TraceError` at the first bad line."""
    name = str(path)
    header: Header | None = None
    steps: list[TraceStep] = []
    for number, value in json_lines(path):
        try:
            if header is None:
                header = parse_header(value)
            else:
                steps.append(parse_step(value, number, header))
        except FieldError as exc:
            raise TraceError(name, number, str(exc)) from None
        except RecursionError:
            raise TraceError(name, number, "value nested too deeply") from None
    if header is None:
        raise TraceError(name, 1, "empty file: expected a header line {\"kvpool_trace\": 1, ...}")
    return Trace(name, header, steps)


# ------------------------------------------------------------------ checking


@dataclass
class StepDivergence:
    """The first step where the trace and the model disagree."""

    line: int
    step: int
    op: str
    diffs: list[str]


@dataclass
class CheckReport:
    """What :func:`check_trace` found: ``divergence`` is None when every step agrees."""

    path: str
    steps: int
    divergence: StepDivergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def format(self) -> str:
        if self.divergence is None:
            return f"{self.path}: ok, {self.steps} calls agree with the model"
        d = self.divergence
        body = "\n  ".join(d.diffs)
        return (f"{self.path}:{d.line}: step {d.step} ({d.op}) differs from the model "
                f"({self.steps - 1} calls agreed before it)\n  {body}")


def canonical_hash(h: Json) -> Json:
    """Event hashes compare in their int form: hex bytes become their low 64 bits."""
    if isinstance(h, str):
        try:
            return int.from_bytes(bytes.fromhex(h), "big") & _LOW_64
        except ValueError:
            return h
    return h


def canonical_event(e: dict[str, Json]) -> dict[str, Json]:
    """An event with defaults filled and hashes in int form, for comparison."""
    spec = EVENT_FIELDS.get(str(e.get("type")), {})
    out: dict[str, Json] = {"type": e.get("type")}
    for name in spec:
        out[name] = e.get(name)
    if "block_hashes" in out and isinstance(out["block_hashes"], list):
        out["block_hashes"] = [canonical_hash(h) for h in out["block_hashes"]]
    if out.get("parent_block_hash") is not None:
        out["parent_block_hash"] = canonical_hash(out["parent_block_hash"])
    return out


def _strict_equal(a: Json, b: Json) -> bool:
    """JSON equality that does not confuse true with 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_strict_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return False
    return type(a) is type(b) and a == b if not (_is_num(a) and _is_num(b)) else a == b


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and not isinstance(v, bool)


def _event_diffs(where: str, recorded: list[dict[str, Json]], model: list[dict[str, Json]]) -> list[str]:
    rec = [canonical_event(e) for e in recorded]
    mod = [canonical_event(e) for e in model]
    out = []
    for i, (r, m) in enumerate(zip(rec, mod, strict=False)):
        if r.get("type") != m.get("type"):
            out.append(f"{where}[{i}]: recorded {r['type']}, model {m['type']}")
            continue
        for name in m:
            if not _strict_equal(r.get(name), m[name]):
                out.append(f"{where}[{i}].{name}: recorded {_show(r.get(name))}, model {_show(m[name])}")
    if len(rec) != len(mod):
        out.append(f"{where}: recorded {len(rec)} event(s), model {len(mod)}; "
                   f"model's: {[e['type'] for e in mod]}")
    return out


def _observation_diffs(recorded: dict[str, Json], model: dict[str, Json]) -> list[str]:
    out = []
    for name in OBSERVATION_FIELDS:
        r, m = recorded[name], model[name]
        if name == "index":  # key order is not significant; per-key block order is
            r = dict(sorted((k, v) for k, v in r))
            m = dict(sorted((k, v) for k, v in m))
        if not _strict_equal(r, m):
            out.append(f"observation.{name}: recorded {_show(r)}, model {_show(m)}")
    return out


def _model_call(state: PoolState, step: TraceStep, watchers: dict[str, Watcher],
                log: list[tuple[str, int]]) -> tuple[PoolState, Any, BaseException | None]:
    args = dict(step.args)
    if "on_reuse" in args:
        name = args["on_reuse"]
        args["on_reuse"] = watchers.setdefault(name, Watcher(name, log))
    try:
        if step.op in ACTIONS:
            new, result = ACTIONS[step.op](state, **args)
            return new, result, None
        return state, QUERIES[step.op](state, **args), None
    except RecursionError as exc:
        return state, None, exc
    except Exception as exc:  # the model refusing the call is a result, like the pool's
        return state, None, exc


def compare_step(step: TraceStep, before: PoolState, after: PoolState, result: Any,
                 error: BaseException | None, *, vllm_errors: bool = False) -> list[str]:
    """Every difference between one recorded call and the model's run of it."""
    diffs: list[str] = []
    if not names_refusal(step.error, error, vllm_errors=vllm_errors):
        m_error = refusal_name(error) if error is not None else None
        diffs.append(f"error: recorded {step.error}, model {m_error}"
                     + (f" ({error})" if error is not None else ""))
    if error is None:
        m_result = encode_model_result(step.op, result)
        if step.op == "get_usage" and _is_num(step.result):
            same = math.isclose(step.result, m_result, rel_tol=0, abs_tol=USAGE_TOLERANCE)
        elif step.op == "take_events":
            ev = _event_diffs("result", step.result, m_result)
            diffs += ev
            same = True
        else:
            same = _strict_equal(step.result, m_result)
        if not same:
            diffs.append(f"result: recorded {_show(step.result)}, model {_show(m_result)}")
    emitted = [] if step.op == "take_events" else list(after.events[len(before.events):])
    diffs += _event_diffs("events", step.events, [model_event_to_json(e) for e in emitted])
    if step.fired is not None:
        fired = [[w.name, b] for w, b in after.fired[len(before.fired):]]
        if not _strict_equal(step.fired, fired):
            diffs.append(f"fired: recorded {_show(step.fired)}, model {_show(fired)}")
    if step.observation is not None:
        diffs += _observation_diffs(step.observation, observation_to_json(observe_model(after)))
    return diffs


def check_trace(path: str | Path, *, vllm_errors: bool = False) -> CheckReport:
    """Replay a trace on the model; report the first call that differs.

    ``vllm_errors`` accepts vLLM's plain ``ValueError`` where the model raises
    ``NotEnoughFreeBlocksError``.  Raises :class:`TraceError` on a bad file.
    """
    trace = read_trace(path)
    h = trace.header
    state = initial_state(h.num_blocks, h.enable_caching, h.hash_block_size,
                          h.enable_kv_cache_events, h.medium,
                          null_counted=REFERENCES[h.reference])
    watchers: dict[str, Watcher] = {}
    log: list[tuple[str, int]] = []
    for number, step in enumerate(trace.steps, start=1):
        new, result, error = _model_call(state, step, watchers, log)
        try:
            diffs = compare_step(step, state, new, result, error, vllm_errors=vllm_errors)
        except RecursionError:
            diffs = ["value nested too deeply to compare"]
        if diffs:
            return CheckReport(trace.path, number, StepDivergence(step.line, number, step.op, diffs))
        state = new
    return CheckReport(trace.path, len(trace.steps))


# ------------------------------------------------------------------ recording


class _Tap:
    """Stands in for a pool: delegates everything, and captures one armed call.

    Lockstep calls the pool's method itself; wrapping the pool is how this
    module sees the pool's own result and error without editing Lockstep.
    """

    def __init__(self, pool: Any):
        self._pool = pool
        self._armed: str | None = None
        self.outcome: tuple[Any, BaseException | None] = (None, None)

    def arm(self, op: str) -> None:
        self._armed, self.outcome = op, (None, None)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if name != self._armed:
            return attr
        self._armed = None

        def captured(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attr(*args, **kwargs)
            except Exception as exc:
                self.outcome = (None, exc)
                raise
            self.outcome = (result, None)
            return result

        return captured


class _Tee(list[tuple[str, int]]):
    """A watcher log that also keeps its own copy of this call's firings."""

    def __init__(self, main: list[tuple[str, int]], copy: list[tuple[str, int]]):
        super().__init__()
        self.main, self.mine = main, copy

    def append(self, item: tuple[str, int]) -> None:
        self.main.append(item)
        self.mine.append(item)


@dataclass
class RecordingLockstep(Lockstep):
    """A :class:`Lockstep` that also writes each call, as the pool saw it, to trace lines."""

    lines: list[dict[str, Json]] = field(default_factory=list)
    keep_observations: bool = True
    fired_now: list[tuple[str, int]] = field(default_factory=list)

    def watcher(self, name: str) -> Watcher:
        return Watcher(name, _Tee(self.fired, self.fired_now))

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        tap: _Tap = self.pool
        line: dict[str, Json] = {"op": op, "args": encode_args(op, args, kwargs)}
        queued = len(tap.kv_event_queue)
        self.fired_now.clear()
        tap.arm(op)
        try:
            return super().call(op, *args, **kwargs)
        finally:
            result, error = tap.outcome
            line["result"] = None if error else encode_result(op, result)
            line["error"] = type(error).__name__ if error else None  # the pool's own class
            line["events"] = ([] if op == "take_events"
                              else [event_to_json(e) for e in tap.kv_event_queue[queued:]])
            line["fired"] = [[n, b] for n, b in self.fired_now]
            if self.keep_observations:
                line["observation"] = observation_to_json(self.observe(tap))
            self.lines.append(line)


@dataclass
class Recording:
    """A recorded run: the trace lines, and the lockstep divergence if there was one."""

    header: dict[str, Json]
    lines: list[dict[str, Json]]
    divergence: str | None

    def write(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as out:
            for obj in [self.header, *self.lines]:
                out.write(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")


def recording_pair(
    pool_factory: Callable[..., Any], num_blocks: int, caching: bool, hash_block_size: int,
    events: bool, *, reference: str = DEFAULT_REFERENCE,
    block_sizes: dict[int, int] | None = None, meta: dict[str, Json] | None = None,
) -> tuple[RecordingLockstep, dict[str, Json]]:
    """A fresh recording lockstep pair and the trace header that describes it.

    For hand-written scenarios: call ``pair.call(op, ...)`` and write
    ``Recording(header, pair.lines, None)``.
    """

    def tapped(*a: Any, **k: Any) -> Any:
        return _Tap(pool_factory(*a, **k))

    pair = cast(RecordingLockstep, RecordingLockstep.fresh(
        tapped, num_blocks, caching, hash_block_size, events, reference))
    header: dict[str, Json] = {
        "kvpool_trace": VERSION, "num_blocks": num_blocks, "enable_caching": caching,
        "hash_block_size": hash_block_size, "enable_kv_cache_events": events,
        "medium": getattr(pair.pool, "medium", "GPU"), "reference": reference}
    if block_sizes:
        header["block_sizes"] = {str(g): n for g, n in block_sizes.items()}
    if meta:
        header["meta"] = meta
    return pair, header


def record(pool_factory: Callable[..., Any], seed: int, steps: int, *, misuse: bool = True,
           observe: bool = True,
           errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
           reference: str = DEFAULT_REFERENCE,
           observe_pool: Callable[[Any], Observation] | None = None) -> Recording:
    """Run the seeded workload (as ``campaign.run_one``) and keep every call as a trace line.

    A divergence stops the run; the trace then ends with the call that
    diverged, so ``check_trace`` on it names the same step.  ``observe_pool``
    replaces the default observation of the pool (an adapter's).
    """
    rng = random.Random(seed)
    cfg = Config.draw(rng)
    pair, header = recording_pair(
        pool_factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events,
        reference=reference, block_sizes=cfg.block_sizes,
        meta={"seed": seed, "steps": steps, "pool": _name(pool_factory), "misuse": misuse})
    pair.errors_match = errors_match
    pair.keep_observations = observe
    if observe_pool is not None:
        custom = observe_pool
        pair.observe = lambda tap: custom(tap._pool)
    work = Workload(rng, cfg, pair, misuse_on=misuse)
    divergence = None
    try:
        for _ in range(steps):
            work.step()
    except Divergence as exc:
        divergence = str(exc)
    return Recording(header, pair.lines, divergence)


def record_adapter(adapter: Any, seed: int, steps: int, *, observe: bool = True,
                   reference: str = DEFAULT_REFERENCE) -> Recording:
    """:func:`record` through an ``oracle.adapter.Adapter``: its constructor, observation,
    error pairing and misuse setting (duck-typed, so this module does not import it)."""

    def factory(num_blocks: int, caching: bool, hash_block_size: int,
                enable_kv_cache_events: bool = False) -> Any:
        return adapter.construct(num_blocks, caching, hash_block_size, enable_kv_cache_events)

    factory.__qualname__ = str(getattr(adapter, "name", "adapter"))
    return record(factory, seed, steps, misuse=bool(adapter.supports_misuse), observe=observe,
                  errors_match=adapter.errors_match, reference=reference,
                  observe_pool=adapter.observe)


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


__all__ = [
    "CheckReport", "Header", "Recording", "RecordingLockstep", "StepDivergence", "Trace",
    "TraceError", "TraceStep", "check_trace", "event_to_json", "json_lines", "parse_event",
    "read_trace", "record", "record_adapter", "recording_pair", "schema_gaps",
]
