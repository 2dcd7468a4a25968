"""A pool in another process, seen through the reference API: what the lockstep drives.

:class:`DrivenPool` has vLLM 0.31's ``BlockPool`` operations; each sends one
call line of the drive protocol and turns the answer back into the
reference's values: blocks are :class:`DrivenBlock` proxies (by id), a
refusal is an exception of the class the answer names, events are objects of
classes named like vLLM's (a field the process left out compares equal to
anything, as ``check-trace`` leaves it uncompared), and the watchers the
answer says fired are called with their blocks.

What the lockstep observes depends on the process.  When its answers carry
an observation, the proxies show ``ref_cnt``/``block_hash``, and the free
queue, index, secondary keys and watchers it wrote are mirrored under vLLM's
attribute names, so :class:`~kvpool.oracle.core.observe.Observer` reads them as
it reads a Python pool.  When they do not, the pool is seen only through
calls (the observer's ``api-only`` level): :meth:`DrivenPool.observe_calls`
sends the free count, every block's ``is_block_writable`` and the probed
lookups in one go.

Every call answered is kept as a trace line (:attr:`Session.log`), so a
failure can be written as a trace that ``kvpool check-trace`` replays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import OPERATIONS, Operation

from ..core.abstraction import EVENT_FIELDS, key_of, published
from ..trace.read import Header, TraceStep
from ..trace.schema import Json
from ..trace.write import request_to_json
from . import protocol
from .process import PoolProcess, ProcessFailure, ProcessHung

SHORT_ANSWER = 120
"""Answers up to this many bytes (without an observation) are read once per operation."""
KNOWN_ANSWERS = 4096
FAILED_CALL_ERRORS = {"crash": "ProcessCrashed", "hang": "ProcessHung"}
"""The error name a trace line records for a call the process failed; ``ProtocolViolation`` else."""


Call = tuple[str, dict[str, Json]]
"""A call as sent: its operation and its arguments in the trace's form."""


class DrivenRefusal(Exception):
    """Base of the exceptions a driven pool raises: each subclass is named as the process named
    its error (``NotEnoughFreeBlocksError``, ...), which is how refusals are matched."""


_REFUSALS: dict[str, type[DrivenRefusal]] = {}


def refusal_class(name: str) -> type[DrivenRefusal]:
    """The exception class named ``name`` (one per name)."""
    cls = _REFUSALS.get(name)
    if cls is None:
        cls = _REFUSALS[name] = type(name, (DrivenRefusal,), {"__module__": __name__})
    return cls


class _NotShown:
    """A field the process left out of an event: equal to anything, as check-trace skips it."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<not shown>"


NOT_SHOWN = _NotShown()


class DrivenEvent:
    """An event as the process wrote it, with vLLM's field names (see :func:`event_of`)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


_EVENT_CLASSES: dict[str, type[DrivenEvent]] = {
    name: type(name, (DrivenEvent,), {"__module__": __name__}) for name in EVENT_FIELDS}


def _hash(h: Json) -> Any:
    """An event hash as the model publishes it: hex bytes become their published form."""
    return published(bytes.fromhex(h)) if isinstance(h, str) else h


def event_of(e: dict[str, Json]) -> DrivenEvent:
    """A trace event object (already checked by the trace reader) as an event object."""
    kind = str(e["type"])
    fields: dict[str, Any] = {}
    for name in EVENT_FIELDS[kind]:
        value = e.get(name, NOT_SHOWN)
        if name == "block_hashes" and isinstance(value, list):
            value = [_hash(h) for h in value]
        elif name == "parent_block_hash" and value is not None and value is not NOT_SHOWN:
            value = _hash(value)
        fields[name] = value
    return _EVENT_CLASSES[kind](fields)


