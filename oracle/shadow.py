"""A shadow inside a running engine: every call of a real pool also runs on the model, compared.

:class:`Shadow` sits beside one pool with the reference API (vLLM's own
``BlockPool``, kvpool's, another).  Each call goes to the pool first and its
result, or its exception, goes back to the caller unchanged: the engine
behaves exactly as without the shadow.  Then the same call runs on the model
through the lockstep (:class:`~.trace.record.RecordingLockstep`, whose pool
is a stand-in that replays what the real pool just did), which compares the
result, the events the call queued, the reuse watchers it fired and the
call's footprint, and the whole pool every ``full_every`` calls.  Each call
is written as it is made to a trace file of that pool
(``oracle/TRACE_FORMAT.md``): memory does not grow with the run.

On the first divergence or broken caller contract of a pool the shadow
moves that pool's trace (every call since the pool was created; the last
call's line carries the pool's observation, so that ``kvpool check-trace``
names the same call) to :data:`ENV_DIR` (or the temporary directory), logs
one line with the file and the first difference, and stops shadowing that
pool; with :data:`ENV_STRICT` set to 1 it raises :class:`ShadowDivergence`
from the call instead (after the pool ran it).  A failure of the shadow
itself is logged the same way and stops the shadow, never the engine.

Two ways to put a shadow on a pool: :func:`shadowed_class` makes a subclass
of a pool class whose pools shadow themselves (the vLLM plugin installs one
in place of vLLM's ``BlockPool``), :class:`ShadowPool` wraps one fresh pool
object.  Standard library, the model and the oracle only: no z3, no Hypothesis.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import itertools
import json
import logging
import os
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kvpool.model import OPERATIONS, POOL_OPERATIONS, REFERENCES, Operation, initial_state
from kvpool.model.request import Prefix
from kvpool.model.state import Key

from .core.abstraction import key_of, refusal_name, same_refusal, vllm_refusal
from .core.lockstep import CallerBrokeContract, CallRecord, Divergence, Lockstep, Watcher, short_args
from .core.observe import Observer
from .trace.check import model_call
from .trace.read import TraceStep, parse_call, parse_header
from .trace.record import RecordingLockstep
from .trace.schema import ARG_KINDS, VERSION, Json
from .trace.write import (
    encode_args,
    encode_model_result,
    encode_result,
    event_to_json,
    model_event_to_json,
    observation_to_json,
    request_to_json,
)

ENV_DIR = "KVPOOL_SHADOW_DIR"
"""Where a diverging pool's trace is written (default: the temporary directory's ``kvpool-shadow``)."""
ENV_STRICT = "KVPOOL_SHADOW_STRICT"
"""``1``: a divergence raises :class:`ShadowDivergence` from the call instead of being logged."""
ENV_KEEP = "KVPOOL_SHADOW_KEEP"
"""``1``: keep every pool's trace when the pool goes, not only a diverging one's (to build corpora)."""
ENV_FULL_EVERY = "KVPOOL_SHADOW_FULL_EVERY"
"""Compare the whole pool every this many calls (default: the pool's number of blocks)."""
ENV_REFERENCE = "KVPOOL_SHADOW_REFERENCE"
"""The vLLM behaviour the model reproduces (default ``0.31``)."""
FIRST_LINE = 400
"""The logged difference is cut to this many characters."""

logger = logging.getLogger("kvpool.shadow")


class ShadowDivergence(AssertionError):
    """A shadowed pool diverged from the model (raised only with :data:`ENV_STRICT`)."""

    def __init__(self, text: str, path: Path | None) -> None:
        super().__init__(text)
        self.path = path


class Unmodelled(Exception):
    """A call the shadow cannot put to the model (the pool then goes unshadowed, said in one line)."""


@dataclass
class Totals:
    """What the shadows of this process did (written as JSON at exit when :data:`ENV_DIR` is set)."""

    pools: int = 0
    calls: int = 0
    divergences: int = 0
    contracts: int = 0
    stopped: int = 0
    """Pools whose shadow stopped for a reason of its own (a call it cannot model, a failure)."""
    traces: list[str] = field(default_factory=list)
    """Every trace written: a diverging pool's, or every pool's with :data:`ENV_KEEP`."""
    findings: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "pools": self.pools, "calls": self.calls,
                "divergences": self.divergences, "contracts": self.contracts, "stopped": self.stopped,
                "traces": self.traces, "findings": self.findings}


