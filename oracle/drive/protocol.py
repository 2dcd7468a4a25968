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
  ``error``, ``events``, ``fired`` and (if it said so) ``observation``; a
  refusal may say why in ``message``, a metrics collector's calls come in
  ``told`` (if the header's answer said ``"metrics": true``);
* ``{"op": "observe", "args": {"blocks": [...], "keys": [[hash, group], ...]}}``
  (only to a process whose header answer said ``"observe": true``): what
  ``get_num_free_blocks``, ``is_block_writable`` of each block and
  ``get_cached_block`` of each key answer, in one line.

The header's answer may say what the pool lacks (``"lacks"``: names of
operations, call features and pool shapes, ``kvpool.oracle.generate.features``).

Unknown fields are ignored both ways.  Each answer, put together with its
call, must be a valid trace line: it is read by the trace reader
(:func:`kvpool.oracle.trace.read.parse_step`), so a process gets the same
field-by-field messages a trace writer gets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.model import OPERATIONS

from ..core.adapter import optional_api
from ..generate.features import closed
from ..trace.read import Header, TraceStep, parse_header, parse_outcome, parse_step
from ..trace.schema import DEFAULT_REFERENCE, HEADER_FIELDS, FieldError, Json, is_int, show
from ..trace.schema import VERSION as TRACE_VERSION

VERSION = 1
"""The protocol version this module speaks."""
KEY = "kvpool_drive"
ANSWER_FIELDS = ("result", "error", "events", "fired", "observation")
"""The fields of an answer that its trace line holds; ``told`` and ``message`` are read apart, any
other field is ignored."""
POOL_FIELDS = (*(f for f in HEADER_FIELDS if f != "kvpool_trace"), "reference", "block_sizes", "meta",
               "vllm_errors")
"""The fields of a header's ``pool`` (a trace header's, but its version); any other is ignored."""
OBSERVE = "observe"
"""The operation of the line that asks for what a call's footprint touched, in one answer."""
TOLD = ("allocated", "accessed", "evicted", "reset")
"""What a metrics collector is told, as ``told`` names it: ``on_block_allocated`` ... ``reset``."""


class ProtocolError(ValueError):
    """One line that breaks the protocol: ``kind`` names the failure (a :class:`~.process.Verdict` kind)."""

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(what)
        self.kind, self.what = kind, what


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode(obj: Json) -> bytes:
    """One protocol line: compact JSON and a newline (standard JSON: no NaN)."""
    return _ENCODER.encode(obj).encode() + b"\n"


def text(obj: Json) -> str:
    """A value as :func:`encode` writes it in a line (compact JSON)."""
    return _ENCODER.encode(obj)


def call_line(op: str, args: dict[str, Json], texts: dict[int, tuple[Json, str]],
              observe: dict[str, Json] | None = None, show: bool = False) -> bytes:
    """A call line as :func:`encode` writes it, each argument found in ``texts`` (its ``id`` to the
    value and its text: a request sent again as it was) taken from there rather than encoded again."""
    known = {name: found[1] for name, value in args.items()
             if (found := texts.get(id(value))) is not None and found[0] is value}
    if not known:
        line: dict[str, Json] = {"op": op, "args": args}
        if observe is not None:
            line["observe"] = observe
        if show:
            line["show"] = True
        return encode(line)
    rest = text({name: value for name, value in args.items() if name not in known})
    spliced = ",".join(f'"{name}":{value}' for name, value in known.items())
    tail = ("" if observe is None else f',"observe":{text(observe)}') + (',"show":true' if show else "")
    body = "{" + spliced + ("," + rest[1:] if len(rest) > 2 else "}")
    return f'{{"op":{text(op)},"args":{body}{tail}}}\n'.encode()


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
                block_sizes: dict[int, int] | None = None, metrics: bool = False,
                when_asked: bool = False) -> dict[str, Json]:
    """The ``pool`` of a header: the trace header's fields of this configuration; ``metrics``
    asks for a metrics collector (``"metrics_collector": true``), ``when_asked`` for the whole pool
    only where a line asks it (``"show_when_asked": true``): neither goes into a trace header."""
    out: dict[str, Json] = {"num_blocks": num_blocks, "enable_caching": caching,
                            "hash_block_size": hash_block_size, "enable_kv_cache_events": events,
                            "medium": medium, "reference": reference}
    if block_sizes:
        out["block_sizes"] = {str(g): n for g, n in sorted(block_sizes.items())}
    if metrics:
        out["metrics_collector"] = True
    if when_asked:
        out["show_when_asked"] = True
    return out


