"""The drive protocol, version 1: the trace format (``oracle/TRACE_FORMAT.md``) as a conversation.

kvpool writes JSON lines to the pool process's stdin; the process answers each
with one JSON line on its stdout (``oracle/DRIVE_PROTOCOL.md``):

* ``{"kvpool_drive": 1, "pool": {...}}``, ``pool`` holding a trace header's
  fields (``num_blocks``, ``enable_caching``, ``hash_block_size``,
  ``enable_kv_cache_events``, ``medium``, ``reference``, ...): the process
  drops any pool it has, makes this one and answers ``{"ok": true}`` (with
  ``"observation"`` of the fresh pool if it will observe itself after every
  call), or ``{"ok": false, "error": "..."}``;
* ``{"op": ..., "args": {...}}``, exactly a trace call line's first two
  fields: the process answers with the rest of that line, ``result``,
  ``error``, ``events``, ``fired`` and (if it said so) ``observation``.

Unknown fields are ignored both ways.  Each answer, put together with its
call, must be a valid trace line: it is read by the trace reader
(:func:`kvpool.oracle.trace.read.parse_step`), so a process gets the same
field-by-field messages a trace writer gets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..core.adapter import optional_api
from ..trace.read import Header, TraceStep, parse_header, parse_outcome, parse_step
from ..trace.schema import DEFAULT_REFERENCE, HEADER_FIELDS, FieldError, Json, show
from ..trace.schema import VERSION as TRACE_VERSION

VERSION = 1
"""The protocol version this module speaks."""
KEY = "kvpool_drive"
ANSWER_FIELDS = ("result", "error", "events", "fired", "observation")
POOL_FIELDS = (*(f for f in HEADER_FIELDS if f != "kvpool_trace"), "reference", "block_sizes", "meta",
               "vllm_errors")
"""The fields of a header's ``pool`` (a trace header's, but its version); any other is ignored."""
"""The fields of an answer; any other field is ignored."""


class ProtocolError(ValueError):
    """One line that breaks the protocol: ``kind`` names the failure (a :class:`~.process.Verdict` kind)."""

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(what)
        self.kind, self.what = kind, what


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode(obj: Json) -> bytes:
    """One protocol line: compact JSON and a newline (standard JSON: no NaN)."""
    return _ENCODER.encode(obj).encode() + b"\n"


def _reject(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject)


def decode(line: bytes) -> Json:
    """A line as JSON; text that is not JSON is most likely logging on stdout."""
    try:
        return _DECODER.decode(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError("garbage", f"answer is not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise ProtocolError("garbage", "answer is nested too deeply") from None
    except ValueError as exc:
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith(("{", "[")):
            raise ProtocolError("stdout logging", f"answered {show(text)}, which is not JSON: log to "
                                "stderr, stdout carries only answers") from None
        raise ProtocolError("garbage", f"answer is not JSON ({exc}): {show(text)}") from None


def pool_fields(num_blocks: int, caching: bool, hash_block_size: int, events: bool, *,
                medium: str = "GPU", reference: str = DEFAULT_REFERENCE,
                block_sizes: dict[int, int] | None = None) -> dict[str, Json]:
    """The ``pool`` of a header: the trace header's fields of this configuration."""
    out: dict[str, Json] = {"num_blocks": num_blocks, "enable_caching": caching,
                            "hash_block_size": hash_block_size, "enable_kv_cache_events": events,
                            "medium": medium, "reference": reference}
    if block_sizes:
        out["block_sizes"] = {str(g): n for g, n in sorted(block_sizes.items())}
    return out


def header(pool: dict[str, Json]) -> dict[str, Json]:
    """The first line kvpool sends for a fresh pool (and again to replace it)."""
    return {KEY: VERSION, "pool": pool}


def trace_header(pool: dict[str, Json], meta: dict[str, Json] | None = None) -> dict[str, Json]:
    """The trace header (line 1 of a trace file) of the same pool."""
    out: dict[str, Json] = {"kvpool_trace": TRACE_VERSION, **pool}
    if meta:
        out["meta"] = meta
    return out


def read_pool(value: Json) -> Header:
    """The process's side: a header line as the trace reader's :class:`Header`.

    Raises :class:`ProtocolError` (kind ``version`` for another version).
    """
    if not isinstance(value, dict) or KEY not in value:
        raise ProtocolError("garbage", f"expected a header {{\"{KEY}\": {VERSION}, \"pool\": ...}}, "
                            f"got {show(value)}")
    if value[KEY] != VERSION or isinstance(value[KEY], bool):
        raise ProtocolError("version", f"unsupported protocol version {show(value[KEY])} (this side "
                            f"speaks version {VERSION})")
    pool = value.get("pool")
    if not isinstance(pool, dict):
        raise ProtocolError("garbage", f"pool: expected an object, got {show(pool)}")
    known = {k: v for k, v in pool.items() if k in POOL_FIELDS}  # unknown fields are ignored
    try:
        return parse_header({"kvpool_trace": TRACE_VERSION, **known})
    except FieldError as exc:
        raise ProtocolError("garbage", str(exc).replace("header", "pool", 1)) from None