TOTALS = Totals()
_live: weakref.WeakSet[Shadow] = weakref.WeakSet()
"""Every active shadow: where a key copied from another pool is looked up."""
_numbers = itertools.count(1)
_lock = threading.Lock()


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


def shadow_dir() -> Path:
    """Where traces go: :data:`ENV_DIR`, or ``kvpool-shadow`` in the temporary directory."""
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / "kvpool-shadow")


# ---------------------------------------------------------------------- the stand-ins


class _Replay:
    """Stands in for the pool inside the lockstep: the call it makes is the one the pool just made.

    Everything else is the pool's (the lockstep reads its blocks).  When the
    lockstep calls the armed operation, the call's deferred effects run (its
    watcher firings and events are noted where the lockstep looks for them)
    and the pool's own outcome comes back.
    """

    def __init__(self, pool: Any) -> None:
        self.wrapped = pool
        self.outcome: tuple[Any, BaseException | None] = (None, None)
        self._op: str | None = None
        self._effects: Callable[[], None] = lambda: None

    def arm(self, op: str) -> None:
        """The lockstep (a recorder) arms the call: the outcome was set before."""

    def load(self, op: str, outcome: tuple[Any, BaseException | None], effects: Callable[[], None]) -> None:
        self._op, self.outcome, self._effects = op, outcome, effects

    def __getattr__(self, name: str) -> Any:
        if name == self._op:
            return self._played
        return getattr(self.wrapped, name)

    def _played(self, *_args: Any, **_kwargs: Any) -> Any:
        self._op = None
        self._effects()
        result, error = self.outcome
        if error is not None:
            raise error
        return result


class _Observed(Observer):
    """The pool observed as the lockstep observes it, its pending events being those its own calls
    queued (vLLM's offload manager appends events to its CPU pool's queue; a hisparse pool shares
    its owner's queue)."""

    def __init__(self, pool: Any, own: list[Any]) -> None:
        super().__init__(pool)
        self.own = own

    def pending_events(self) -> list[Any] | None:
        return self.own if self.has["pending events"] else None


class _Sink:
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
            self.out.write(_ENCODE(self.held) + "\n")
            self.lines += 1
            self.held = None


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""One line's JSON (one encoder for every line: ``json.dumps`` with options makes one a call)."""

REQUEST_LINE = "kvpool_request"
"""The field naming a request record in a shadow's working file (never in a kept trace)."""