class DrivenBlock:
    """A block of a driven pool, by id; ``ref_cnt``/``block_hash`` exist only when observed."""

    __slots__ = ("__weakref__", "block_hash", "block_hash_num_tokens", "block_id", "owner", "ref_cnt")

    block_hash: bytes | None
    block_hash_num_tokens: int | None
    ref_cnt: int

    def __init__(self, block_id: int, owner: DrivenPool | None = None) -> None:
        self.block_id = block_id
        self.owner = owner

    def __repr__(self) -> str:
        return f"DrivenBlock({self.block_id})"


class FreeQueueMirror:
    """The free queue the process last wrote, as ``free_block_queue``."""

    def __init__(self) -> None:
        self.blocks: list[DrivenBlock] = []
        self.num_free_blocks = 0

    def get_all_free_blocks(self) -> list[DrivenBlock]:
        return list(self.blocks)


@dataclass
class IndexMirror:
    """The index the process last wrote, as ``cached_block_hash_to_block``."""

    _cache: dict[bytes, dict[int, DrivenBlock]] = field(default_factory=dict)


@dataclass
class Session:
    """One pool's life in one process: its header, the calls answered, and what failed."""

    process: PoolProcess
    pool: dict[str, Json]
    header: Header
    shape: frozenset[str] | None
    """The observation fields every answer carries (None: none)."""
    fresh: dict[str, Json] | None
    log: list[dict[str, Json]] = field(default_factory=list)
    unsupported: frozenset[str] = frozenset()
    """The optional operations the process said its pool lacks."""
    failed: dict[str, Json] | None = None
    """The call the process failed at, as a trace line (error ``ProcessCrashed``, ...)."""
    current: bool = True
    answers: dict[tuple[str, bytes], tuple[Json, str | None, list[dict[str, Json]], Json]] = field(
        default_factory=dict, repr=False)
    """Short answers already read, by operation: most answers are one of a few lines."""

    def open(self, again: bool = False) -> None:
        """Send the header and read its answer: a new pool, or (``again``) this one from scratch,
        which must be answered as the first time."""
        proc = self.process
        proc.start()
        (raw,) = proc.exchange([protocol.encode(protocol.header(self.pool))], lambda _i: "the header")
        try:
            answer = protocol.read_header_answer(protocol.decode(raw), self.header)
        except protocol.ProtocolError as exc:
            raise proc.fail(exc.kind, exc.what, "the header") from None
        proc.check_unasked("the header")
        if again and (answer.observation, answer.fresh, answer.unsupported) != (
                self.shape, self.fresh, self.unsupported):
            raise proc.fail("nondeterministic", "answered the same header differently", "the header")
        self.shape, self.fresh, self.unsupported = answer.observation, answer.fresh, answer.unsupported

    def calls(self, calls: Sequence[tuple[str, dict[str, Json]]],
              encoded: Sequence[bytes] | None = None) -> list[TraceStep]:
        """Send ``calls`` at once (``encoded``: their lines, if made already); each answer
        checked, logged and returned in order."""
        if not self.current:
            raise RuntimeError("this pool was replaced by a newer one in its process")
        first = len(self.log) + 1
        name: Callable[[int], str] = lambda i: f"call {first + i} ({calls[min(i, len(calls) - 1)][0]})"  # noqa: E731
        proc = self.process
        if encoded is None:
            encoded = [protocol.encode({"op": op, "args": args}) for op, args in calls]
        try:
            raws = proc.exchange(encoded, name)
        except (ProcessFailure, ProcessHung) as exc:  # the trace records the call it failed at
            done = exc.answered
            self._read(calls[:len(done)], done, first, name)
            self._failed(calls, len(done), exc.verdict.kind)
            raise
        steps = self._read(calls, raws, first, name)
        proc.check_unasked(name(len(calls) - 1))
        return steps

    def _read(self, calls: Sequence[tuple[str, dict[str, Json]]], raws: Sequence[bytes], first: int,
              name: Callable[[int], str]) -> list[TraceStep]:
        proc = self.process
        out = []
        known = self.answers
        for i, (raw, (op, args)) in enumerate(zip(raws, calls, strict=True)):
            seen = known.get((op, raw))
            if seen is not None:  # the same short answer to the same operation: read once
                result, error, events, fired = seen
                line = {"op": op, "args": args, "result": result, "error": error, "events": events,
                        "fired": fired}
                step = TraceStep(first + i + 1, op, args, result, error, events, fired, None)
            else:
                try:
                    step, line = protocol.read_answer(op, args, protocol.decode(raw), self.header,
                                                      first + i + 1, self.shape)
                except protocol.ProtocolError as exc:
                    self._failed(calls, i, exc.kind)
                    raise proc.fail(exc.kind, exc.what, name(i)) from None
                if step.observation is None and len(raw) <= SHORT_ANSWER:
                    if len(known) >= KNOWN_ANSWERS:
                        known.clear()
                    known[op, raw] = (step.result, step.error, step.events, step.fired)
            self.log.append(line)
            out.append(step)
        return out

    def _failed(self, calls: Sequence[tuple[str, dict[str, Json]]], i: int, kind: str) -> None:
        if 0 <= i < len(calls):
            op, args = calls[i]
            self.failed = {"op": op, "args": args, "result": None,
                           "error": FAILED_CALL_ERRORS.get(kind, "ProtocolViolation"), "events": []}

    def replay(self, keep: int) -> None:
        """Make the process's pool the one after the first ``keep`` logged calls, by replaying them.

        For undoing a call (see :meth:`DrivenPool.free_blocks`); a process that
        answers the same calls differently is a verdict.
        """
        kept = self.log[:keep]
        self.log = []
        self.open(again=True)
        calls = [(str(line["op"]), dict(line["args"])) for line in kept]
        if calls:
            self.calls(calls)
        for i, (old, new) in enumerate(zip(kept, self.log, strict=True)):
            if old != new:
                raise self.process.fail("nondeterministic", "answered a replay of the same calls "
                                        "differently", f"call {i + 1} ({old['op']})")


