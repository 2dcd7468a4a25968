"""The engine's side of a shadow: each call of a real pool, run first, then recorded as plain data.

:class:`Shadow` sits beside one pool.  The call goes to the pool and its
result, or its exception, goes back to the caller unchanged; what the call
was and what came of it is then written down as plain values (block ids,
requests by number, events as field dicts) and handed to the hub
(:mod:`.hub`), which takes it to the checker (:mod:`.check`): in a checker
process beside the engine by default, so that the call path only records,
or on the engine's thread.  For a checker in another process the shadow also
observes the whole pool every ``full_every`` calls (the checker cannot see
the pool itself).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import operator
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from kvpool.model import OPERATIONS, REFERENCES

from ..core.abstraction import pool_event
from ..core.observe import Observer, free_queue_link_errors, free_queue_walk
from ..trace.schema import VERSION, Json
from . import hub as hubs
from .messages import Packed, RequestRef
from .settings import (
    ENV_KEEP,
    ENV_REFERENCE,
    ENV_STRICT,
    ShadowDivergence,
    Unmodelled,
    check_mode,
    flag,
    full_every_default,
    logger,
    shadow_dir,
)
from .working import Numbered

_numbers = itertools.count(1)
_LISTS = frozenset(("blocks", "block_ids", "groups", "mask?"))
"""Argument kinds an engine may pass as an iterator (read once: the pool then gets a list)."""
_EMPTY = inspect.Parameter.empty


class _Plan(NamedTuple):
    """How a pool's method takes its arguments."""

    signature: inspect.Signature
    names: tuple[str, ...]
    defaults: tuple[Any, ...]


class RequestRefs(Numbered):
    """Requests as the checker receives them: whole the first time, then what each call adds, then
    forgotten once the engine let go of them (so the checker holds only the live ones)."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__()
        self.send = send

    def __call__(self, req: Any) -> RequestRef:
        key = id(req)
        kept = self.known.get(key)
        if kept is not None and kept[0]() is req:
            ref, number, tokens, hashes = kept
            token_ids, block_hashes = req.all_token_ids, req.block_hashes
            now_tokens, now_hashes = len(token_ids), len(block_hashes)
            if now_tokens > tokens or now_hashes > hashes:  # a request only grows
                more = packed_bytes(block_hashes[hashes:]) if now_hashes > hashes else []
                self.send(("grow", number, list(token_ids[tokens:]), more))
                self.known[key] = (ref, number, now_tokens, now_hashes)
            return number, now_tokens, now_hashes
        if getattr(req, "prompt_embeds", None) is not None:
            raise Unmodelled("a request with prompt embeddings (a trace cannot carry them)")
        number = next(self.numbers)
        lora = req.lora_request
        token_ids, block_hashes = req.all_token_ids, req.block_hashes
        fields = {"request_id": str(req.request_id), "all_token_ids": token_list(token_ids),
                  "block_hashes": packed_bytes(block_hashes),
                  "lora": None if lora is None else (lora.lora_name, lora.lora_int_id, lora.lora_path),
                  "mm": [(f.identifier, f.mm_position.offset, f.mm_position.length)
                         for f in req.mm_features or ()],
                  "cache_salt": req.cache_salt, "session_id": getattr(req, "session_id", None)}
        self.send(("req", number, fields))
        tokens, hashes = len(token_ids), len(block_hashes)
        try:
            ref = weakref.ref(req, lambda _r: self._died(key, number))
        except TypeError:  # cannot be referred to weakly: sent whole each time, forgotten at once
            self.gone.append(number)
        else:
            self.known[key] = (ref, number, tokens, hashes)
        return number, tokens, hashes

    def forget_gone(self) -> None:
        """Tell the checker of the requests gone since the last call (never from inside a callback)."""
        while self.gone:
            self.send(("forget", self.gone.pop()))


def token_list(values: Any) -> list[int]:
    """Token ids as a list: pickled as it is (a list of ints pickles three times as fast as an
    array is made of it), vLLM's read-only view copied at C speed."""
    return values if type(values) is list else list(values)


def packed_bytes(values: Any) -> Packed | list[bytes]:
    """Hashes of one length as one block of bytes, or a list."""
    hashes = values if type(values) is list else list(values)
    try:
        sizes = set(map(len, hashes))
        if len(sizes) == 1:
            return f"{sizes.pop()}s", b"".join(hashes)
    except TypeError:
        pass
    return [bytes(h) for h in hashes]


def plain_error(error: BaseException | None) -> tuple[tuple[str, ...], str] | None:
    """An exception as the checker receives it: its classes' names (most derived first), its message."""
    if error is None:
        return None
    return tuple(c.__name__ for c in type(error).__mro__), str(error)