class _Requests:
    """Requests written once into a pool's working file, then by reference.

    A call line of the trace format carries its request whole (every token
    and hash so far); an engine calls the pool many times per request, so the
    working file holds each request's tokens and hashes once, as records
    that add what is new (:func:`expand` writes the trace format from it when
    the file is kept).  A call line names the request and how many tokens and
    hashes it had then.
    """

    def __init__(self, sink: Callable[[dict[str, Json]], None]) -> None:
        self.sink = sink
        self.known: dict[int, tuple[Any, int, int, int]] = {}
        """Per live request (by id, checked by a weak reference): (reference, number, tokens, hashes)."""
        self.numbers = itertools.count(1)

    def __call__(self, req: Any) -> Json:
        key = id(req)
        kept = self.known.get(key)
        if kept is None or kept[0]() is not req:
            whole = request_to_json(req)  # the first time: checks it can be written at all
            number = next(self.numbers)
            try:
                ref = weakref.ref(req, lambda _r: self.known.pop(key, None))
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
    """Write the trace format from a shadow's working file.

    The working file holds each call's operation and arguments only (requests
    by reference, :class:`_Requests`), and the last call's whole line: every
    call before it agreed with the model, so its result, events and watcher
    firings are the model's, computed here by running the calls again on a
    fresh model.
    """
    requests: dict[int, dict[str, Json]] = {}
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
                ref = line.pop(REQUEST_LINE)
                if "more_tokens" in line:
                    requests[ref]["all_token_ids"] += line["more_tokens"]
                    requests[ref]["block_hashes"] += line["more_hashes"]
                else:
                    requests[ref] = line
                continue
            for name, kind in ARG_KINDS.get(line.get("op"), {}).items():
                value = line["args"].get(name)
                if kind == "request" and isinstance(value, dict) and REQUEST_LINE in value:
                    whole = requests[value[REQUEST_LINE]]
                    line["args"][name] = {**whole, "all_token_ids": whole["all_token_ids"][:value["tokens"]],
                                          "block_hashes": whole["block_hashes"][:value["hashes"]]}
            if "result" not in line:  # an agreeing call: what came of it is the model's
                op, args = parse_call(line)
                step = TraceStep(number, op, args, None, None, [], None, None)
                new, result, error = model_call(state, step, watchers, fired)
                line.update(_model_outcome(step.op, new, result, error, fired))
                state = new
            dst.write(_ENCODE(line) + "\n")


def _model_outcome(op: str, state: Any, result: Any, error: BaseException | None,
                   fired: list[tuple[str, int]]) -> dict[str, Json]:
    """A call line's outcome fields as the model gives them."""
    if error is not None:
        return {"result": None, "error": refusal_name(error), "events": [], "fired": []}
    out = state.out
    events = [] if op == "take_events" else [model_event_to_json(e) for e in out.events]
    return {"result": encode_model_result(op, result), "error": None, "events": events,
            "fired": [[w.name, b] for w, b in out.fired]}


class _ShadowLockstep(RecordingLockstep):
    """The recorder, writing each call's operation and arguments only (what came of it is the
    model's, until a call differs: that one is written whole, :func:`rebuild`), and keeping no
    copy of the model per call (there are no pictures to draw)."""

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        line: dict[str, Json] = {"op": op, "args": encode_args(op, args, kwargs, self.request_form)}
        pending = self.observer.pending_events()
        queued = len(pending) if pending is not None else 0
        self.fired_now.clear()
        try:
            result = Lockstep.call(self, op, *args, **kwargs)
        except Divergence:
            self._whole(op, line, queued)
            raise
        self.written += 1
        if self.sink is not None:
            self.sink(line)
        return result

    def _whole(self, op: str, line: dict[str, Json], queued: int) -> None:
        """The differing call's line: the pool's outcome, as it was."""
        result, error = self.pool.outcome
        line["result"] = None if error else encode_result(op, result)
        line["error"] = type(error).__name__ if error else None
        pending = self.observer.pending_events()
        line["events"] = None if pending is None else [] if op == "take_events" else [
            event_to_json(e) for e in pending[queued:]]
        line["fired"] = [[n, b] for n, b in self.fired_now]
        self.written += 1
        if self.sink is not None:
            self.sink(line)

    def _record(self, op: str, args: Any, outcome: str, error: str | None) -> None:
        self.trace.append(CallRecord(op, tuple(args), outcome, error, None))

    def _pool_args(self, decl: Operation, args: Sequence[Any]) -> tuple[Any, ...]:
        return ()  # the stand-in replays what the pool did with the engine's own arguments


@dataclass
class _Lora:
    """A LoRA adapter as a copied key's content names it (name and path decide the KV)."""

    lora_name: str
    lora_path: str
    lora_int_id: int = 0

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name


@dataclass
class _Span:
    offset: int
    length: int


@dataclass
class _Item:
    identifier: str
    mm_position: _Span


