"""Reading traces: JSON lines, and strict parsers for the header, each call line and each event.

Strict on purpose: a writer in another language gets a :class:`~.schema.TraceError`
naming the file, the line and the field, rather than a silent mismatch later.
Nothing else is raised on bad input (the fuzz harness in ``fuzz/`` holds it to that).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import REFERENCES

from .schema import (
    ARG_KINDS,
    DEFAULT_REFERENCE,
    EVENT_FIELDS,
    HEADER_FIELDS,
    INT_MAX,
    INT_MIN,
    MAX_NUM_BLOCKS,
    OBSERVATION_FIELDS,
    OPTIONAL_ARGS,
    REQUEST_LINE,
    REQUIRED_OBSERVATION,
    RESULT_KINDS,
    STEP_FIELDS,
    VERSION,
    FieldError,
    Json,
    TraceError,
    is_int,
    show,
)

T = TypeVar("T")


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
    vllm_errors: bool = False


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


def _kind_ok(kind: str, v: Any, where: str) -> None:
    """Raise :class:`FieldError` unless ``v`` is a JSON value of ``kind``."""
    if kind.endswith("?"):
        if v is None:
            return
        kind = kind[:-1]
    if kind == "int":
        if not is_int(v):
            raise FieldError(f"{where}: expected an integer, got {show(v)}")
        if not INT_MIN <= v <= INT_MAX:
            raise FieldError(f"{where}: integer {show(v)} does not fit in 64 bits")
    elif kind == "number":
        if not (is_int(v) or isinstance(v, float)):
            raise FieldError(f"{where}: expected a number, got {show(v)}")
    elif kind == "bool":
        if not isinstance(v, bool):
            raise FieldError(f"{where}: expected true or false, got {show(v)}")
    elif kind == "str":
        if not isinstance(v, str):
            raise FieldError(f"{where}: expected a string, got {show(v)}")
    elif kind == "hash":
        _hex(v, where)
    elif kind == "ehash":
        if isinstance(v, str):
            _hex(v, where)
        elif not is_int(v) or not 0 <= v <= INT_MAX:
            raise FieldError(f"{where}: expected a hash (unsigned 64-bit integer or hex string), "
                       f"got {show(v)}")
    elif kind in ("ints", "bools", "hashes"):
        if not isinstance(v, list):
            raise FieldError(f"{where}: expected a list, got {show(v)}")
        if kind == "ints" and _plain_ints(v):
            return  # the common case, checked at once; otherwise item by item, to name the bad one
        item = {"ints": "int", "bools": "bool", "hashes": "ehash"}[kind]
        for i, x in enumerate(v):
            _kind_ok(item, x, f"{where}[{i}]")
    elif kind != "any":
        raise AssertionError(kind)


def _plain_ints(v: list[Any]) -> bool:
    """Every item an int (not a bool) within 64 bits."""
    return all(type(x) is int for x in v) and (not v or (min(v) >= INT_MIN and max(v) <= INT_MAX))


def _hex(v: Any, where: str) -> bytes:
    if not isinstance(v, str):
        raise FieldError(f"{where}: expected a hex string, got {show(v)}")
    try:
        if v != v.lower():
            raise ValueError
        return bytes.fromhex(v)
    except ValueError:
        raise FieldError(f"{where}: {show(v)} is not lowercase hex bytes") from None


def _object(v: Any, where: str, allowed: Collection[str], required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise FieldError(f"{where}: expected an object, got {show(v)}")
    for key in v:
        if key not in allowed:
            raise FieldError(f"{where}: unknown field {key!r}")
    for key in required:
        if key not in v:
            raise FieldError(f"{where}: missing field {key!r}")
    return v


def _fields(v: Any, where: str, kinds: Mapping[str, str]) -> dict[str, Any]:
    """An object with exactly the fields of ``kinds``, each of its kind."""
    obj = _object(v, where, kinds, list(kinds))
    for name, kind in kinds.items():
        _kind_ok(kind, obj[name], f"{where}.{name}")
    return obj


def _parse_request(v: Any, where: str) -> Request:
    fields_ = ("request_id", "all_token_ids", "block_hashes", "lora", "mm", "cache_salt",
               "session_id")
    obj = _object(v, where, fields_, fields_[:3])
    _kind_ok("str", obj["request_id"], f"{where}.request_id")
    _kind_ok("ints", obj["all_token_ids"], f"{where}.all_token_ids")
    if not isinstance(obj["block_hashes"], list):
        raise FieldError(f"{where}.block_hashes: expected a list, got {show(obj['block_hashes'])}")
    hashes = [_hex(h, f"{where}.block_hashes[{i}]") for i, h in enumerate(obj["block_hashes"])]
    lora = None
    if obj.get("lora") is not None:
        lo = _fields(obj["lora"], f"{where}.lora", {"name": "str", "id": "int", "path": "str"})
        lora = LoRARequest(lo["name"], lo["id"], lo["path"])
    mm = obj.get("mm") or []
    if not isinstance(mm, list):
        raise FieldError(f"{where}.mm: expected a list, got {show(mm)}")
    features = []
    for i, item in enumerate(mm):
        it = _fields(item, f"{where}.mm[{i}]", {"identifier": "str", "offset": "int", "length": "int"})
        features.append(MultiModalFeature(it["identifier"], PlaceholderRange(it["offset"], it["length"])))
    for name in ("cache_salt", "session_id"):
        _kind_ok("str?", obj.get(name), f"{where}.{name}")
    return Request(obj["request_id"], list(obj["all_token_ids"]), block_hashes=hashes,
                   lora_request=lora, mm_features=features, cache_salt=obj.get("cache_salt"),
                   session_id=obj.get("session_id"))


class Requests:
    """The requests a trace writes once and then names by number (request lines).

    ``{"kvpool_request": N, <request fields>}`` defines request ``N``;
    ``{"kvpool_request": N, "more_tokens": [...], "more_hashes": [...]}`` appends
    what it gained; ``{"kvpool_request": N, "forget": true}`` drops it (no later
    line names it).  A call names it as ``{"kvpool_request": N, "tokens": T,
    "hashes": H}``, its lengths then.  One object per request, grown in place:
    the model reads each chunk of a long prompt once.
    """

    def __init__(self) -> None:
        self.known: dict[int, Request] = {}

    def line(self, obj: dict[str, Any]) -> None:
        """Apply one request line."""
        number = obj[REQUEST_LINE]
        _kind_ok("int", number, REQUEST_LINE)
        if "forget" in obj:
            _object(obj, "request", (REQUEST_LINE, "forget"), ("forget",))
            if obj["forget"] is not True:
                raise FieldError(f"forget: expected true, got {show(obj['forget'])}")
            self.known.pop(number, None)
        elif "more_tokens" in obj or "more_hashes" in obj:
            _object(obj, "request", (REQUEST_LINE, "more_tokens", "more_hashes"),
                    ("more_tokens", "more_hashes"))
            _kind_ok("ints", obj["more_tokens"], "more_tokens")
            if not isinstance(obj["more_hashes"], list):
                raise FieldError(f"more_hashes: expected a list, got {show(obj['more_hashes'])}")
            req = self._get(number)
            req.block_hashes.extend(_hex(h, f"more_hashes[{i}]") for i, h in enumerate(obj["more_hashes"]))
            req.all_token_ids.extend(obj["more_tokens"])
        else:
            self.known[number] = _parse_request({k: v for k, v in obj.items() if k != REQUEST_LINE},
                                                "request")

    def named(self, v: dict[str, Any], where: str) -> Request:
        """The request a call's argument names, checked to be as long as the call says."""
        _fields(v, where, {REQUEST_LINE: "int", "tokens": "int", "hashes": "int"})
        req = self._get(v[REQUEST_LINE])
        if (len(req.all_token_ids), len(req.block_hashes)) != (v["tokens"], v["hashes"]):
            raise FieldError(f"{where}: request {v[REQUEST_LINE]} has {len(req.all_token_ids)} tokens and "
                             f"{len(req.block_hashes)} hashes, not {v['tokens']} and {v['hashes']}")
        return req

    def _get(self, number: int) -> Request:
        req = self.known.get(number)
        if req is None:
            raise FieldError(f"request {number} is not defined by an earlier line (or was forgotten)")
        return req