def plain_result(op: str, result: Any) -> Any:
    """A pool's result in plain values: blocks as ids, events as field dicts."""
    kind = OPERATIONS[op].result
    if result is None:
        return None
    if kind in ("blocks", "blocks?"):
        return [getattr(b, "block_id", b) for b in result]
    if kind == "events":
        return [pool_event(e) for e in result]
    if kind == "key?":
        return bytes(result)
    return result


class Shadow:
    """The engine's side of the model beside one pool (see the module docstring)."""

    def __init__(self, pool: Any, *, name: str | None = None, reference: str | None = None,
                 directory: Path | None = None, strict: bool | None = None, keep: bool | None = None,
                 full_every: int | None = None, log: logging.Logger | None = None) -> None:
        self.pool = pool
        self.number = next(_numbers)
        self.name = name or f"{type(pool).__name__}-{os.getpid()}-{self.number}"
        self.strict = flag(ENV_STRICT) if strict is None else strict
        self.keep = flag(ENV_KEEP) if keep is None else keep
        self.log = log or logger
        self.directory = directory or shadow_dir()
        self.reference = reference or os.environ.get(ENV_REFERENCE) or "0.31"
        if self.reference not in REFERENCES:
            raise ValueError(f"{ENV_REFERENCE}={self.reference!r}: expected one of {sorted(REFERENCES)}")
        self.active = False
        self.depth = 0
        """Calls of this pool in progress: a pool's calls to itself are its own business."""
        self.calls = 0
        self.own: list[Any] = []
        """The events this pool's calls queued and nobody took yet."""
        self._queue: Any = getattr(pool, "kv_event_queue", None)
        self._plans: dict[str, _Plan] = {}
        """Per operation: the pool's method's parameters and their defaults (as the first call found)."""
        self._kinds = {op: tuple(a.kind for a in decl.args) for op, decl in OPERATIONS.items()}
        """Per operation: the kinds of the model's arguments."""
        self._queued = isinstance(getattr(pool, "kv_event_queue", None), list)
        """Whether the pool shows its pending events (a list, read before and after each call)."""
        self._results = {op: decl.result in ("blocks", "blocks?", "events", "key?")
                         for op, decl in OPERATIONS.items()}
        """Per operation: whether its result needs translating (blocks, events, a key)."""
        self._fired: list[tuple[str, int]] = []
        self._answered: dict[str, tuple[Any, Any]] = {}
        """Per argument-less operation: its result and events as last recorded without an error or a
        whole-pool check (what the checker keeps too: :attr:`.check.PoolCheck.answered`)."""
        self.repeats = Tally()
        """Calls answered as :attr:`_answered` says, named to the checker with the next message."""
        self._blocks: list[Any] = pool.blocks
        num_blocks = len(self._blocks)
        self.observer = Observer(pool)
        self.full_every = full_every if full_every is not None else full_every_default(num_blocks)
        mode = check_mode(self.strict)
        if mode == "process" and not (self.observer.has["free-queue links"] and not self.observer.black_box):
            mode = "inline"  # the checker observes such a pool itself (probes, calls): it must see it
        self.hub = hubs.hub(mode)
        self.whole = self.hub.remote
        """Whether this side observes the whole pool for the checker (a checker in another process)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        header: dict[str, Json] = {
            "kvpool_trace": VERSION, "num_blocks": num_blocks, "enable_caching": bool(pool.enable_caching),
            "hash_block_size": int(pool.hash_block_size),
            "enable_kv_cache_events": bool(getattr(pool, "enable_kv_cache_events", False)),
            "medium": str(getattr(pool, "medium", "GPU")), "reference": self.reference,
            "meta": {"shadow": self.name, "pool": f"{type(pool).__module__}:{type(pool).__qualname__}",
                     "pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST")}}
        kvpool_pool = _is_kvpool_pool(pool)
        if not kvpool_pool:
            header["vllm_errors"] = True  # check-trace reads it: refusals matched as recorded
        config = {"header": header, "name": self.name, "directory": str(self.directory), "keep": self.keep,
                  "strict": self.strict, "full_every": self.full_every, "kvpool_pool": kvpool_pool,
                  "parts": dict(self.observer.has), "num_tokens": self.observer.num_tokens}
        self.hub.add(self, config)
        self.active = True
        weakref.finalize(pool, _closed, self.hub, self.number, self.keep, self.repeats)

    # ------------------------------------------------------------ one call

    def call(self, op: str, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``real(*args, **kwargs)`` (the pool's ``op``), then record the call for the checker."""
        if not self.active or self.depth:
            return real(*args, **kwargs)
        if args or kwargs or self._kinds.get(op) != ():  # else a call without arguments: nothing to say
            try:
                args, kwargs, model_args = self._translate(op, real, args, kwargs)
            except Unmodelled as why:
                self.stop(f"cannot model {op}: {why}")
                return real(*args, **kwargs)
            except Exception as exc:  # the shadow's own failure: never the engine's
                self.failed(exc)
                return real(*args, **kwargs)
        else:
            model_args = ()
        queue = self.pool.kv_event_queue if self._queued else None
        queued = len(queue) if type(queue) is list else 0
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
            self._record(op, model_args, result, error, queue, queued)
        except ShadowDivergence:
            raise
        except Exception as exc:
            self.failed(exc)
        finally:
            self.depth -= 1
        if error is not None:
            raise error
        return result

    def query(self, op: str, real: Callable[..., Any], pool: Any, args: tuple[Any, ...] = ()) -> Any:
        """A query (``get_num_free_blocks``, ``get_usage``, ``get_cached_block(hash, groups)``: most
        of an engine's calls), recorded at the least cost: a query changes nothing, so unless it
        raised or the queue of events moved, only its result is written down."""
        if not self.active or self.depth or (self.whole and (self.calls + 1) % self.full_every == 0):
            return self.call(op, real.__get__(pool), args, {})
        queue = pool.kv_event_queue if self._queued else None
        queued = len(queue) if queue is not None else 0
        self.depth += 1
        try:
            result = real(pool, *args)
        except Exception:
            self.depth -= 1
            return self.call(op, real.__get__(pool), args, {})  # its refusal, recorded as any call's
        self.depth -= 1
        moved = queue is not None and (queue is not self._queue or pool.kv_event_queue is not queue
                                       or len(queue) != queued)
        model_args = (bytes(args[0]), list(args[1])) if args else ()
        if moved:
            self._fired = []
            self.depth += 1
            try:
                self._record(op, model_args, result, None, queue, queued)
            finally:
                self.depth -= 1
            return result
        self.calls += 1
        self._send(op, model_args, plain_result(op, result) if args else result, None,
                   [] if self._queued else None, [], None)
        return result

    def _events_list(self) -> list[Any] | None:
        queue = getattr(self.pool, "kv_event_queue", None)
        return queue if isinstance(queue, list) else None

    def _record(self, op: str, model_args: tuple[Any, ...], result: Any, error: BaseException | None,
                queue: list[Any] | None, queued: int) -> None:
        if queue is not self._queue:  # the repeats before it first: the checker keeps the order
            if self.repeats.ops:
                self.repeats.tell(self.hub, self.number)
            self._taken_elsewhere(queue)
        after = self._events_list() if self._queued else None
        events: list[dict[str, Any]] | None = None
        if op == "take_events":
            if error is None and isinstance(result, list) and queue is not None:
                mine = {id(e) for e in self.own}
                result = [e for e in result if id(e) in mine]
            self.own.clear()
            events = None if after is None else []
        elif after is not None:
            if after is not queue or len(after) != queued:
                new = after[queued:] if after is queue else after
                self.own.extend(new)
                events = [pool_event(e) for e in new]
            else:
                events = []
        self._queue = after
        self.calls += 1
        whole = None
        if self.whole and self.calls % self.full_every == 0:
            whole = snapshot(self.observer)
        if result is not None and self._results[op]:
            result = plain_result(op, result)
        self._send(op, model_args, result, None if error is None else plain_error(error), events,
                   self._fired, whole)

    def _send(self, op: str, model_args: tuple[Any, ...], result: Any,
              error: tuple[tuple[str, ...], str] | None, events: list[dict[str, Any]] | None,
              fired: list[tuple[str, int]], whole: dict[str, Any] | None) -> None:
        """One call to the checker.  An argument-less call whose outcome is the one last recorded for
        it goes to a checker process by name only (most of an engine's calls: the number of free
        blocks asked several times a step, the events taken each step); the checker puts it to the
        model with that outcome (:meth:`.check.Checker.handle`).  Not for a checker on this thread:
        it reads the live pool, which the next call changes before the checker is told."""
        if not model_args and error is None and whole is None and not fired and self.whole:
            outcome = (result, events)
            if self._answered.get(op) == outcome:
                self.repeats.ops.append(op)
                return
            self._answered[op] = outcome
        if self.repeats.ops:  # first: the checker puts them to the model before anything since
            self.repeats.tell(self.hub, self.number)
        self.hub.send(("call", self.number, op, model_args, result, error, events, fired, whole))

    def _taken_elsewhere(self, queue: list[Any] | None) -> None:
        """Events this pool queued that another pool's ``take_events`` took (a shared queue): the
        checker's model takes them too (:meth:`.check.PoolCheck.taken`)."""
        if not self.own or queue is None or queue is self._queue:
            return
        self._queue = queue
        left = {id(e) for e in queue}
        if any(id(e) in left for e in self.own):
            return
        self.own.clear()
        self.hub.send(("taken", self.number))

    # ------------------------------------------------------------ what the model receives

    def _plan(self, op: str, real: Callable[..., Any]) -> _Plan:
        plan = self._plans.get(op)
        if plan is None:
            try:
                sig = inspect.signature(real)
            except (TypeError, ValueError):
                raise Unmodelled(f"the pool's {op} has no signature to read") from None
            varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            if any(p.kind in varying for p in sig.parameters.values()):
                raise Unmodelled(f"the pool's {op} takes arbitrary arguments")
            plan = self._plans[op] = _Plan(sig, tuple(sig.parameters), tuple(
                p.default for p in sig.parameters.values()))
        return plan

    def _translate(self, op: str, real: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...]]:
        """The call as the pool receives it (iterators made lists, watchers that also note their
        firing) and as the checker receives it (plain values: block ids, requests by number)."""
        plan = self._plan(op, real)
        names, given = plan.names, len(args)
        if given == len(names) and not kwargs:  # the common call: every argument by position
            values = list(args)
        elif given <= len(names) and all(k in names[given:] for k in kwargs):
            values = list(args) + [kwargs.get(n, d) for n, d in zip(names[given:], plan.defaults[given:],
                                                                     strict=True)]
            if any(v is _EMPTY for v in values):
                self._bind(op, plan, args, kwargs)  # a required argument missing: said by the binding
        else:
            values = self._bind(op, plan, args, kwargs)
        if op == "_insert_block_hash":  # the key's prefix is looked up by the checker
            return args, kwargs, (bytes(values[0]), self._id(values[1]),
                                  values[2] if len(values) > 2 else None)
        kinds = self._kinds[op]
        if len(values) < len(kinds):
            raise Unmodelled(f"the pool's {op} takes fewer arguments than the model's")
        requests = self.hub.requests
        if requests.gone:
            requests.forget_gone()
        model: list[Any] = []
        changed = False
        for i, kind in enumerate(kinds):
            v = values[i]
            if kind in _LISTS and v is not None and type(v) is not list and isinstance(v, Iterator):
                v = values[i] = list(v)  # an iterator is read once: the pool gets it as a list
                changed = True
            if kind == "blocks":
                read = _read(op, values)
                if read is None:
                    model.append(self._ids(v if type(v) is list else list(v), op == "free_blocks"))
                else:  # only the blocks the pool caches: a long prompt's list is not sent each call
                    model.append((read.start, self._ids(list(v[read])), len(v)))
            elif kind == "block":
                model.append(self._id(v))
            elif kind == "request":
                model.append(requests(v))
            elif kind in ("block_ids", "groups"):
                model.append(list(v))
            elif kind == "hash":
                model.append(bytes(v))
            elif kind == "watcher":
                model.append(self._watcher(v, values, i))
                changed = changed or callable(v)
            elif kind == "mask?":
                model.append(None if v is None else list(v))
            else:
                model.append(v)
        if changed:  # the pool gets the lists read from iterators, the watchers that note their firing
            args, kwargs = _rebuilt(list(names), values, args, kwargs)
        return args, kwargs, tuple(model)

    def _bind(self, op: str, plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        try:
            bound = plan.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise Unmodelled(f"{op} called as its signature does not allow: {exc}") from None
        bound.apply_defaults()
        return list(bound.arguments.values())

    def _id(self, block: Any) -> int:
        """A block's id in this pool; the first id past the pool for a block not of it."""
        blocks = self._blocks
        i = getattr(block, "block_id", None)
        if isinstance(i, int) and 0 <= i < len(blocks) and blocks[i] is block:
            return i
        return len(blocks)

    def _ids(self, listed: list[Any], freed: bool = False) -> list[int]:
        """Blocks' ids: at C speed when every block is one of this pool's (the engine's case).  Blocks
        of another pool that are ``freed`` are handed to it (a call of that pool's own): left out."""
        try:
            ids = [b.block_id for b in listed]
            if (not ids or min(ids) >= 0) and all(map(operator.is_, map(self._blocks.__getitem__, ids),
                                                       listed)):
                return ids
        except (AttributeError, IndexError, TypeError):
            pass
        if freed:
            listed = [b for b in listed if not self._handed_on(b)]
        return [self._id(b) for b in listed]

    def _handed_on(self, block: Any) -> bool:
        owner = getattr(block, "pool", None)
        return owner is not None and owner is not self.pool and self._id(block) == len(self._blocks)

    def _watcher(self, on_reuse: Any, values: list[Any], i: int) -> Any:
        """A watcher's name for the model; the pool gets a callable that notes each firing and calls
        ``on_reuse`` (whose result or exception is the pool's to see)."""
        if not callable(on_reuse):
            return on_reuse
        name = f"w{self.calls + 1}"
        fired = self

        def told(block: Any) -> Any:
            fired._fired.append((name, getattr(block, "block_id", -1)))
            return on_reuse(block)

        values[i] = told
        return name

    # ------------------------------------------------------------ the end of a shadow

    def stop(self, why: str) -> None:
        """Stop shadowing this pool for a reason of the shadow's own (said in one line)."""
        self.active = False
        self.repeats.tell(self.hub, self.number)
        self.hub.send(("stop", self.number, why))
        self.log.warning("kvpool shadow: %s is no longer shadowed after %d calls: %s", self.name,
                         self.calls, why)

    def failed(self, exc: Exception) -> None:
        if self.strict:
            raise exc
        self.stop(f"the shadow failed: {exc!r}")

    def finish(self, keep: bool) -> Path | None:
        """Stop shadowing; the trace kept (returned, once the checker wrote it) or removed."""
        self.active = False
        self.repeats.tell(self.hub, self.number)
        return self.hub.close(self.number, keep)

    @property
    def pair(self) -> Any:
        """The lockstep of the model and this pool, where the checker runs in this thread (else None)."""
        return self.hub.pair(self.number)


class Tally:
    """Argument-less calls a shadow saw answered as last recorded, not told to the checker yet."""

    __slots__ = ("ops", "told")

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.told = 0

    def tell(self, hub: hubs.Hub, number: int) -> None:
        """Tell the checker (before the shadow's next message, so that the calls stay in order)."""
        if self.ops:
            hub.send(("same", number, self.ops))
            self.told += len(self.ops)
            self.ops = []


def _closed(hub: hubs.Hub, number: int, keep: bool, repeats: Tally) -> None:
    """The pool is gone: its last repeats counted, its check closed."""
    repeats.tell(hub, number)
    hub.close(number, keep)


def _read(op: str, values: list[Any]) -> slice | None:
    """The blocks of a list argument the pool reads: ``cache_full_blocks`` only those it caches."""
    if op == "cache_full_blocks" and type(values[2]) is int and type(values[3]) is int and values[2] >= 0:
        return slice(values[2], max(values[2], values[3]))
    return None


def snapshot(observer: Observer) -> dict[str, Any]:
    """The whole pool's raw values, read at the least cost to the engine's thread (the checker turns
    them into an :class:`~kvpool.oracle.core.observe.Observation`: :func:`.check.observation`)."""
    pool, has = observer.pool, observer.has
    blocks = pool.blocks
    queue = pool.free_block_queue
    limit = len(blocks) + 2
    walk = free_queue_walk(queue, limit)  # walked once: the free list and its links' check
    free = walk[0]
    index = None
    if has["index multimap"]:
        index = [(k, tuple(v) if isinstance(v, dict) else (v.block_id,))
                 for k, v in pool.cached_block_hash_to_block._cache.items()]
    return {
        "ref": [b.ref_cnt for b in blocks], "free": free, "num_free": queue.num_free_blocks,
        "hashes": [b.block_hash for b in blocks],
        "num_tokens": [b.block_hash_num_tokens for b in blocks] if observer.num_tokens else None,
        "secondary": ({b: list(keys) for b, keys in pool.cached_block_hashes_by_block.items()}
                      if has["secondary keys"] else None),
        "index": index,
        "watched": list(pool._reuse_watchers) if has["registered watchers"] else None,
        "links": free_queue_link_errors(queue, limit, walk) if has["free-queue links"] else [],
    }


def _is_kvpool_pool(pool: Any) -> bool:
    # lazy: kvpool's own pool, only as the default target (the oracle never needs impl)
    from kvpool.impl import BlockPool

    return isinstance(pool, BlockPool)


def _rebuilt(names: list[str], values: list[Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments as the caller passed them (positional or by name), with new values."""
    return tuple(values[:len(args)]), {name: values[names.index(name)] for name in kwargs}


__all__ = ["RequestRefs", "Shadow", "plain_error", "plain_result", "snapshot"]