def header(pool: dict[str, Json]) -> dict[str, Json]:
    """The first line kvpool sends for a fresh pool (and again to replace it)."""
    return {KEY: VERSION, "pool": pool}


def trace_header(pool: dict[str, Json], meta: dict[str, Json] | None = None) -> dict[str, Json]:
    """The trace header (line 1 of a trace file) of the same pool."""
    out: dict[str, Json] = {"kvpool_trace": TRACE_VERSION,
                            **{k: v for k, v in pool.items() if k in POOL_FIELDS}}
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


OPERATION_NAMES = frozenset(n for n, op in OPERATIONS.items() if op.role != "caller")


@dataclass(frozen=True)
class HeaderAnswer:
    """The process made the pool; ``observation`` lists the fields it will show after each call."""

    observation: frozenset[str] | None
    fresh: dict[str, Json] | None
    """The fresh pool's observation, as the process wrote it."""
    unsupported: frozenset[str] = frozenset()
    """Operations the pool does not have (of ``unsupported``, or named in ``lacks``)."""
    lacks: frozenset[str] = frozenset()
    """Everything the pool declared it lacks (``unsupported`` and ``lacks``), as declared."""
    observe: bool = False
    """The process answers :data:`OBSERVE` lines."""
    metrics: bool = False
    """The pool reports a metrics collector's calls (``told``) in every answer."""
    when_asked: bool = False
    """The process shows its pool only in answers to lines that ask (``"show": true``), and the
    blocks and keys an observe line names in its answer (``shown``)."""


