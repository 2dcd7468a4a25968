"""The checker's side of a shadow: each recorded call run on the model through the lockstep, compared.

:class:`Checker` receives what :mod:`.record` wrote down (in a checker
process, or on the engine's thread) and runs every call on the model
through the lockstep, whose pool is a stand-in replaying what the real pool
did (:class:`_Replay`): the result, the refusal, the events the call queued,
the reuse watchers it fired; the call's footprint on the live pool when the
checker runs beside it; the whole pool and every invariant at each
whole-pool check.  Each call goes to the pool's working file
(:mod:`.working`).  On the first divergence or broken caller contract of a
pool its trace is kept, one line is logged, and that pool is no longer
checked.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import itertools
import json
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import OPERATIONS, REFERENCES, Operation, initial_state

from ..core.abstraction import key_of, same_refusal, vllm_refusal
from ..core.lockstep import CallerBrokeContract, CallRecord, Divergence, Lockstep, short_args
from ..core.observe import Observation, Observer
from ..trace.record import RecordingLockstep
from ..trace.schema import Json
from ..trace.write import encode_args, encode_result, event_to_json, model_event_to_json, observation_to_json
from .copied import copied_key
from .messages import expand, unpack
from .settings import FIRST_LINE, TOTALS, ShadowDivergence, Unmodelled, logger
from .working import RequestLines, Sink, close_trace

NEVER = 1 << 62
"""The lockstep's own whole-pool schedule when the records say when (a checker in another process)."""


class _Id:
    """A block as a result names it: its id (what the lockstep compares)."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id


@functools.cache
def _event_class(name: str) -> type:
    return type(name, (SimpleNamespace,), {})


def _event(fields: dict[str, Any]) -> Any:
    """An event as recorded (its fields), as an object of a class named like the pool's."""
    return _event_class(str(fields.get("type")))(**{k: v for k, v in fields.items() if k != "type"})


@functools.cache
def _exception_class(names: tuple[str, ...]) -> type[Exception]:
    """An exception class named and derived as the pool's was (the refusal matchers read the names
    and ``isinstance(ValueError)``)."""
    made: type[Exception] = Exception
    for name in reversed(names):
        known = getattr(builtins, name, None)
        if isinstance(known, type) and issubclass(known, Exception):
            made = known
        elif name not in ("BaseException", "object"):
            made = type(name, (made,), {})
    return made


class _Replay:
    """Stands in for the pool inside the lockstep: the call it makes is the one the pool just made.

    When the lockstep calls the armed operation, the call's deferred effects run
    (its watcher firings and events are noted where the lockstep looks for
    them) and the pool's own outcome comes back.
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
    """The live pool, as the lockstep observes it, its pending events being those its own calls
    queued (vLLM's offload manager appends events to its CPU pool's queue; a hisparse pool shares
    its owner's queue)."""

    def __init__(self, pool: Any, own: list[Any]) -> None:
        super().__init__(pool)
        self.own = own

    @property
    def pool(self) -> Any:
        """The pool, held weakly: it goes when the engine lets go of it."""
        return self._pool()

    @pool.setter
    def pool(self, pool: Any) -> None:
        self._pool = weakref.ref(pool)

    def pending_events(self) -> list[Any] | None:
        return self.own if self.has["pending events"] else None


def observation(raw: dict[str, Any]) -> Observation:
    """The pool's :class:`Observation` from what :func:`.record.snapshot` read."""
    count = len(raw["ref"])
    tokens = raw["num_tokens"]
    secondary, index, watched = raw["secondary"], raw["index"], raw["watched"]
    return Observation(
        ref=tuple(raw["ref"]), free=tuple(raw["free"]), num_free=raw["num_free"],
        primary=tuple(None if h is None else (key_of(h), None if tokens is None else tokens[b])
                      for b, h in enumerate(raw["hashes"])),
        secondary=None if secondary is None else tuple(
            tuple(sorted(key_of(k) for k in secondary.get(b, ()))) for b in range(count)),
        index=None if index is None else tuple(sorted((key_of(k), ids) for k, ids in index)),
        watched=None if watched is None else tuple(watched))


class _Recorded(Observer):
    """A pool in another process, as its records show it: the whole pool at each whole-pool check."""

    def __init__(self, parts: dict[str, bool], num_tokens: bool, own: list[Any]) -> None:
        self.pool, self.api_only, self.has, self.num_tokens, self.own = None, False, parts, num_tokens, own
        self.current: tuple[Observation, list[str]] | None = None

    def observe(self, probes: Any = ()) -> Observation:
        if self.current is None:
            raise ValueError("the pool runs in another process and was observed only at whole-pool checks")
        return self.current[0]

    def link_errors(self) -> list[str]:
        return [] if self.current is None else list(self.current[1])

    def load(self, raw: dict[str, Any] | None) -> None:
        """The pool as observed after this call (None: not observed)."""
        self.current = None if raw is None else (observation(raw), list(raw["links"]))

    def pending_events(self) -> list[Any] | None:
        return self.own if self.has["pending events"] else None


class _ShadowLockstep(RecordingLockstep):
    """The recorder, writing each call's operation and arguments only (what came of it is the
    model's, until a call differs: that one is written whole), keeping no copy of the model per
    call, and comparing footprints only where it sees the live pool (``footprints``)."""

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.request_form, RequestLines):
            self.request_form.forget_gone()
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


