"""A pool in another process, seen through the reference API: what the lockstep drives.

:class:`DrivenPool` has vLLM 0.31's ``BlockPool`` operations, each made from
its declaration (``kvpool.model.OPERATIONS``) by its arguments' kinds: blocks
are sent as ids (:class:`DrivenBlock` proxies; another pool's block as an id
this pool lacks), requests as the trace writes them, hashes as hex, a reuse
watcher by its name; an operation whose pool receives a key where the
declaration names a request and a prefix (``_insert_block_hash``) sends the
request and prefix that name the key.  An answer comes back as the
reference returns it: blocks by id, a refusal as an exception of the class
the answer names, events as objects of classes named like vLLM's (a field
the process left out compares equal to anything, as ``check-trace`` leaves
it uncompared), the watchers it says fired called with their blocks, the
collector calls it reports made on the collector given.

What the lockstep observes depends on the process.  When its answers carry
an observation, the proxies show ``ref_cnt``/``block_hash`` and the free
queue, index, secondary keys and watchers are mirrored under vLLM's
attribute names.  When they do not, the pool is seen through calls:
:meth:`DrivenPool.observe_calls` asks the free count, the writability of the
blocks and the lookups of the keys the lockstep names, in one ``observe``
line if the process answers those; the lockstep says before each call what
it will ask after it (:meth:`DrivenPool.expect`), so the questions go with
the call, in one exchange.

Ahead (:attr:`DrivenPool.ahead`, the campaign's runs): the lockstep also says
what the model answered, and the pool answers so at once, sending the call
and the questions with what each answer must be (:mod:`.session`); nothing
waits for the pipe, and an answer that differs is found when it comes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import OPERATIONS, Operation
from kvpool.model.footprints import Footprint
from kvpool.model.operations import Translate
from kvpool.model.state import NULL, Key, PoolState

from ..core.abstraction import EVENT_FIELDS, key_of, published, refusal_name
from ..core.observe import observe_model
from ..trace.check import Expected, expected_of
from ..trace.read import TraceStep
from ..trace.schema import Json
from ..trace.write import observation_to_json, request_to_json
from . import protocol
from .session import FAILED_CALL_ERRORS, Call, Expect, Observed, Session
from .views import footprint, footprint_view, shown_view, whole_view

CROSS_POOL = ("free_blocks",)
"""Operations that take blocks of another pool of the same engine, each pool taking back its own
(vLLM's ``free_blocks``); elsewhere another pool's block is one this pool lacks."""
COLLECTOR = {"allocated": "on_block_allocated", "accessed": "on_block_accessed",
             "evicted": "on_block_evicted", "reset": "reset"}
"""A metrics collector's methods, by the name ``told`` gives each."""


class DrivenRefusal(Exception):
    """Base of the exceptions a driven pool raises: each subclass is named as the process named
    its error (``NotEnoughFreeBlocksError``, ...), which is how refusals are matched."""


@functools.cache
def refusal_class(name: str) -> type[DrivenRefusal]:
    """The exception class named ``name`` (one per name)."""
    return type(name, (DrivenRefusal,), {"__module__": __name__})


class _NotShown:
    """A field the process left out of an event: equal to anything, as check-trace skips it."""

    def __eq__(self, other: object) -> bool:
        return True  # and so ``!=`` is False: Python negates ``__eq__``

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


class _Layout(Translate):
    """Records where a declaration's arguments go in the call a pool receives (its ``pool_call``)."""

    def block(self, block_id: Any) -> Any:
        return ("block", block_id)

    def key(self, request: Any, prefix_tokens: Any, group: int) -> Any:
        return ("key", (request, prefix_tokens, group))


def pool_form(decl: Operation) -> list[Any]:
    """Per argument a pool receives: the declared argument's name, ``("block", name)``, or
    ``("key", (request, prefix, group names))`` for a key standing for those three."""
    if decl.pool_call is None:
        return [a.name for a in decl.args]
    return list(decl.pool_call({a.name: a.name for a in decl.args}, _Layout()))


@dataclass
class _Expected:
    """What the lockstep said of the call about to be made (:meth:`DrivenPool.expect`)."""

    model: PoolState
    result: Any
    error: BaseException | None
    footprint: Footprint
    whole: bool


class DrivenPool:
    """The reference API over a :class:`Session`; see the module docstring.

    ``ahead``: answer each call as the model does and check the process's answer when it comes;
    ``collector``: a metrics collector told what the process reports (``told``).
    """

    def __init__(self, session: Session, *, ahead: bool = False, collector: Any = None) -> None:
        self.session = session
        self.ahead = ahead
        self.collector = self.metrics_collector = collector if session.metrics else None
        header = session.header
        self.num_blocks = header.num_blocks
        self.enable_caching = header.enable_caching
        self.hash_block_size = header.hash_block_size
        self.enable_kv_cache_events = header.enable_kv_cache_events
        self.medium = header.medium
        self.kvpool_lacks = session.lacks
        self.blocks = [DrivenBlock(i, self) for i in range(self.num_blocks)]
        self.kv_event_queue: list[DrivenEvent] = []
        self.watchers: dict[str, Callable[[Any], Any]] = {}
        self.requests: dict[bytes, tuple[dict[str, Json], int]] = {}
        """Every request hash sent, with the request (as last sent) and its chunk index: how a key
        is sent as the request and prefix that name it."""
        shape = None if ahead else session.shape  # ahead, the lockstep sees the model's answers only
        self.free_block_queue: FreeQueueMirror | None = FreeQueueMirror() if shape else None
        self.cached_block_hash_to_block = IndexMirror() if shape and "index" in shape else None
        self.cached_block_hashes_by_block: dict[int, list[bytes]] | None = (
            {} if shape and "secondary" in shape else None)
        self._reuse_watchers: dict[int, str] | None = {} if shape and "watched" in shape else None
        self._sent: dict[int, tuple[Any, tuple[int, int], dict[str, Json]]] = {}
        """The last form each request was sent in (by identity), while it has not grown."""
        self._texts: dict[int, tuple[Json, str]] = {}
        """Those forms as text, by the identity of the form (:func:`.protocol.call_line`)."""
        self._expected: _Expected | None = None
        self._model: PoolState | None = None
        self._viewed: tuple[frozenset[int], frozenset[Key], bool] | None = None
        """Ahead: the blocks and keys the last call's answer is checked on (and whether all)."""
        self._viewed_answer: tuple[list[int], list[Key], Observed] | None = None
        """Ahead: the questions the last call carried, with the model's answer to them."""
        self._probed: set[Key] = set()
        """The keys the model indexed when the lockstep last compared the whole pool (it asks them
        again at the next whole comparison: a key that left the index)."""
        self._prefetched: tuple[list[int], dict[Key, int | None], Observed] | None = None
        """The questions sent with the last call, answered: blocks, lookups, the whole answer."""
        if shape and session.fresh is not None:
            self._mirror(session.fresh)
        for op in session.unsupported:  # not callable: the workloads leave it out
            setattr(self, op, None)

    # ------------------------------------------------------------ what the lockstep says

    def expect(self, model: PoolState, result: Any, error: BaseException | None, footprint: Footprint,
               whole: bool) -> None:
        """The model's answer to the call about to be made, what it may change, and whether the
        whole pool is compared after it (the lockstep's hook)."""
        self._expected = _Expected(model, result, error, footprint, whole)
        self._model = model

    @property
    def current(self) -> bool:
        return self.session.current

    # ------------------------------------------------------------ arguments, by kind

    def _id(self, block: Any) -> Any:
        """A block argument as the id sent: another pool's block is an id this pool lacks."""
        if isinstance(block, DrivenBlock):
            return block.block_id if block.owner is self or block.owner is None else self.num_blocks
        return getattr(block, "block_id", -1)

    def _encode(self, decl: Operation, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Json]:
        """A call's arguments in the protocol's form, by their declared kinds; an optional argument
        left at its default is left out, as a trace leaves it."""
        if decl.pool_call is None:
            named = dict(zip((a.name for a in decl.args), decl.bind(args, kwargs), strict=True))
        else:
            named = self._from_pool_form(decl, [*args, *kwargs.values()])
        out: dict[str, Json] = {}
        for arg in decl.args:
            value = named[arg.name]
            if arg.kind == "flag":  # a flag is read by its truth, as the reference reads it
                if value:
                    out[arg.name] = True
            elif not (arg.optional and value is arg.default):
                out[arg.name] = self._encode_arg(arg.kind, value)
        return out

    def _from_pool_form(self, decl: Operation, values: Sequence[Any]) -> dict[str, Any]:
        """The declared arguments of a call made in the form the pool receives (a key for the
        request and prefix that name it)."""
        named: dict[str, Any] = {}
        for spec, value in zip(pool_form(decl), values, strict=True):
            if isinstance(spec, tuple) and spec[0] == "key":
                named.update(zip(spec[1], self._named_by(value), strict=True))
            else:
                named[spec[1] if isinstance(spec, tuple) else spec] = value
        return named

    def _named_by(self, key: bytes) -> tuple[dict[str, Json], int, int]:
        """The request, prefix and group that name ``key``: the request sent with its hash (one is
        always cached before its keys are copied), else a one-hash request; an empty key (no
        prefix names it) as prefix 0, which every pool refuses."""
        hbs = self.hash_block_size
        block_hash, group = key_of(key) if len(key) > 4 else (b"", 0)
        known = self.requests.get(block_hash)
        if known is not None:
            return known[0], (known[1] + 1) * hbs, group
        request: dict[str, Json] = {"request_id": "kvpool-key", "all_token_ids": [],
                                    "block_hashes": [block_hash.hex()] if block_hash else []}
        return request, hbs if block_hash else 0, group

    def _encode_arg(self, kind: str, value: Any) -> Json:
        if kind == "block":
            return self._id(value)
        if kind == "blocks":
            return [self._id(b) for b in value]
        if kind == "request":
            return value if isinstance(value, dict) else self._request(value)
        if kind == "hash":
            return bytes(value).hex()
        if kind == "watcher":
            if not callable(value):  # the model refuses it before anything else; it cannot travel
                raise refusal_class("InvalidArgumentError")("on_reuse must be callable")
            name = watcher_name(value)
            self.watchers[name] = value
            return name
        if kind in ("block_ids", "groups", "mask?"):
            return list(value)
        return value

    def _request(self, request: Any) -> dict[str, Json]:
        """A request as sent (made again only when it grew), its hashes remembered."""
        size = (len(request.all_token_ids), len(getattr(request, "block_hashes", ())))
        last = self._sent.get(id(request))
        if last is not None and last[0] is request and last[1] == size:
            return last[2]
        sent = request_to_json(request)
        for i, h in enumerate(getattr(request, "block_hashes", ())):
            self.requests[bytes(h)] = (sent, i)
        if len(self._sent) > 256:
            self._sent.clear()
            self._texts.clear()
        self._sent[id(request)] = (request, size, sent)
        self._texts[id(sent)] = (sent, protocol.text(sent))
        return sent

    def _block(self, block_id: int) -> DrivenBlock:
        return self.blocks[block_id] if 0 <= block_id < self.num_blocks else DrivenBlock(block_id)

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

    # ------------------------------------------------------------ one call

    def _call(self, op: str, args: dict[str, Json], expected: _Expected | None = None) -> Any:
        """One call: answered as the model says (ahead), or sent with the questions the lockstep
        will ask after it and answered by the process.  ``expected``: what the lockstep said of it
        (taken before the arguments were encoded: an argument refused here takes it too)."""
        if self.ahead and expected is not None:
            return self._answer_ahead(op, args, expected)
        self.session.settle()
        if self.session.shape is not None:
            step = self._step(op, args)
        else:
            calls, lines, blocks, keys = self._questions(expected)
            steps = self.session.calls([(op, args), *calls], [protocol.encode({"op": op, "args": args}),
                                                              *lines])
            self._apply(steps[0])
            step = steps[0]
            self._prefetched = None if expected is None else (blocks, *self._answers(keys, steps[1:]))
        self._raise(step)
        return self._result(op, step.result)

    def _step(self, op: str, args: dict[str, Json]) -> TraceStep:
        """One call, waiting for its answer, applied (events, watchers, observation), not raised."""
        self._prefetched = None
        (step,) = self.session.calls([(op, args)])
        self._apply(step)
        return step

    def _raise(self, step: TraceStep) -> None:
        if step.error is not None:
            message = self.session.messages.get(step.line - 1)
            said = f" ({message})" if message else ""
            raise refusal_class(step.error)(f"the pool process refused {step.op}: {step.error}{said}")

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
        told = self.session.told.pop(step.line, ())  # what the process says its pool told its collector
        for what, block_id in told if self.collector is not None else ():
            args = () if block_id is None else (self._block(block_id),)
            getattr(self.collector, COLLECTOR[what])(*args)
        if step.observation is not None and not self.ahead:
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
            queue.blocks = [blocks[b] if 0 <= b < len(blocks) else DrivenBlock(b) for b in obs["free"]]
            queue.num_free_blocks = obs["num_free"]
        if self.cached_block_hash_to_block is not None:
            self.cached_block_hash_to_block._cache = {
                bytes.fromhex(k): {b: DrivenBlock(b) for b in ids} for k, ids in obs["index"]}
        if self.cached_block_hashes_by_block is not None:
            self.cached_block_hashes_by_block = {
                b: [bytes.fromhex(k) for k in keys] for b, keys in enumerate(obs["secondary"]) if keys}
        if self._reuse_watchers is not None:
            self._reuse_watchers = {b: "" for b in obs["watched"]}

    # ------------------------------------------------------------ ahead of the answers

    def _answer_ahead(self, op: str, args: dict[str, Json], expected: _Expected) -> Any:
        """Send the call with what the model says of it; answer as the model did, at once."""
        model, error, session = expected.model, expected.error, self.session
        outcome = expected_of(op, model, expected.result, error, watcher_name)
        told = [(what, b) for what, b in model.out.told] if self.collector is not None else None
        expect = Expect(self._name(op), op, args, outcome, told=told)
        self._viewed = self._viewed_answer = None
        asks: dict[str, Json] | None = None
        if OPERATIONS[op].role != "query" or expected.whole:  # what the lockstep asks after it
            blocks, keys = self._asked(expected)
            self._viewed = (frozenset(blocks), frozenset(keys), expected.whole)
            if session.shape is not None and (expected.whole or not session.when_asked):
                # the process shows the pool (the whole of it, or after every call): checked on it
                expect.view = (whole_view(observation_to_json(observe_model(model))) if expected.whole
                               else footprint_view(model, blocks, keys))
                expect.show = session.when_asked
            elif session.observe:  # asked with the call, answered with it (shown, when it shows)
                asks = protocol.observe_line(blocks, keys)["args"]
                expect.asks = (asks["blocks"], asks["keys"])
                expect.observed = self._observed_by_model(blocks, keys)
                self._viewed_answer = (blocks, keys, expect.observed)
                if session.when_asked:
                    expect.shown = shown_view(model, blocks, keys)
            else:
                self._viewed = None  # asked as lines of their own (observe_calls)
        session.post([expect], [protocol.call_line(op, args, self._texts, asks, expect.show)])
        # the lockstep compares nothing of a pool that answers ahead (its ``echo``): no events,
        # watchers or collector calls to show it, only the answer the workload reads
        if error is not None:
            raise refusal_class(refusal_name(error))(f"the model refuses {op}: {error}")
        return expected.result if OPERATIONS[op].result == "events" else self._result(op, outcome.result)

    def _name(self, op: str) -> str:
        session = self.session
        return f"call {len(session.log) + len(session.ahead) + 1} ({op})"

    def _asked(self, expected: _Expected) -> tuple[list[int], list[Key]]:
        """What the lockstep asks after a call: the footprint's blocks and keys, or every block and
        every key the model indexes when it compares the whole pool then."""
        model = expected.model
        blocks, keys = footprint(model, expected.footprint)
        if expected.whole:  # the lockstep probes what the model indexes, and indexed at its last look
            probed, self._probed = self._probed, set(model.index)
            return list(range(self.num_blocks)), sorted(self._probed | probed | set(keys))
        return blocks, keys

    def _observed_by_model(self, blocks: Sequence[int], probes: Sequence[Key]) -> Observed:
        model = self._model
        if model is None:
            raise RuntimeError("no call was expected yet")
        writable = [b != NULL and model.ref[b] == 1 and model.primary[b] is None for b in blocks]
        return len(model.free), writable, [hit[0] if (hit := model.index.get(k)) else None for k in probes]

    # ------------------------------------------------------------ seeing the pool through calls

    def observe_calls(self, probes: Sequence[tuple[bytes, int]],
                      blocks: Sequence[int] | None = None) -> Observed:
        """The observer's questions: ``get_num_free_blocks``, ``is_block_writable`` of ``blocks``
        (every block when None), ``get_cached_block`` of each probed key in its group."""
        probes = list(probes)
        asked = list(range(self.num_blocks)) if blocks is None else list(blocks)
        if self.ahead and self._model is not None:
            return self._answer_questions(self._model, asked, probes)
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and set(asked) <= set(prefetched[0]):
            ids, hits, (num_free, writable, _hits) = prefetched
            where = {b: i for i, b in enumerate(ids)}
            missing = [k for k in probes if k not in hits]
            if missing:
                hits = {**hits, **self._ask([], missing)[2]}
            return num_free, [writable[where[b]] for b in asked], [hits[k] for k in probes]
        num_free, found, answered = self._ask(asked, probes)
        return num_free, found, [answered[k] for k in probes]

    def _answer_questions(self, model: PoolState, asked: list[int], probes: list[Key]) -> Observed:
        """Ahead: the lockstep's questions answered as the model says, and those the last call did
        not carry sent with their answers (or an observing process's whole pool checked)."""
        viewed, self._viewed = self._viewed, None
        known, self._viewed_answer = self._viewed_answer, None
        if viewed is not None and known is not None and known[0] == asked and known[1] == probes:
            return known[2]  # what the call carried, as the model answered it
        answer = self._observed_by_model(asked, probes)
        session = self.session
        shown = session.shape if not session.when_asked else None  # one that shows when asked: asked
        if viewed is not None and set(asked) <= viewed[0]:
            covered = viewed[2] if shown is not None else False
            keys_seen = covered or (shown is None or "index" in shown)
            missing = [] if covered else [k for k in probes if not (keys_seen and k in viewed[1])]
            if not missing:
                return answer
            if shown is None or "index" not in shown:
                self._post_questions(model, [], missing, self._observed_by_model([], missing))
                return answer
        if shown is None:
            self._post_questions(model, asked, probes, answer)
        else:
            self.session.post([Expect(self._name("get_num_free_blocks"), "get_num_free_blocks", {},
                                      Expected(None, len(model.free), [], []),
                                      view=whole_view(observation_to_json(observe_model(model))))],
                              [protocol.encode({"op": "get_num_free_blocks", "args": {}})])
        return answer

    def _ask(self, blocks: list[int], probes: list[Key]) -> tuple[int, list[bool], dict[Key, int | None]]:
        calls, lines = self._question_lines(blocks, probes)
        steps = self.session.calls(calls, lines)
        for step in steps:
            self._apply(step)
        hits, observed = self._answers(probes, steps)
        return observed[0], observed[1], hits

    def _questions(self, expected: _Expected | None
                   ) -> tuple[list[Call], list[bytes], list[int], list[Key]]:
        """The questions to send with a call: those the lockstep will ask after it."""
        if expected is None:
            return [], [], [], []
        blocks, keys = footprint(expected.model, expected.footprint)
        if expected.whole:
            blocks, keys = list(range(self.num_blocks)), sorted(set(expected.model.index) | set(keys))
        return *self._question_lines(blocks, keys), blocks, keys

    def _question_lines(self, blocks: Sequence[int], keys: Sequence[Key]
                        ) -> tuple[list[Call], list[bytes]]:
        """One observe line when the process answers them; else one query per question."""
        if self.session.observe:
            line = protocol.observe_line(blocks, keys)
            return [(protocol.OBSERVE, line["args"])], [protocol.encode(line)]
        calls: list[Call] = [("get_num_free_blocks", {})]
        calls += [("is_block_writable", {"block_id": b}) for b in blocks]
        calls += [("get_cached_block", {"block_hash": h.hex(), "kv_cache_group_ids": [g]})
                  for h, g in keys]
        return calls, [protocol.encode({"op": op, "args": a}) for op, a in calls]

    def _answers(self, keys: Sequence[Key], steps: Sequence[TraceStep]
                 ) -> tuple[dict[Key, int | None], Observed]:
        """The questions' answers: lookups by key, and the free count, writability, lookups."""
        for step in steps:
            self._raise(step)
        if self.session.observe:
            observed: Observed = steps[0].result
        else:
            fixed = len(steps) - len(keys)
            observed = (steps[0].result, [bool(s.result) for s in steps[1:fixed]],
                        [s.result[0] if s.result else None for s in steps[fixed:]])
        return dict(zip(keys, observed[2], strict=True)), observed

    def _post_questions(self, model: PoolState, blocks: list[int], probes: list[Key],
                        answer: Observed) -> None:
        """Ahead: the questions, each with the model's answer."""
        calls, lines = self._question_lines(blocks, probes)
        if self.session.observe:
            view = shown_view(model, blocks, probes) if self.session.when_asked else None
            expects = [Expect(self._name(protocol.OBSERVE), protocol.OBSERVE, calls[0][1], observed=answer,
                              shown=view)]
        else:
            num_free, writable, hits = answer
            results: list[Json] = [num_free, *writable, *([h] if h is not None else None for h in hits)]
            first = len(self.session.log) + len(self.session.ahead) + 1
            expects = [Expect(f"call {first + i} ({op})", op, args, Expected(None, result, [], []))
                       for i, ((op, args), result) in enumerate(zip(calls, results, strict=True))]
        self.session.post(expects, lines)

    # ------------------------------------------------------------ operations that need more

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Free the listed blocks; another driven pool's blocks are freed by its own process.

        As one call: this pool's share first (its refusal wins, as the
        model checks its own blocks first), then each other pool's.  When
        another pool refuses its share, the shares already freed are undone
        by replaying their pools' calls without them
        (:meth:`Session.replay`): neither pool changed, as the model says.
        """
        theirs: dict[DrivenPool, list[int]] = {}
        own: list[Any] = []
        for block in ordered_blocks:
            owner = getattr(block, "owner", None)
            if isinstance(owner, DrivenPool) and owner is not self and owner.current:
                theirs.setdefault(owner, []).append(block.block_id)
            else:
                own.append(block)
        if not theirs:
            _declared_methods["free_blocks"](self, own)
            return
        self._expected = None
        for pool in (self, *theirs):
            pool.session.settle()
        done: list[DrivenPool] = []
        if own:
            self._raise(self._step("free_blocks", {"block_ids": [self._id(b) for b in own]}))
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
        last = next((line["observation"] for line in reversed(session.log) if "observation" in line),
                    session.fresh)
        if isinstance(last, dict) and not self.ahead:
            self._mirror(last)


def watcher_name(watcher: Any) -> str:
    """The name a reuse watcher travels by: its ``name``, else one made of its identity."""
    return str(getattr(watcher, "name", None) or f"watcher-{id(watcher):x}")


def _declared(decl: Operation) -> Callable[..., Any]:
    """The reference method of ``decl``: its arguments encoded by kind, its answer decoded."""
    def method(self: DrivenPool, *args: Any, **kwargs: Any) -> Any:
        expected, self._expected = self._expected, None
        return self._call(decl.name, self._encode(decl, args, kwargs), expected)

    method.__name__ = method.__qualname__ = decl.name
    method.__doc__ = f"{decl.doc} (sent to the pool process)"
    return method


_declared_methods: dict[str, Callable[..., Any]] = {
    name: _declared(decl) for name, decl in OPERATIONS.items() if decl.role != "caller"}
"""Every operation of the pool, made from its declaration."""
for _name, _method in _declared_methods.items():
    if _name not in CROSS_POOL:
        setattr(DrivenPool, _name, _method)


__all__ = ["COLLECTOR", "CROSS_POOL", "FAILED_CALL_ERRORS", "NOT_SHOWN", "DrivenBlock", "DrivenEvent",
           "DrivenPool", "DrivenRefusal", "FreeQueueMirror", "IndexMirror", "Session", "event_of",
           "footprint_view", "pool_form", "refusal_class", "shown_view", "watcher_name"]