@dataclass
class CopiedKey:
    """The request a key copied from another pool stands for (``_insert_block_hash``'s ghost).

    vLLM's offload manager hands the CPU pool only the key of a GPU block; the
    model needs the prefix the key names.  The GPU pool's shadow knows it (the
    model's ghost ``names``): this request holds that prefix's tokens and extra
    keys, and the key's hash as the hash of its last chunk.
    """

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[bytes]
    lora_request: _Lora | None = None
    mm_features: list[_Item] = field(default_factory=list)
    cache_salt: str | None = None
    session_id: str | None = None
    prompt_embeds: None = None

    @classmethod
    def of(cls, key: Key, prefix: Prefix, hash_block_size: int, number: int) -> CopiedKey:
        tokens: list[int] = []
        lora, salt = None, None
        items: dict[tuple[str, int], int] = {}  # (identifier, offset) -> end of the last chunk it is in
        for i, (chunk, tags) in enumerate(prefix):
            start = i * hash_block_size
            tokens.extend(chunk)
            for tag in tags or ():
                if tag[0] == "lora":
                    lora = _Lora(tag[1], tag[2])
                elif tag[0] == "mm":
                    items[(tag[1], start + tag[2])] = start + len(chunk)
                elif tag[0] == "cache_salt":
                    salt = tag[1]
                else:
                    raise Unmodelled(f"a copied key names a prefix with {tag[0]}, which a trace cannot carry")
        mm = [_Item(ident, _Span(offset, end - offset)) for (ident, offset), end in sorted(
            items.items(), key=lambda kv: kv[0][1])]
        return cls(f"copied-key-{number}", tokens, [key[0]] * len(prefix), lora, mm, salt)


# ---------------------------------------------------------------------- the shadow