def parse_event(v: Any, where: str) -> dict[str, Json]:
    """Validate one event object; return the fields it has (optional ones may be left out)."""
    if not isinstance(v, dict):
        raise FieldError(f"{where}: expected an event object, got {show(v)}")
    kind = v.get("type")
    if not isinstance(kind, str) or kind not in EVENT_FIELDS:
        raise FieldError(f"{where}.type: expected one of {sorted(EVENT_FIELDS)}, got {show(kind)}")
    spec = EVENT_FIELDS[kind]
    _object(v, where, {"type", *spec}, [k for k, (_, req) in spec.items() if req])
    out: dict[str, Json] = {"type": kind}
    for name, (fkind, _req) in spec.items():
        if name in v:
            _kind_ok(fkind, v[name], f"{where}.{name}")
            out[name] = v[name]
    return out


def _parse_observation(v: Any, where: str) -> dict[str, Json]:
    obj = _object(v, where, OBSERVATION_FIELDS, REQUIRED_OBSERVATION)
    for name in ("ref", "free", "watched"):
        if name in obj:
            _kind_ok("ints", obj[name], f"{where}.{name}")
    _kind_ok("int", obj["num_free"], f"{where}.num_free")
    for name in ("primary", "secondary", "index"):
        if name in obj and not isinstance(obj[name], list):
            raise FieldError(f"{where}.{name}: expected a list, got {show(obj[name])}")
    for i, p in enumerate(obj["primary"]):
        pw = f"{where}.primary[{i}]"
        if p is not None:
            if not (isinstance(p, list) and len(p) == 2):
                raise FieldError(f"{pw}: expected null or [hex key, num_tokens], got {show(p)}")
            _hex(p[0], f"{pw}[0]")
            _kind_ok("int?", p[1], f"{pw}[1]")
    for i, keys in enumerate(obj.get("secondary", [])):
        if not isinstance(keys, list):
            raise FieldError(f"{where}.secondary[{i}]: expected a list, got {show(keys)}")
        for j, k in enumerate(keys):
            _hex(k, f"{where}.secondary[{i}][{j}]")
    for i, entry in enumerate(obj.get("index", [])):
        ew = f"{where}.index[{i}]"
        if not (isinstance(entry, list) and len(entry) == 2):
            raise FieldError(f"{ew}: expected [hex key, [block ids]], got {show(entry)}")
        _hex(entry[0], f"{ew}[0]")
        _kind_ok("ints", entry[1], f"{ew}[1]")
    return obj