def read_header_answer(value: Json, collector: bool = False,
                       when_asked: bool = False) -> HeaderAnswer:
    """The answer to a header: ``{"ok": true}`` (maybe with an observation), or a refusal.

    ``collector``: whether the header asked for a metrics collector (``metrics`` counts only then);
    ``when_asked``: whether it asked for the pool only when a line asks (``show_when_asked``).

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
    unsupported = value.get("unsupported", [])
    optional = optional_api()  # read when asked: an operation declared later is optional too
    if not (isinstance(unsupported, list) and all(op in optional for op in unsupported)):
        raise ProtocolError("garbage", f"unsupported: expected a list of {list(optional)}, got "
                            f"{show(unsupported)}")
    lacks = value.get("lacks", [])
    if not (isinstance(lacks, list) and all(isinstance(n, str) for n in lacks)):
        raise ProtocolError("garbage", f"lacks: expected a list of names, got {show(lacks)}")
    declared = frozenset(unsupported) | frozenset(lacks)
    try:
        ops = frozenset(unsupported) | frozenset(n for n in closed(lacks) if n in OPERATION_NAMES)
    except ValueError as exc:
        raise ProtocolError("garbage", f"lacks: {exc}") from None
    flags = {}
    for flag in ("observe", "metrics", "show_when_asked"):
        flags[flag] = value.get(flag, False)
        if not isinstance(flags[flag], bool):
            raise ProtocolError("garbage", f"{flag}: expected true or false, got {show(flags[flag])}")
    metrics = flags["metrics"] and collector  # no collector was asked for: none to report
    obs = value.get("observation")
    if obs is None:
        return HeaderAnswer(None, None, ops, declared, flags["observe"], metrics)
    try:
        step = parse_step({"op": "get_num_free_blocks", "args": {}, "result": 0, "error": None,
                           "events": [], "observation": obs}, 1)
    except FieldError as exc:
        raise ProtocolError("garbage", f"header answer: {exc}") from None
    fresh = step.observation or {}
    asked = flags["show_when_asked"] and when_asked and flags["observe"]
    return HeaderAnswer(frozenset(fresh), fresh, ops, declared, flags["observe"], metrics, asked)


def read_answer(op: str, args: dict[str, Json], value: Json, header_: Header, number: int,
                observation: frozenset[str] | None, lazy: bool = False,
                asked_to_show: bool = True) -> tuple[TraceStep, dict[str, Json]]:
    """A call's answer, checked as its trace line; returns the parsed step and the line itself.

    ``observation``: the fields the header's answer promised (None: none may come).  ``lazy``: the
    observation's entries are left for its reader to check (it reads a few; the whole pool is
    checked whole when compared whole): only its fields' kinds and lengths are checked here.
    ``asked_to_show``: whether this answer must show the pool (a process that shows it only when
    asked leaves it out where the line did not ask).
    """
    if not isinstance(value, dict):
        raise ProtocolError("garbage", f"expected an answer object, got {show(value)}")
    if not asked_to_show:
        if "observation" in value:
            raise ProtocolError("garbage", "observation: shown where the line did not ask for it (the "
                                "header's answer said show_when_asked)")
        observation = None
    line: dict[str, Json] = {"op": op, "args": args, **{k: value[k] for k in ANSWER_FIELDS if k in value}}
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
    read = line if not lazy or shown is None else {k: v for k, v in line.items() if k != "observation"}
    try:
        step = parse_outcome(read, op, args, number)
    except FieldError as exc:
        raise ProtocolError("garbage", str(exc)) from None
    except RecursionError:
        raise ProtocolError("garbage", "answer is nested too deeply") from None
    if lazy and isinstance(shown, dict):
        kinds = {name: int if name == "num_free" else list for name in shown}
        wrong = [name for name, kind in kinds.items() if type(shown[name]) is not kind]
        if wrong:
            kind = "an integer" if wrong[0] == "num_free" else "a list"
            raise ProtocolError("garbage", f"observation.{wrong[0]}: expected {kind}, got "
                                f"{show(shown[wrong[0]])}")
        step.observation = shown
    if step.observation is not None:
        for name in ("ref", "primary", "secondary"):
            got = step.observation.get(name)
            if got is not None and len(got) != header_.num_blocks:
                raise ProtocolError("garbage", f"observation.{name}: {len(got)} entries for "
                                    f"{header_.num_blocks} blocks")
    return step, line


def observe_line(blocks: Sequence[int], keys: Sequence[tuple[bytes, int]]) -> dict[str, Json]:
    """The line asking for the free count, each block's writability and each key's lookup."""
    return {"op": OBSERVE, "args": {"blocks": list(blocks), "keys": [[h.hex(), g] for h, g in keys]}}


def read_observe_args(args: Json) -> tuple[list[int], list[tuple[bytes, int]]]:
    """The process's side: an observe line's blocks and keys."""
    if not isinstance(args, dict) or not isinstance(args.get("blocks"), list) or not isinstance(
            args.get("keys"), list):
        raise ProtocolError("garbage", f"args: expected {{\"blocks\": [...], \"keys\": [...]}}, got "
                            f"{show(args)}")
    blocks = args["blocks"]
    if not all(is_int(b) for b in blocks):
        raise ProtocolError("garbage", f"args.blocks: expected block ids, got {show(blocks)}")
    keys = []
    for i, k in enumerate(args["keys"]):
        if not (isinstance(k, list) and len(k) == 2 and isinstance(k[0], str) and is_int(k[1])):
            raise ProtocolError("garbage", f"args.keys[{i}]: expected [hex hash, group], got {show(k)}")
        try:
            keys.append((bytes.fromhex(k[0]), k[1]))
        except ValueError:
            raise ProtocolError("garbage", f"args.keys[{i}][0]: not hex: {show(k[0])}") from None
    return blocks, keys


_BOOL = frozenset({bool})
_ID_OR_NULL = frozenset({int, type(None)})


def read_observed(value: Json, blocks: int, keys: int) -> tuple[int, list[bool], list[int | None]]:
    """The answer to an observe line: ``{"result": {"num_free": n, "writable": [...],
    "cached": [...]}, ...}``, one writability per block and one block id (or null) per key."""
    if not isinstance(value, dict):
        raise ProtocolError("garbage", f"expected an answer object, got {show(value)}")
    if value.get("error") is not None:
        raise ProtocolError("garbage", f"error: the observe line was refused ({show(value['error'])})")
    result = value.get("result")
    if not isinstance(result, dict):
        raise ProtocolError("garbage", f"result: expected {{\"num_free\", \"writable\", \"cached\"}}, "
                            f"got {show(result)}")
    num_free: Any = result.get("num_free")
    writable, cached = result.get("writable"), result.get("cached")
    if not is_int(num_free):
        raise ProtocolError("garbage", f"result.num_free: expected an integer, got {show(num_free)}")
    if not (isinstance(writable, list) and len(writable) == blocks and set(map(type, writable)) <= _BOOL):
        raise ProtocolError("garbage", f"result.writable: expected {blocks} true/false, got "
                            f"{show(writable)}")
    if not (isinstance(cached, list) and len(cached) == keys and set(map(type, cached)) <= _ID_OR_NULL):
        raise ProtocolError("garbage", f"result.cached: expected {keys} block ids or null, got "
                            f"{show(cached)}")
    return num_free, writable, cached


def read_observed_field(value: Json, blocks: int, keys: int) -> tuple[int, list[bool], list[int | None]]:
    """The ``observed`` of an answer to a call line that carried ``observe`` (what it asked, after
    the call), read as an observe line's result."""
    if not isinstance(value, dict) or "observed" not in value:
        raise ProtocolError("garbage", "observed: missing (the call line asked for it with observe)")
    return read_observed({"result": value["observed"], "error": None}, blocks, keys)