class Shadow:
    """The model beside one pool, compared after every call (see the module docstring)."""

    def __init__(self, pool: Any, *, name: str | None = None, reference: str | None = None,
                 directory: Path | None = None, strict: bool | None = None, keep: bool | None = None,
                 full_every: int | None = None, log: logging.Logger | None = None) -> None:
        self.pool = pool
        self.number = next(_numbers)
        self.name = name or f"{type(pool).__name__}-{os.getpid()}-{self.number}"
        self.strict = _flag(ENV_STRICT) if strict is None else strict
        self.keep = _flag(ENV_KEEP) if keep is None else keep
        self.log = log or logger
        self.directory = directory or shadow_dir()
        self.reference = reference or os.environ.get(ENV_REFERENCE) or "0.31"
        self.active = False
        self.depth = 0
        """Calls of this pool in progress: a pool's calls to itself are its own business."""
        self.calls = 0
        self.path: Path | None = None
        self.own: list[Any] = []
        """The events this pool's calls queued and nobody took yet."""
        self._queue: Any = None
        self._signatures: dict[str, inspect.Signature | None] = {}
        self._fired: list[tuple[Watcher, Any]] = []
        self._copied = itertools.count(1)
        num_blocks = len(pool.blocks)
        caching = bool(pool.enable_caching)
        events = bool(getattr(pool, "enable_kv_cache_events", False))
        medium = str(getattr(pool, "medium", "GPU"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.part = self.directory / f".{self.name}.jsonl.part"
        self.out = open(self.part, "w", encoding="utf-8")  # noqa: SIM115 (closed when the pool goes)
        header: dict[str, Json] = {
            "kvpool_trace": VERSION, "num_blocks": num_blocks, "enable_caching": caching,
            "hash_block_size": int(pool.hash_block_size), "enable_kv_cache_events": events,
            "medium": medium, "reference": self.reference,
            "meta": {"shadow": self.name, "pool": f"{type(pool).__module__}:{type(pool).__qualname__}",
                     "pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST")}}
        kvpool_pool = _is_kvpool_pool(pool)
        if not kvpool_pool:
            header["vllm_errors"] = True  # check-trace reads it: refusals matched as recorded
        self.out.write(json.dumps(header, separators=(",", ":")) + "\n")
        self.sink = _Sink(self.out)
        self.replay = _Replay(pool)
        model = initial_state(num_blocks, caching, int(pool.hash_block_size), events, medium,
                              **REFERENCES[self.reference])
        if full_every is None and os.environ.get(ENV_FULL_EVERY, "").strip().isdigit():
            full_every = max(1, int(os.environ[ENV_FULL_EVERY]))
        if full_every is None:  # an engine's pool lives long: one block's worth of whole checking a call
            full_every = max(1, num_blocks)
        self.pair = _ShadowLockstep(pool=self.replay, model=model, full_every=full_every,
                                    errors_match=same_refusal if kvpool_pool else vllm_refusal,
                                    keep_observations=False, sink=self.sink,
                                    local_invariants=False, request_form=_Requests(self.sink))
        self.pair.observer = _Observed(pool, self.own)
        self._queue = getattr(pool, "kv_event_queue", None)
        self.active = True
        with _lock:
            TOTALS.pools += 1
        _live.add(self)
        _at_exit()
        weakref.finalize(pool, _close, self.out, self.part, self.directory / f"{self.name}.jsonl",
                         self.keep, self.sink)

    # ------------------------------------------------------------ one call

    def call(self, op: str, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``real(*args, **kwargs)`` (the pool's ``op``), then the same call on the model."""
        if not self.active or self.depth:
            return real(*args, **kwargs)
        # An iterator is read once: the pool gets it as a list (before anything else can fail).
        if any(hasattr(a, "__next__") and isinstance(a, Iterator) for a in (*args, *kwargs.values())):
            args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
            kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        try:
            args, kwargs, model_args = self._translate(op, real, args, kwargs)
        except Unmodelled as why:
            self._stop(f"cannot model {op}: {why}")
            return real(*args, **kwargs)
        except Exception as exc:  # the shadow's own failure: never the engine's
            self._failed(exc)
            return real(*args, **kwargs)
        queue = self._events_list()
        queued = len(queue) if queue is not None else 0
        self._fired = []
        self.depth += 1
        try:
            result, error = real(*args, **kwargs), None
        except Exception as exc:
            result, error = None, exc
        finally:
            self.depth -= 1
        self.depth += 1  # the observation's lookups are the shadow's, not the engine's
        try:
            self._check(op, model_args, result, error, queue, queued)
        except ShadowDivergence:
            raise
        except Exception as exc:
            self._failed(exc)
        finally:
            self.depth -= 1
        if error is not None:
            raise error
        return result

    def _events_list(self) -> list[Any] | None:
        queue = getattr(self.pool, "kv_event_queue", None)
        return queue if isinstance(queue, list) else None

    def _check(self, op: str, model_args: tuple[Any, ...], result: Any, error: BaseException | None,
               queue: list[Any] | None, queued: int) -> None:
        self._taken_elsewhere(queue)
        shown = result
        if op == "take_events" and error is None and isinstance(result, list) and queue is not None:
            mine = {id(e) for e in self.own}
            shown = [e for e in result if id(e) in mine]
        fired = self._fired

        def effects() -> None:
            for watcher, block in fired:
                watcher(block)
            after = self._events_list()
            if op == "take_events":
                self.own.clear()
            elif after is not None:
                self.own.extend(after[queued:] if after is queue else after)
            self._queue = after

        self.replay.load(op, (shown, error), effects)
        self.calls += 1
        with _lock:
            TOTALS.calls += 1
        try:
            self.pair.call(op, *model_args)
        except Divergence as found:
            self._diverged(found)

    def _taken_elsewhere(self, queue: list[Any] | None) -> None:
        """Events this pool queued that another pool's ``take_events`` took (a shared queue): the
        model takes them too, written in the trace as this pool's ``take_events``.

        They were compared when they were queued; the engine may have changed them since
        (vLLM's manager sets ``kv_cache_spec_kind`` on the events it takes), so the line
        carries them as the model has them.
        """
        if not self.own or queue is None or queue is self._queue:
            return
        self._queue = queue
        left = {id(e) for e in queue}
        if any(id(e) in left for e in self.own):
            return
        self.own.clear()
        taken = OPERATIONS["take_events"].run(self.pair.model, ())
        self.calls += 1
        self.pair.steps += 1
        self.sink({"op": "take_events", "args": {}, "result": [model_event_to_json(e) for e in taken],
                   "error": None, "events": [], "fired": []})

    # ------------------------------------------------------------ what the model receives

    def _signature(self, op: str, real: Callable[..., Any]) -> inspect.Signature | None:
        if op not in self._signatures:
            try:
                sig: inspect.Signature | None = inspect.signature(real)
            except (TypeError, ValueError):
                sig = None
            varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            if sig is not None and any(p.kind in varying for p in sig.parameters.values()):
                sig = None
            self._signatures[op] = sig
        return self._signatures[op]

    def _translate(self, op: str, real: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...]]:
        """The call as the pool receives it (iterators made lists, watchers that also tell the
        lockstep) and as the model receives it (block ids)."""
        sig = self._signature(op, real)
        if sig is None:
            raise Unmodelled(f"the pool's {op} takes arbitrary arguments")
        names = list(sig.parameters)
        if not kwargs and len(args) == len(names):  # the common call: every argument by position
            values = list(args)
        else:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise Unmodelled(f"{op} called as its signature does not allow: {exc}") from None
            bound.apply_defaults()
            names, values = list(bound.arguments), list(bound.arguments.values())
        decl = OPERATIONS[op]
        if op == "_insert_block_hash":
            return args, kwargs, self._insert_args(values)
        if len(values) < len(decl.args):
            raise Unmodelled(f"the pool's {op} takes fewer arguments than the model's")
        pool_values = list(values)
        model: list[Any] = []
        for i, a in enumerate(decl.args):
            v = values[i]
            if a.kind == "block":
                model.append(self._id(v))
            elif a.kind == "blocks":
                listed = list(v)
                if op == "free_blocks":  # blocks of another pool are handed to it (a call of its own)
                    listed = [b for b in listed if not self._handed_on(b)]
                model.append([self._id(b) for b in listed])
            elif a.kind in ("block_ids", "groups"):
                model.append(list(v))
            elif a.kind == "watcher":
                model.append(self._watcher(v, pool_values, i))
            elif a.kind == "mask?":
                model.append(None if v is None else list(v))
            else:
                model.append(v)
        if any(a is not b for a, b in zip(pool_values, values, strict=True)):
            args, kwargs = _rebuilt(names, pool_values, args, kwargs)
        return args, kwargs, tuple(model)

    def _id(self, block: Any) -> int:
        """A block's id in this pool; the first id past the pool for a block not of it."""
        blocks = self.pool.blocks
        i = getattr(block, "block_id", None)
        if isinstance(i, int) and 0 <= i < len(blocks) and blocks[i] is block:
            return i
        return len(blocks)

    def _handed_on(self, block: Any) -> bool:
        owner = getattr(block, "pool", None)
        return owner is not None and owner is not self.pool and self._id(block) == len(self.pool.blocks)

    def _watcher(self, on_reuse: Any, pool_values: list[Any], i: int) -> Any:
        """A named watcher for the model; the pool gets a callable that notes each firing for the
        lockstep and calls ``on_reuse`` (whose result or exception is the pool's to see)."""
        if not callable(on_reuse):
            return on_reuse
        watcher = self.pair.watcher(f"w{self.calls + 1}")
        fired = self

        def told(block: Any) -> Any:
            fired._fired.append((watcher, block))
            return on_reuse(block)

        pool_values[i] = told
        return watcher

    def _insert_args(self, values: list[Any]) -> tuple[Any, ...]:
        """``_insert_block_hash(key, block, num_tokens)`` as the model's ``(request, prefix_tokens,
        group, block, num_tokens)``: the key's prefix is read from the pool it was copied from."""
        key_bytes, block, num_tokens = values[0], values[1], values[2] if len(values) > 2 else None
        try:
            key = key_of(bytes(key_bytes))
        except Exception:
            raise Unmodelled(f"{short_args([key_bytes])} is not an index key") from None
        prefix = None
        for other in sorted(_live, key=lambda s: s is self):
            named = other.pair.model.names.get(key)
            if named is not None and other.pair.model.hash_block_size == self.pair.model.hash_block_size:
                prefix = named
                break
        if prefix is None:
            raise Unmodelled(f"no shadowed pool knows the prefix key …{key[0][-3:].hex()}/g{key[1]} names")
        hbs = self.pair.model.hash_block_size
        request = CopiedKey.of(key, prefix, hbs, next(self._copied))
        return request, len(prefix) * hbs, key[1], self._id(block), num_tokens

    # ------------------------------------------------------------ the end of a shadow

    def _diverged(self, found: Divergence) -> None:
        contract = isinstance(found, CallerBrokeContract)
        text = str(found)
        first = text.splitlines()[0] if text else type(found).__name__
        if len(first) > FIRST_LINE:
            first = first[:FIRST_LINE] + " …"
        if not contract and self.sink.held is not None:
            with contextlib.suppress(Exception):  # a pool too broken to observe: the line stays as it is
                self.sink.held["observation"] = observation_to_json(self.pair.observer.observe())
        path = self._finish(keep=True)
        kind = "caller broke a contract" if contract else "diverged"
        with _lock:
            if contract:
                TOTALS.contracts += 1
            else:
                TOTALS.divergences += 1
            TOTALS.findings.append({"pool": self.name, "kind": kind, "call": self.calls, "first": first,
                                    "trace": str(path), "test": os.environ.get("PYTEST_CURRENT_TEST")})
        line = (f"kvpool shadow: {self.name} {kind} at call {self.calls}: {first}; its calls since it "
                f"was created: {path} (kvpool check-trace {path})")
        if self.strict:
            raise ShadowDivergence(line + "\n" + text, path) from found
        self.log.warning("%s", line)

    def _stop(self, why: str) -> None:
        self._finish(keep=self.keep)
        with _lock:
            TOTALS.stopped += 1
            TOTALS.findings.append({"pool": self.name, "kind": "stopped", "call": self.calls, "first": why,
                                    "trace": None, "test": os.environ.get("PYTEST_CURRENT_TEST")})
        self.log.warning("kvpool shadow: %s is no longer shadowed after %d calls: %s", self.name,
                         self.calls, why)

    def _failed(self, exc: Exception) -> None:
        if self.strict:
            raise exc
        self._stop(f"the shadow failed: {exc!r}")

    def _finish(self, keep: bool) -> Path | None:
        """Stop shadowing; the trace kept (returned) or removed."""
        self.active = False
        _live.discard(self)
        return _close(self.out, self.part, self.directory / f"{self.name}.jsonl", keep, self.sink)


def _close(out: TextIO, part: Path, final: Path, keep: bool, sink: _Sink) -> Path | None:
    """Close a pool's trace: kept as ``final``, or removed (idempotent)."""
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
    with _lock:
        TOTALS.traces.append(str(final))
    return final


def _is_kvpool_pool(pool: Any) -> bool:
    try:
        # lazy: kvpool's own pool, only as the default target (the oracle never needs impl)
        from kvpool.impl import BlockPool
    except ImportError:  # pragma: no cover - kvpool.impl ships with kvpool
        return False
    return isinstance(pool, BlockPool)


_exit_registered = False


def _at_exit() -> None:
    """Once: at exit, write this process's totals to :data:`ENV_DIR` (when set)."""
    global _exit_registered
    if _exit_registered:
        return
    _exit_registered = True

    def write() -> None:
        if not os.environ.get(ENV_DIR):
            return
        for s in list(_live):  # pools still alive at exit: their traces close (kept with ENV_KEEP)
            s._finish(keep=s.keep)
        with contextlib.suppress(OSError):
            path = shadow_dir() / f"totals-{os.getpid()}.json"
            path.write_text(json.dumps(TOTALS.to_json(), indent=1) + "\n", encoding="utf-8")

    atexit.register(write)


def _rebuilt(names: list[str], values: list[Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments as the caller passed them (positional or by name), with new values."""
    out_args = list(args)
    out_kwargs = dict(kwargs)
    for i, (name, value) in enumerate(zip(names, values, strict=True)):
        if i < len(out_args):
            out_args[i] = value
        elif name in out_kwargs:
            out_kwargs[name] = value
    return tuple(out_args), out_kwargs


# ---------------------------------------------------------------------- the two faces


def shadow_of(pool: Any) -> Shadow | None:
    """The shadow watching ``pool`` (a pool of a :func:`shadowed_class` or a :class:`ShadowPool`)."""
    found = (object.__getattribute__(pool, "_kvpool_shadow") if isinstance(pool, ShadowPool)
             else getattr(pool, "_kvpool_shadow", None))
    return found if isinstance(found, Shadow) else None


def _method(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        shadow = self.__dict__.get("_kvpool_shadow")
        if shadow is None:
            return real(self, *args, **kwargs)
        return shadow.call(op, real.__get__(self), args, kwargs)

    method.__name__ = method.__qualname__ = op
    method.__doc__ = real.__doc__
    return method


def shadowed_class(base: type, **options: Any) -> type:
    """A subclass of the pool class ``base`` whose every pool is shadowed from its creation.

    Only calls from outside the pool are shadowed (a pool calling its own
    operations is its own business); ``options`` go to :class:`Shadow`.
    """
    namespace: dict[str, Any] = {"__module__": __name__,
                                 "__doc__": f"{base.__qualname__}, shadowed by the model."}
    for op in POOL_OPERATIONS:
        real = getattr(base, op, None)
        if callable(real):
            namespace[op] = _method(op, real)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)  # type: ignore[misc]
        try:
            self.__dict__["_kvpool_shadow"] = Shadow(self, **options)
        except Exception as exc:  # never the engine's failure
            if _flag(ENV_STRICT):
                raise
            logger.warning("kvpool shadow: %s not shadowed: %r", type(self).__name__, exc)

    namespace["__init__"] = __init__
    namespace["_kvpool_shadowed_base"] = base
    return type(f"Shadowed{base.__name__}", (base,), namespace)


class ShadowPool:
    """One fresh pool object behind a shadow: the pool's attributes, its operations shadowed."""

    def __init__(self, pool: Any, **options: Any) -> None:
        object.__setattr__(self, "_kvpool_pool", pool)
        object.__setattr__(self, "_kvpool_shadow", Shadow(pool, **options))

    def __getattr__(self, name: str) -> Any:
        pool = object.__getattribute__(self, "_kvpool_pool")
        attr = getattr(pool, name)
        if name in OPERATIONS and callable(attr):
            shadow: Shadow = object.__getattribute__(self, "_kvpool_shadow")
            return lambda *args, **kwargs: shadow.call(name, attr, args, kwargs)
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_kvpool_pool"), name, value)

    @property
    def wrapped(self) -> Any:
        """The pool itself."""
        return object.__getattribute__(self, "_kvpool_pool")


def shadowed(pools: Iterable[Any]) -> Iterator[Shadow]:
    """The shadows of ``pools`` (those that have one)."""
    for pool in pools:
        found = shadow_of(pool)
        if found is not None:
            yield found


__all__ = ["ENV_DIR", "ENV_FULL_EVERY", "ENV_KEEP", "ENV_REFERENCE", "ENV_STRICT", "TOTALS", "CopiedKey",
           "Shadow", "ShadowDivergence", "ShadowPool", "Totals", "shadow_dir", "shadow_of", "shadowed",
           "shadowed_class"]
