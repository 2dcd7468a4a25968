"""A shadowed pool's working file: every call since the pool was created, kept on disk, not in memory.

The checker writes each call's operation and arguments as it checks it
(requests once, then by number: ``oracle/TRACE_FORMAT.md``'s request lines),
and the whole line of a call that differs.  When the file is kept (a
divergence, or :data:`~.settings.ENV_KEEP`), :func:`rebuild` writes it in the
trace format: the outcome of every call that agreed is the model's, computed
by running the calls again on a fresh model.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvpool.model import REFERENCES, initial_state

from ..core.abstraction import refusal_name
from ..core.lockstep import Watcher
from ..trace.check import model_call
from ..trace.read import Requests, TraceStep, parse_call, parse_header
from ..trace.schema import REQUEST_LINE, Json
from ..trace.write import encode_model_result, model_event_to_json, request_to_json
from .settings import TOTALS, logger

ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""One line's JSON (one encoder for every line: ``json.dumps`` with options makes one a call)."""


class Sink:
    """Trace lines to a file as they come, the last one held back until the next (a divergence
    adds the pool's observation to it)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.held: dict[str, Json] | None = None
        self.lines = 0

    def __call__(self, line: dict[str, Json]) -> None:
        self.flush()
        self.held = line

    def flush(self) -> None:
        if self.held is not None:
            self.out.write(ENCODE(self.held) + "\n")
            self.lines += 1
            self.held = None


class Numbered:
    """Requests by number while they live: what the engine's side sends and a working file writes."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[Any, int, int, int]] = {}
        """Per live request (by id, checked by a weak reference): (reference, number, tokens, hashes)."""
        self.numbers = itertools.count(1)
        self.gone: list[int] = []

    def _died(self, key: int, number: int) -> None:
        kept = self.known.get(key)
        if kept is not None and kept[1] == number:
            del self.known[key]
        self.gone.append(number)


class RequestLines(Numbered):
    """Requests written once into a working file, then by number (the trace format's request lines).

    An engine calls the pool many times per request: the file holds each
    request's tokens and hashes once, then what each call adds; a request no
    longer alive is forgotten (a ``forget`` line, written before the next call
    line), so that a reader of the file holds only the live ones.
    """

    def __init__(self, sink: Callable[[dict[str, Json]], None]) -> None:
        super().__init__()
        self.sink = sink

    def forget_gone(self) -> None:
        """Write a ``forget`` line for each request that died since the last call."""
        while self.gone:
            self.sink({REQUEST_LINE: self.gone.pop(0), "forget": True})

    def __call__(self, req: Any) -> Json:
        key = id(req)
        kept = self.known.get(key)
        if kept is None or kept[0]() is not req:
            whole = request_to_json(req)  # the first time: checks it can be written at all
            number = next(self.numbers)
            try:
                ref = weakref.ref(req, lambda _r: self._died(key, number))
            except TypeError:  # a request that cannot be referred to weakly is written whole
                return whole
            self.sink({REQUEST_LINE: number, **whole})
            self.known[key] = (ref, number, len(whole["all_token_ids"]), len(whole["block_hashes"]))
            return {REQUEST_LINE: number, "tokens": len(whole["all_token_ids"]),
                    "hashes": len(whole["block_hashes"])}
        ref, number, tokens, hashes = kept
        now_tokens, now_hashes = len(req.all_token_ids), len(req.block_hashes)
        if now_tokens > tokens or now_hashes > hashes:  # a request only grows
            self.sink({REQUEST_LINE: number, "more_tokens": list(req.all_token_ids[tokens:]),
                       "more_hashes": [bytes(h).hex() for h in req.block_hashes[hashes:]]})
            self.known[key] = (ref, number, now_tokens, now_hashes)
        return {REQUEST_LINE: number, "tokens": now_tokens, "hashes": now_hashes}


def rebuild(working: Path, final: Path) -> None:
    """Write the trace format from a working file: each agreeing call's outcome is the model's."""
    requests = Requests()
    with working.open(encoding="utf-8") as src, final.open("w", encoding="utf-8") as dst:
        header_line = src.readline()
        dst.write(header_line)
        header = parse_header(json.loads(header_line))
        state = initial_state(header.num_blocks, header.enable_caching, header.hash_block_size,
                              header.enable_kv_cache_events, header.medium, **REFERENCES[header.reference])
        watchers: dict[str, Watcher] = {}
        fired: list[tuple[str, int]] = []
        for number, raw in enumerate(src, start=2):
            line = json.loads(raw)
            if REQUEST_LINE in line:
                requests.line(line)
                dst.write(raw)
                continue
            if "result" not in line:  # an agreeing call: what came of it is the model's
                op, args = parse_call(line, requests)
                step = TraceStep(number, op, args, None, None, [], None, None)
                new, result, error = model_call(state, step, watchers, fired)
                line.update(model_outcome(step.op, new, result, error, fired))
                state = new
            dst.write(ENCODE(line) + "\n")


def model_outcome(op: str, state: Any, result: Any, error: BaseException | None,
                  fired: list[tuple[str, int]]) -> dict[str, Json]:
    """A call line's outcome fields as the model gives them."""
    if error is not None:
        return {"result": None, "error": refusal_name(error), "events": [], "fired": []}
    out = state.out
    events = [] if op == "take_events" else [model_event_to_json(e) for e in out.events]
    return {"result": encode_model_result(op, result), "error": None, "events": events,
            "fired": [[w.name, b] for w, b in out.fired]}


def close_trace(out: TextIO, part: Path, final: Path, keep: bool, sink: Sink) -> Path | None:
    """Close a pool's working file: kept as a trace at ``final`` (returned), or removed (idempotent)."""
    if out.closed:
        return final if final.exists() else None
    with contextlib.suppress(OSError, ValueError, TypeError):
        sink.flush()
    out.close()
    if not keep:
        with contextlib.suppress(OSError):
            part.unlink()
        return None
    try:
        rebuild(part, final)
        part.unlink()
    except Exception as exc:  # the shadow's own failure: the working file is kept beside
        logger.warning("kvpool shadow: cannot write %s (%r); the calls are in %s", final, exc, part)
        return None
    TOTALS.traces.append(str(final))
    return final


__all__ = ["ENCODE", "Numbered", "RequestLines", "Sink", "close_trace", "model_outcome", "rebuild"]