def observe_queries(blocks: Sequence[int], keys: Sequence[Json],
                    observed: tuple[int, list[bool], list[int | None]]) -> list[dict[str, Json]]:
    """The trace lines an observe line stands for: ``get_num_free_blocks``, then
    ``is_block_writable`` of each block and ``get_cached_block`` of each key (``[hex, group]``)."""
    num_free, writable, cached = observed
    out: list[dict[str, Json]] = [{"op": "get_num_free_blocks", "args": {}, "result": num_free, "error": None,
                                   "events": [], "fired": []}]
    out += [{"op": "is_block_writable", "args": {"block_id": b}, "result": w, "error": None, "events": [],
             "fired": []} for b, w in zip(blocks, writable, strict=True)]
    out += [{"op": "get_cached_block", "args": {"block_hash": k[0], "kv_cache_group_ids": [k[1]]},
             "result": None if c is None else [c], "error": None, "events": [], "fired": []}
            for k, c in zip(keys, cached, strict=True)]
    return out


def trace_lines(lines: Sequence[dict[str, Json]]) -> list[dict[str, Json]]:
    """Exchanged lines as trace lines: each ``observe`` line as the queries it stands for."""
    out: list[dict[str, Json]] = []
    for line in lines:
        if line.get("op") == OBSERVE:
            args = line["args"]
            out += observe_queries(args["blocks"], args["keys"], line["result"])
        else:
            out.append(line)
    return out


SHOWN_FIELDS = ("ref", "primary", "secondary", "watched")
"""What ``shown`` says of each block an observe line names (as an observation's entries)."""