class PoolCheck:
    """The model beside one pool, fed that pool's recorded calls."""

    def __init__(self, checker: Checker, number: int, config: dict[str, Any], live: Any | None) -> None:
        header = config["header"]
        self.checker, self.number, self.name = checker, number, str(config["name"])
        self.keep, self.strict = bool(config["keep"]), bool(config["strict"])
        self.directory = Path(config["directory"])
        self.active = True
        self.own: list[Any] = []
        """The events this pool's calls queued and nobody took yet, as recorded."""
        self.answered: dict[str, tuple[Any, ...]] = {}
        """Per argument-less operation, its last outcome recorded without an error or a whole-pool
        check: what a repeat of it (``same``) answered."""
        self._copied = itertools.count(1)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.part = self.directory / f".{self.name}.jsonl.part"
        self.final = self.directory / f"{self.name}.jsonl"
        self.out = open(self.part, "w", encoding="utf-8")  # noqa: SIM115 (closed when the pool goes)
        self.out.write(json.dumps(header, separators=(",", ":")) + "\n")
        self.sink = Sink(self.out)
        # the pool held weakly (it goes when the engine lets go of it); in another process, no blocks to see
        self.replay = _Replay(weakref.proxy(live) if live is not None else SimpleNamespace(blocks=[]))
        model = initial_state(header["num_blocks"], header["enable_caching"], header["hash_block_size"],
                              header["enable_kv_cache_events"], header["medium"],
                              **REFERENCES[header["reference"]])
        self.pair = _ShadowLockstep(pool=self.replay, model=model,
                                    full_every=NEVER if live is None else int(config["full_every"]),
                                    errors_match=same_refusal if config["kvpool_pool"] else vllm_refusal,
                                    keep_observations=False, sink=self.sink, local_invariants=False,
                                    request_form=RequestLines(self.sink))
        self.recorded = None if live is not None else _Recorded(config["parts"], config["num_tokens"],
                                                                self.own)
        self.pair.observer = _Observed(live, self.own) if self.recorded is None else self.recorded
        self.pair.footprints = live is not None
        TOTALS.pools += 1

    def call(self, op: str, args: tuple[Any, ...], result: Any, error: tuple[tuple[str, ...], str] | None,
             events: list[dict[str, Any]] | None, fired: list[tuple[str, int]],
             whole: dict[str, Any] | None) -> None:
        """One recorded call on the model, compared."""
        if not args and error is None and whole is None and not fired:  # what a repeat of it answers
            self.answered[op] = (args, result, error, events, fired, None)
        try:
            model_args = self._model_args(op, args)
        except Unmodelled as why:
            self.stop(f"cannot model {op}: {why}")
            return
        own, pair = self.own, self.pair

        def effects() -> None:
            for name, block in fired:
                pair.watcher(name)(_Id(block))
            if op == "take_events":
                own.clear()
            elif events is not None:
                own.extend(_event(e) for e in events)

        if result is not None:
            kind = OPERATIONS[op].result
            if kind in ("blocks", "blocks?"):
                result = [_Id(b) for b in result]
            elif kind == "events":
                result = [_event(e) for e in result]
        raised = None if error is None else _exception_class(tuple(error[0]))(error[1])
        self.replay.load(op, (result, raised), effects)
        TOTALS.calls += 1
        try:
            pair.call(op, *model_args)
            if whole is not None and self.recorded is not None:
                self.recorded.load(whole)
                pair.check()
        except Divergence as found:
            self.diverged(found)
        finally:
            if self.recorded is not None:
                self.recorded.current = None

    def _model_args(self, op: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if op == "_insert_block_hash":
            return self._insert_args(*args)
        out = list(args)
        for i, a in enumerate(OPERATIONS[op].args):
            if a.kind == "blocks":
                out[i] = expand(out[i])
            elif a.kind == "request":
                out[i] = self.checker.requests[out[i][0]]
            elif a.kind == "watcher" and isinstance(out[i], str):
                out[i] = self.pair.watcher(out[i])
        return tuple(out)

    def _insert_args(self, key_bytes: bytes, block: int, num_tokens: int | None) -> tuple[Any, ...]:
        """``_insert_block_hash(key, block, num_tokens)`` as the model's ``(request, prefix_tokens,
        group, block, num_tokens)``: the key's prefix is read from the pool it was copied from."""
        try:
            key = key_of(key_bytes)
        except Exception:
            raise Unmodelled(f"{short_args([key_bytes])} is not an index key") from None
        hbs = self.pair.model.hash_block_size
        others = sorted(self.checker.pools.values(), key=lambda c: c is self)  # this pool last
        models = [c.pair.model for c in others if c.active and c.pair.model.hash_block_size == hbs]
        prefix = next((m.names[key] for m in models if m.names.get(key) is not None), None)
        if prefix is None:
            raise Unmodelled(f"no shadowed pool knows the prefix key …{key[0][-3:].hex()}/g{key[1]} names")
        request = copied_key(key, prefix, hbs, next(self._copied))
        return request, len(prefix) * hbs, key[1], block, num_tokens

    def taken(self) -> None:
        """Events this pool queued that another pool's ``take_events`` took (a shared queue): the
        model takes them too, written in the trace as this pool's ``take_events``.

        They were compared when they were queued; the engine may have changed them since
        (vLLM's manager sets ``kv_cache_spec_kind`` on the events it takes), so the line
        carries them as the model has them.
        """
        self.own.clear()
        taken = OPERATIONS["take_events"].run(self.pair.model, ())
        self.pair.steps += 1
        self.sink({"op": "take_events", "args": {}, "result": [model_event_to_json(e) for e in taken],
                   "error": None, "events": [], "fired": []})

    # ------------------------------------------------------------ the end of a pool's check

    def diverged(self, found: Divergence) -> None:
        contract = isinstance(found, CallerBrokeContract)
        text = str(found)
        first = text.splitlines()[0] if text else type(found).__name__
        if len(first) > FIRST_LINE:
            first = first[:FIRST_LINE] + " …"
        if not contract and self.sink.held is not None:
            with contextlib.suppress(Exception):  # a pool too broken to observe: the line stays as it is
                self.sink.held["observation"] = observation_to_json(self.pair.observer.observe())
        path = self.close(keep=True)
        kind = "caller broke a contract" if contract else "diverged"
        if contract:
            TOTALS.contracts += 1
        else:
            TOTALS.divergences += 1
        self.finding(kind, first, path)
        line = (f"kvpool shadow: {self.name} {kind} at call {self.pair.steps}: {first}; its calls since it "
                f"was created: {path} (kvpool check-trace {path})")
        if self.strict:
            raise ShadowDivergence(line + "\n" + text, path) from found
        self.checker.log.warning("%s", line)

    def stop(self, why: str) -> None:
        """Stop checking this pool for a reason of the shadow's own."""
        if not self.active:
            return
        self.close(keep=self.keep)
        TOTALS.stopped += 1
        self.finding("stopped", why, None)
        self.checker.log.warning("kvpool shadow: %s is no longer checked after %d calls: %s", self.name,
                                 self.pair.steps, why)

    def finding(self, kind: str, first: str, path: Path | None) -> None:
        TOTALS.findings.append({"pool": self.name, "kind": kind, "call": self.pair.steps, "first": first,
                                "trace": None if path is None else str(path),
                                "test": self.checker.tests.get(self.number)})

    def close(self, keep: bool) -> Path | None:
        """Stop checking; the trace kept (returned) or removed."""
        if self.active:
            self.active = False
            self.checker.on_stop(self.number)
        return close_trace(self.out, self.part, self.final, keep, self.sink)


class Checker:
    """Every shadowed pool of one engine process, and the requests their calls name."""

    def __init__(self, log: logging.Logger | None = None) -> None:
        self.pools: dict[int, PoolCheck] = {}
        self.requests: dict[int, Request] = {}
        self.tests: dict[int, str | None] = {}
        self.log = log or logger
        self.on_stop: Callable[[int], None] = lambda _n: None
        """Told of each pool whose check ended (a divergence, a call it cannot model)."""

    def handle(self, message: tuple[Any, ...], live: Any | None = None) -> Any:
        """One message of :mod:`.record` (``live``: the pool, for a checker beside it)."""
        kind = message[0]
        if kind in ("call", "same", "taken", "stop"):  # for a pool still checked
            check = self.pools.get(message[1])
            if check is None or not check.active:
                return None
            if kind == "call":
                check.call(*message[2:])
            elif kind == "taken":
                check.taken()
            elif kind == "stop":
                check.stop(message[2])
            else:  # argument-less calls answered as they were last recorded
                for op in message[2]:
                    if not check.active:
                        break
                    check.call(op, *check.answered[op])
        elif kind == "req":
            self.requests[message[1]] = _request(message[2])
        elif kind == "grow":
            req = self.requests[message[1]]
            req.all_token_ids.extend(message[2])
            req.block_hashes.extend(unpack(message[3]))
        elif kind == "forget":
            self.requests.pop(message[1], None)
        elif kind == "pool":
            config = message[2]
            self.pools[message[1]] = PoolCheck(self, message[1], config, live)
            self.tests[message[1]] = config["header"]["meta"].get("test")
        elif kind == "close":
            check = self.pools.pop(message[1], None)
            if check is not None:
                return check.close(bool(message[2]))
        return None

    def close_all(self) -> None:
        """The process ends: every pool's working file closed (kept as each pool says)."""
        for number in list(self.pools):
            self.handle(("close", number, self.pools[number].keep))


def _request(fields: dict[str, Any]) -> Request:
    lora = fields["lora"]
    tokens, hashes = fields["all_token_ids"], fields["block_hashes"]
    return Request(fields["request_id"], unpack(tokens),
                   block_hashes=unpack(hashes),
                   lora_request=None if lora is None else LoRARequest(lora[0], lora[1], lora[2]),
                   mm_features=[MultiModalFeature(i, PlaceholderRange(o, n)) for i, o, n in fields["mm"]],
                   cache_salt=fields["cache_salt"], session_id=fields["session_id"])


def pid_totals() -> dict[str, Any]:
    """This process's totals, as JSON."""
    return {**TOTALS.to_json(), "cpu": time.process_time()}


__all__ = ["Checker", "PoolCheck", "pid_totals"]