def parse_header(v: Any) -> Header:
    """Validate the first line; an unknown version is refused before anything else."""
    if not isinstance(v, dict):
        raise FieldError(f"header: expected an object, got {show(v)}")
    if "kvpool_trace" not in v:
        raise FieldError("header: missing field 'kvpool_trace' (is this a kvpool trace?)")
    if v["kvpool_trace"] != VERSION or not is_int(v["kvpool_trace"]):
        raise FieldError(f"header: unsupported trace version {show(v['kvpool_trace'])} "
                   f"(this reader knows version {VERSION})")
    obj = _object(v, "header", {*HEADER_FIELDS, "reference", "block_sizes", "meta", "vllm_errors"},
                  list(HEADER_FIELDS))
    for name, kind in HEADER_FIELDS.items():
        _kind_ok(kind, obj[name], f"header.{name}")
    if not 1 <= obj["num_blocks"] <= MAX_NUM_BLOCKS:
        raise FieldError(f"header.num_blocks: {obj['num_blocks']} is not in [1, {MAX_NUM_BLOCKS}]")
    if not 1 <= obj["hash_block_size"] <= 1 << 31:
        raise FieldError(f"header.hash_block_size: {obj['hash_block_size']} is not in [1, 2**31]")
    reference = obj.get("reference", DEFAULT_REFERENCE)
    if not isinstance(reference, str) or reference not in REFERENCES:
        raise FieldError(f"header.reference: expected one of {sorted(REFERENCES)}, got {show(reference)}")
    block_sizes = None
    if obj.get("block_sizes") is not None:
        raw = obj["block_sizes"]
        if not isinstance(raw, dict):
            raise FieldError(f"header.block_sizes: expected an object, got {show(raw)}")
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
        raise FieldError(f"header.meta: expected an object, got {show(meta)}")
    vllm_errors = obj.get("vllm_errors", False)
    _kind_ok("bool", vllm_errors, "header.vllm_errors")
    return Header(obj["num_blocks"], obj["enable_caching"], obj["hash_block_size"],
                  obj["enable_kv_cache_events"], obj["medium"], reference, block_sizes, meta, vllm_errors)


def parse_step(v: Any, line: int, requests: Requests | None = None) -> TraceStep:
    """Validate one call line and decode its arguments for the model (requests named by number
    from ``requests``)."""
    obj = _object(v, "step", STEP_FIELDS, ("op", "args", "result", "error", "events"))
    op, args = parse_call(obj, requests)
    return parse_outcome(obj, op, args, line)


def parse_call(obj: dict[str, Any], requests: Requests | None = None) -> tuple[str, dict[str, Any]]:
    """A call line's operation and its arguments, decoded for the model."""
    op = obj["op"]
    if not isinstance(op, str) or op not in ARG_KINDS:
        raise FieldError(f"op: unknown operation {show(op)}")
    kinds = ARG_KINDS[op]
    required = [n for n in kinds if (op, n) not in OPTIONAL_ARGS]
    raw = _object(obj["args"], "args", kinds, required)
    args: dict[str, Any] = {}
    for name, value in raw.items():
        where, kind = f"args.{name}", kinds[name]
        if kind == "request":
            named = requests is not None and isinstance(value, dict) and REQUEST_LINE in value
            args[name] = requests.named(value, where) if named else _parse_request(value, where)  # type: ignore[union-attr]
        elif kind == "hash":
            args[name] = _hex(value, where)
        else:  # a watcher travels by its name
            _kind_ok("str" if kind == "watcher" else kind, value, where)
            args[name] = value
    return op, args