@dataclass(frozen=True)
class HeaderAnswer:
    """The process made the pool; ``observation`` lists the fields it will show after each call."""

    observation: frozenset[str] | None
    fresh: dict[str, Json] | None
    """The fresh pool's observation, as the process wrote it."""
    unsupported: frozenset[str] = frozenset()
    """Operations of :func:`~kvpool.oracle.core.adapter.optional_api` the pool does not have."""


def read_header_answer(value: Json, header_: Header) -> HeaderAnswer:
    """The answer to a header: ``{"ok": true}`` (maybe with an observation), or a refusal.

    Raises :class:`ProtocolError`: ``version`` when the process names another
    version, ``refused`` when it could not make the pool, ``garbage`` otherwise.
    """
    if not isinstance(value, dict):
        raise ProtocolError("garbage", f"expected {{\"ok\": true}} for the header, got {show(value)}")
    if KEY in value and (value[KEY] != VERSION or isinstance(value[KEY], bool)):
        raise ProtocolError("version", f"answered in protocol version {show(value[KEY])}; kvpool "
                            f"speaks version {VERSION}")
    ok = value.get("ok")
    if ok is False:
        error = value.get("error")
        said = error if isinstance(error, str) else show(error)
        raise ProtocolError("refused", f"could not make the pool: {said}")
    if ok is not True:
        raise ProtocolError("garbage", f"ok: expected true or false, got {show(ok)} (answer "
                            f"{show(value)})")
    lacks = value.get("unsupported", [])
    if not (isinstance(lacks, list) and all(op in optional_api() for op in lacks)):
        raise ProtocolError("garbage", f"unsupported: expected a list of {list(optional_api())}, got "
                            f"{show(lacks)}")
    obs = value.get("observation")
    if obs is None:
        return HeaderAnswer(None, None, frozenset(lacks))
    try:
        step = parse_step({"op": "get_num_free_blocks", "args": {}, "result": 0, "error": None,
                           "events": [], "observation": obs}, 1, header_)
    except FieldError as exc:
        raise ProtocolError("garbage", f"header answer: {exc}") from None
    fresh = step.observation or {}
    return HeaderAnswer(frozenset(fresh), fresh, frozenset(lacks))


def read_answer(op: str, args: dict[str, Json], value: Json, header_: Header, number: int,
                observation: frozenset[str] | None) -> tuple[TraceStep, dict[str, Json]]:
    """A call's answer, checked as its trace line; returns the parsed step and the line itself.

    ``observation``: the fields the header's answer promised (None: none may come).
    """
    if not isinstance(value, dict):
        raise ProtocolError("garbage", f"expected an answer object, got {show(value)}")
    line: dict[str, Json] = {"op": op, "args": args}
    for name in ANSWER_FIELDS:
        if name in value:
            line[name] = value[name]
    line.setdefault("fired", [])
    if line.get("events", []) is None:
        raise ProtocolError("garbage", "events: expected the list of events this call appended, got "
                            "null (null is for traces of pools that cannot show them)")
    shown = line.get("observation")
    if observation is None and shown is not None:
        raise ProtocolError("garbage", "observation: the header's answer carried none, so no answer "
                            "may (send the fresh pool's observation with {\"ok\": true})")
    if observation is not None:
        if not isinstance(shown, dict):
            raise ProtocolError("garbage", "observation: missing (the header's answer promised one "
                                "after every call)")
        if set(shown) != observation:
            raise ProtocolError("garbage", f"observation: fields {sorted(shown)}, the header's answer "
                                f"had {sorted(observation)}")
    for name in ("result", "error", "events"):
        if name not in line:
            raise ProtocolError("garbage", f"missing field {name!r} (answer {show(value)})")
    try:
        step = parse_outcome(line, op, args, number, header_)
    except FieldError as exc:
        raise ProtocolError("garbage", str(exc)) from None
    except RecursionError:
        raise ProtocolError("garbage", "answer is nested too deeply") from None
    if step.observation is not None:
        for name in ("ref", "primary", "secondary"):
            got = step.observation.get(name)
            if got is not None and len(got) != header_.num_blocks:
                raise ProtocolError("garbage", f"observation.{name}: {len(got)} entries for "
                                    f"{header_.num_blocks} blocks")
    return step, line


def read_call(value: Json, header_: Header, number: int) -> TraceStep:
    """The process's side: a call line, its arguments decoded as the trace reader decodes them."""
    if not isinstance(value, dict) or "op" not in value or "args" not in value:
        raise ProtocolError("garbage", f"expected {{\"op\": ..., \"args\": ...}}, got {show(value)}")
    # A call line without its answer: an error name lets the reader take a null result.
    try:
        return parse_step({"op": value["op"], "args": value["args"], "result": None,
                           "error": "Unanswered", "events": []}, number, header_)
    except FieldError as exc:
        raise ProtocolError("garbage", str(exc)) from None


__all__ = ["ANSWER_FIELDS", "KEY", "POOL_FIELDS", "VERSION", "HeaderAnswer",
           "ProtocolError", "decode", "encode", "header", "pool_fields", "read_answer", "read_call",
           "read_header_answer", "read_pool", "trace_header"]