def read_shown(value: Json, blocks: int, keys: int, shape: frozenset[str]) -> dict[str, Json]:
    """An observe answer's ``shown`` (a process that shows its pool when asked): per named block
    its entries of the observation's fields it shows (``watched`` as true/false), and with
    ``index`` the blocks of each named key; checked as the trace reader checks an observation."""
    shown = value.get("shown") if isinstance(value, dict) else None
    if not isinstance(shown, dict):
        raise ProtocolError("garbage", "shown: missing (the header's answer said show_when_asked)")
    want = [f for f in SHOWN_FIELDS if f in shape] + (["index"] if "index" in shape else [])
    for name in want:
        got = shown.get(name)
        count = keys if name == "index" else blocks
        if not (isinstance(got, list) and len(got) == count):
            raise ProtocolError("garbage", f"shown.{name}: expected {count} entries, got {show(got)}")
    fake: dict[str, Json] = {"ref": shown["ref"], "free": [], "num_free": 0, "primary": shown["primary"]}
    if "secondary" in want:
        fake["secondary"] = shown["secondary"]
    if "index" in want:
        fake["index"] = [["00" * 5, ids] for ids in shown["index"]]
    try:  # its entries, as an observation's, read by the trace reader
        parse_step({"op": "get_num_free_blocks", "args": {}, "result": 0, "error": None, "events": [],
                    "observation": fake}, 1)
    except FieldError as exc:
        raise ProtocolError("garbage", f"shown: {str(exc).replace('observation.', '')}") from None
    if "watched" in want and not set(map(type, shown["watched"])) <= _BOOL:
        raise ProtocolError("garbage", f"shown.watched: expected true/false per block, got "
                            f"{show(shown['watched'])}")
    return shown


def read_told(value: Json) -> list[tuple[str, int | None]]:
    """An answer's ``told``: what the metrics collector was told during the call, in order."""
    told = value.get("told") if isinstance(value, dict) else None
    if told is None:
        raise ProtocolError("garbage", "told: missing (the header's answer said the pool reports a "
                            "metrics collector's calls)")
    out: list[tuple[str, int | None]] = []
    for i, t in enumerate(told if isinstance(told, list) else [told]):
        if not (isinstance(t, list) and len(t) == 2 and t[0] in TOLD and (t[1] is None or is_int(t[1]))):
            raise ProtocolError("garbage", f"told[{i}]: expected [one of {list(TOLD)}, block id or null], "
                                f"got {show(t)}")
        out.append((t[0], t[1]))
    return out


def message_of(value: Json) -> str | None:
    """A refusal's ``message``, when the answer carries one (a string; anything else is ignored)."""
    message = value.get("message") if isinstance(value, dict) else None
    return message if isinstance(message, str) and message else None


def read_call(value: Json, number: int) -> TraceStep:
    """The process's side: a call line, its arguments decoded as the trace reader decodes them."""
    if not isinstance(value, dict) or "op" not in value or "args" not in value:
        raise ProtocolError("garbage", f"expected {{\"op\": ..., \"args\": ...}}, got {show(value)}")
    # A call line without its answer: an error name lets the reader take a null result.
    try:
        return parse_step({"op": value["op"], "args": value["args"], "result": None,
                           "error": "Unanswered", "events": []}, number)
    except FieldError as exc:
        raise ProtocolError("garbage", str(exc)) from None


__all__ = ["ANSWER_FIELDS", "KEY", "OBSERVE", "OPERATION_NAMES", "POOL_FIELDS",
           "SHOWN_FIELDS", "TOLD", "VERSION", "HeaderAnswer", "ProtocolError", "call_line",
           "decode", "encode", "header", "message_of", "observe_line", "observe_queries", "pool_fields",
           "read_answer", "read_call", "read_header_answer", "read_observe_args", "read_observed",
           "read_observed_field", "read_pool", "read_shown", "read_told", "text", "trace_header",
           "trace_lines"]