def parse_outcome(obj: dict[str, Any], op: str, args: dict[str, Any], line: int) -> TraceStep:
    """Validate what a call line says came of the call (all but ``op`` and ``args``).

    ``args`` are taken as already decoded: the drive protocol checks a pool's
    answers with this, without reading back the arguments it wrote itself.
    """
    error = obj["error"]
    if error is not None and not (isinstance(error, str) and error.isidentifier()):
        raise FieldError(f"error: expected null or an error class name, got {show(error)}")
    result = obj["result"]
    if error is not None or op not in RESULT_KINDS:
        if result is not None:
            raise FieldError(f"result: must be null for {op}" + (" that raised" if error else ""))
    elif RESULT_KINDS[op] == "events":
        if not isinstance(result, list):
            raise FieldError(f"result: expected a list of events, got {show(result)}")
        result = [parse_event(e, f"result[{i}]") for i, e in enumerate(result)]
    else:
        _kind_ok(RESULT_KINDS[op], result, "result")
    events = obj["events"]
    if events is not None:  # null: the pool does not show the events of one call
        if not isinstance(events, list):
            raise FieldError(f"events: expected a list or null, got {show(events)}")
        events = [parse_event(e, f"events[{i}]") for i, e in enumerate(events)]
    fired = obj.get("fired")
    if fired is not None:
        if not isinstance(fired, list):
            raise FieldError(f"fired: expected a list, got {show(fired)}")
        for i, f in enumerate(fired):
            if not (isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and is_int(f[1])):
                raise FieldError(f"fired[{i}]: expected [watcher name, block id], got {show(f)}")
    observation = obj.get("observation")
    if observation is not None:
        observation = _parse_observation(observation, "observation")
    return TraceStep(line, op, args, result, error, events, fired, observation)


def _reject_constant(name: str) -> Any:
    raise FieldError(f"{name} is not valid JSON")


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's JSON value with its 1-based number; errors as :class:`TraceError`."""
    name = str(path)
    try:
        handle = Path(path).open("rb")  # noqa: SIM115 (closed below: a generator cannot open it in a with)
    except OSError as exc:
        raise TraceError(name, 0, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        yield from _values(name, _lines(name, handle))


def _lines(name: str, handle: BinaryIO) -> Iterator[bytes]:
    """The file's lines, read as they come (a trace may be longer than memory)."""
    try:
        for raw in handle:
            yield raw[:-1] if raw.endswith(b"\n") else raw
    except OSError as exc:
        raise TraceError(name, 0, f"cannot read: {exc.strerror or exc}") from None


def _values(name: str, lines: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(name, number, f"not UTF-8 (byte {exc.start})") from None
        try:
            yield number, json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise TraceError(name, number, "bad JSON: nested too deeply") from None
        except (FieldError, ValueError) as exc:  # JSONDecodeError, and ints beyond Python's digit limit
            raise TraceError(name, number, f"bad JSON: {exc}") from None


def iter_trace(path: str | Path) -> tuple[Header, Iterator[TraceStep]]:
    """The trace's header, and its call lines as they are read (memory independent of length).

    The header is read and checked at once; a bad call line raises
    :class:`TraceError` when the iteration reaches it.
    """
    name = str(path)
    values = json_lines(path)
    first = next(values, None)
    if first is None:
        raise TraceError(name, 1, "empty file: expected a header line {\"kvpool_trace\": 1, ...}")
    number, value = first
    header = guarded(name, number, lambda: parse_header(value))
    requests = Requests()

    def steps() -> Iterator[TraceStep]:
        for number, value in values:
            if isinstance(value, dict) and REQUEST_LINE in value:
                guarded(name, number, functools.partial(requests.line, value))
                continue
            yield guarded(name, number, functools.partial(parse_step, value, number, requests))

    return header, steps()


def guarded(name: str, number: int, parse: Callable[[], T]) -> T:
    """``parse()`` of line ``number`` of file ``name``, its :class:`FieldError` a :class:`TraceError`."""
    try:
        return parse()
    except FieldError as exc:
        raise TraceError(name, number, str(exc)) from None
    except RecursionError:
        raise TraceError(name, number, "value nested too deeply") from None


__all__ = ["Header", "Requests", "TraceStep", "guarded", "iter_trace", "json_lines", "parse_call",
           "parse_event", "parse_header", "parse_outcome", "parse_step"]