class DrivenPool:
    """The reference API over a :class:`Session`; see the module docstring."""

    def __init__(self, session: Session) -> None:
        self.session = session
        header = session.header
        self.num_blocks = header.num_blocks
        self.enable_caching = header.enable_caching
        self.hash_block_size = header.hash_block_size
        self.enable_kv_cache_events = header.enable_kv_cache_events
        self.medium = header.medium
        self.blocks = [DrivenBlock(i, self) for i in range(self.num_blocks)]
        self.kv_event_queue: list[DrivenEvent] = []
        self.watchers: dict[str, Callable[[Any], Any]] = {}
        self.requests: dict[bytes, tuple[dict[str, Json], int]] = {}
        """Every request hash sent, with the request (as last sent) and its chunk index: how
        ``_insert_block_hash``'s key is sent as the request and prefix that name it."""
        shape = session.shape or frozenset()
        self.free_block_queue: FreeQueueMirror | None = FreeQueueMirror() if session.shape else None
        self.cached_block_hash_to_block = IndexMirror() if "index" in shape else None
        self.cached_block_hashes_by_block: dict[int, list[bytes]] | None = (
            {} if "secondary" in shape else None)
        self._reuse_watchers: dict[int, str] | None = {} if "watched" in shape else None
        self._fixed: tuple[list[Call], list[bytes]] | None = None
        self._probed: tuple[tuple[bytes, int], ...] = ()
        """The keys the last observation probed: asked again with the next call."""
        self._prefetched: tuple[tuple[tuple[bytes, int], ...], list[TraceStep]] | None = None
        if session.fresh is not None:
            self._mirror(session.fresh)
        for op in session.unsupported:  # not callable: the workloads leave it out
            setattr(self, op, None)

    # ------------------------------------------------------------ plumbing

    @property
    def current(self) -> bool:
        return self.session.current

    def _id(self, block: Any) -> Any:
        """A block argument as the id sent: another pool's block is an id this pool lacks."""
        if isinstance(block, DrivenBlock):
            return block.block_id if block.owner is self or block.owner is None else self.num_blocks
        return getattr(block, "block_id", -1)

    def _request(self, request: Any) -> dict[str, Json]:
        sent = request_to_json(request)
        for i, h in enumerate(getattr(request, "block_hashes", ())):
            self.requests[bytes(h)] = (sent, i)
        return sent

    def _step(self, op: str, args: dict[str, Json]) -> TraceStep:
        """One call, its answer applied (events, watchers, observation), not yet raised."""
        self._prefetched = None
        (step,) = self.session.calls([(op, args)])
        self._apply(step)
        return step

    def _call(self, op: str, args: dict[str, Json]) -> Any:
        """One call; for a pool seen only through calls, the observation's queries go with it.

        The lockstep observes the pool right after each call: the free count,
        every block's writability and the keys it probed last time are asked
        in the same exchange (queries change nothing), so that
        :meth:`observe_calls` usually needs no exchange of its own.
        """
        if self.session.shape is not None:
            step = self._step(op, args)
        else:
            calls, lines = self._observation_calls(self._probed)
            steps = self.session.calls([(op, args), *calls],
                                       [protocol.encode({"op": op, "args": args}), *lines])
            for done in steps:
                self._apply(done)
            step, self._prefetched = steps[0], (self._probed, steps[1:])
        self._raise(step)
        return self._result(op, step.result)

    @staticmethod
    def _raise(step: TraceStep) -> None:
        if step.error is not None:
            raise refusal_class(step.error)(f"the pool process refused {step.op}: {step.error}")

    def _apply(self, step: TraceStep) -> None:
        if step.op == "take_events":
            self.kv_event_queue.clear()
        self.kv_event_queue += [event_of(e) for e in step.events]
        for name, block_id in step.fired or ():
            watcher = self.watchers.get(str(name))
            if watcher is None or not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):
                raise self.session.process.fail(
                    "garbage", f"fired: [{name!r}, {block_id!r}] names no watcher given to "
                    "unpin_blocks or no block of the pool", f"call {len(self.session.log)} ({step.op})")
            watcher(self.blocks[block_id])
        if step.observation is not None:
            self._mirror(step.observation)

    def _mirror(self, obs: dict[str, Json]) -> None:
        """Show the process's observation under vLLM's names (trace fields, already checked)."""
        blocks = self.blocks
        for block, ref, primary in zip(blocks, obs["ref"], obs["primary"], strict=True):
            block.ref_cnt = ref
            block.block_hash = None if primary is None else bytes.fromhex(primary[0])
            block.block_hash_num_tokens = None if primary is None else primary[1]
        queue = self.free_block_queue
        if queue is not None:
            queue.blocks = [blocks[b] if 0 <= b < len(blocks) else DrivenBlock(b)
                            for b in obs["free"]]
            queue.num_free_blocks = obs["num_free"]
        if self.cached_block_hash_to_block is not None:
            self.cached_block_hash_to_block._cache = {
                bytes.fromhex(k): {b: DrivenBlock(b) for b in ids} for k, ids in obs["index"]}
        if self.cached_block_hashes_by_block is not None:
            self.cached_block_hashes_by_block = {
                b: [bytes.fromhex(k) for k in keys] for b, keys in enumerate(obs["secondary"]) if keys}
        if self._reuse_watchers is not None:
            self._reuse_watchers = {b: "" for b in obs["watched"]}

    def _result(self, op: str, result: Json) -> Any:
        """An answer's result as the reference returns it, by the operation's declared result kind."""
        kind = OPERATIONS[op].result
        if result is None:
            return None
        if kind in ("blocks", "blocks?"):
            return [self._block(b) for b in result]
        if kind == "events":
            return [event_of(e) for e in result]
        if kind == "key?":
            return bytes.fromhex(str(result))
        return result

    def _encode(self, decl: Operation, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Json]:
        """A call's arguments in the protocol's form, by their declared kinds: blocks as this pool's
        ids, requests as sent (and remembered), hashes as hex; an optional argument left at its
        default is left out, as a trace leaves it."""
        out: dict[str, Json] = {}
        for arg, value in zip(decl.args, decl.bind(args, kwargs), strict=True):
            if arg.kind == "flag":  # a flag is read by its truth, as the reference reads it
                if value:
                    out[arg.name] = True
            elif not (arg.optional and value is arg.default):
                out[arg.name] = self._encode_arg(arg.kind, value)
        return out

    def _encode_arg(self, kind: str, value: Any) -> Json:
        if kind == "block":
            return self._id(value)
        if kind == "blocks":
            return [self._id(b) for b in value]
        if kind == "request":
            return self._request(value)
        if kind == "hash":
            return bytes(value).hex()
        if kind in ("block_ids", "groups", "mask?"):
            return list(value)
        return value

    def _block(self, block_id: int) -> DrivenBlock:
        return self.blocks[block_id] if 0 <= block_id < self.num_blocks else DrivenBlock(block_id)

    # ------------------------------------------------------ the reference API

    # Every other operation is derived from its declaration: see _declared below the class.

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Free the listed blocks; another driven pool's blocks are freed by its own process.

        As one call: this pool's share first (its refusal wins, as the
        model checks its own blocks first), then each other pool's.  When
        another pool refuses its share, the shares already freed are undone
        by replaying their pools' calls without them
        (:meth:`Session.replay`): neither pool changed, as the model says.
        """
        own: list[Any] = []
        theirs: dict[DrivenPool, list[int]] = {}
        for block in ordered_blocks:
            owner = getattr(block, "owner", None)
            if isinstance(owner, DrivenPool) and owner is not self and owner.current:
                theirs.setdefault(owner, []).append(block.block_id)
            else:
                own.append(self._id(block))
        if not theirs:
            self._call("free_blocks", {"block_ids": own})
            return
        done: list[DrivenPool] = []
        if own:
            self._raise(self._step("free_blocks", {"block_ids": own}))
            done.append(self)
        for pool, ids in theirs.items():
            step = pool._step("free_blocks", {"block_ids": ids})
            if step.error is not None:  # its refused call changed nothing and stays in its log
                for freed in done:
                    freed.undo_last()
                self._raise(step)
            done.append(pool)

    def undo_last(self) -> None:
        """Undo the last logged call (replaying the others); the mirror follows."""
        self._prefetched = None
        session = self.session
        session.replay(len(session.log) - 1)
        self.kv_event_queue.clear()
        for line in session.log:
            if line["op"] == "take_events":
                self.kv_event_queue.clear()
            self.kv_event_queue += [event_of(e) for e in line.get("events") or ()]
        last = session.log[-1].get("observation") if session.log else session.fresh
        if isinstance(last, dict):
            self._mirror(last)

    def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Any) -> None:
        """Unpin; the watcher travels by name (an uncallable one is refused here, as the model
        refuses it before anything else: the protocol can only name callables)."""
        ids = [self._id(b) for b in blocks]
        if not callable(on_reuse):
            raise refusal_class("InvalidArgumentError")("on_reuse must be callable")
        name = str(getattr(on_reuse, "name", None) or f"watcher-{id(on_reuse):x}")
        self.watchers[name] = on_reuse
        self._call("unpin_blocks", {"block_ids": ids, "on_reuse": name})

    def _insert_block_hash(self, key: bytes, block: Any, num_tokens: int | None) -> None:
        """vLLM's offload path receives a key; the protocol sends the request and prefix naming it.

        The key's hash is looked up among the requests sent (a request is
        always cached somewhere before its keys are copied).  A key no request
        sent names goes as a one-hash request, and an empty key (no prefix
        names it: what the lockstep hands over for a prefix no hash names) as
        prefix 0, which every pool refuses.
        """
        hbs = self.hash_block_size
        block_hash, group = key_of(key) if len(key) > 4 else (b"", 0)
        known = self.requests.get(block_hash)
        if known is not None:
            request, prefix = known[0], (known[1] + 1) * hbs
        else:
            request = {"request_id": "kvpool-key", "all_token_ids": [],
                       "block_hashes": [block_hash.hex()] if block_hash else []}
            prefix = hbs if block_hash else 0
        self._call("_insert_block_hash", {"request": request, "prefix_tokens": prefix,
                                          "kv_cache_group_id": group, "block_id": self._id(block),
                                          "num_tokens": num_tokens})

    def observe_calls(self, probes: Sequence[tuple[bytes, int]]) -> tuple[int, list[bool], list[int | None]]:
        """The observer's calls of an ``api-only`` pool, sent at once (pipelined).

        ``get_num_free_blocks``, ``is_block_writable`` of every block, then
        ``get_cached_block`` of each probed key in its group.
        """
        probes = tuple(probes)
        fixed = 1 + self.num_blocks
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None:  # asked with the call before (see _call); only new keys now
            asked, steps = prefetched
            answered = dict(zip(asked, steps[fixed:], strict=True))
            missing = tuple(k for k in probes if k not in answered)
            if missing:
                for key, step in zip(missing, self.session.calls(*self._lookups(missing)), strict=True):
                    self._apply(step)
                    answered[key] = step
            steps = [*steps[:fixed], *(answered[k] for k in probes)]
        else:
            steps = self.session.calls(*self._observation_calls(probes))
            for step in steps:
                self._apply(step)
        for step in steps:
            self._raise(step)
        self._probed = probes
        hits = [s.result[0] if s.result else None for s in steps[fixed:]]
        return steps[0].result, [bool(s.result) for s in steps[1:fixed]], hits

    def _observation_calls(self, probes: Sequence[tuple[bytes, int]]) -> tuple[list[Call], list[bytes]]:
        """The queries of one observation through calls, and their lines."""
        if self._fixed is None:  # the same lines every time: made once
            fixed: list[Call] = [("get_num_free_blocks", {})] + [
                ("is_block_writable", {"block_id": b}) for b in range(self.num_blocks)]
            self._fixed = (fixed, [protocol.encode({"op": op, "args": a}) for op, a in fixed])
        calls, lines = self._lookups(probes)
        return self._fixed[0] + calls, self._fixed[1] + lines

    @staticmethod
    def _lookups(probes: Sequence[tuple[bytes, int]]) -> tuple[list[Call], list[bytes]]:
        calls: list[Call] = [("get_cached_block", {"block_hash": h.hex(), "kv_cache_group_ids": [g]})
                             for h, g in probes]
        return calls, [protocol.encode({"op": op, "args": a}) for op, a in calls]


def _declared(decl: Operation) -> Callable[..., Any]:
    """The reference method of ``decl``: its arguments encoded by kind, its answer decoded."""
    def method(self: DrivenPool, *args: Any, **kwargs: Any) -> Any:
        return self._call(decl.name, self._encode(decl, args, kwargs))

    method.__name__ = method.__qualname__ = decl.name
    method.__doc__ = f"{decl.doc} (sent to the pool process)"
    return method


for _decl in OPERATIONS.values():  # the operations with nothing to translate but their kinds
    if _decl.role != "caller" and _decl.name not in vars(DrivenPool):
        setattr(DrivenPool, _decl.name, _declared(_decl))


__all__ = ["FAILED_CALL_ERRORS", "NOT_SHOWN", "DrivenBlock", "DrivenEvent", "DrivenPool",
           "DrivenRefusal", "FreeQueueMirror", "IndexMirror", "Session", "event_of", "refusal_class"]
