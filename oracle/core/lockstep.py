"""Drive the model and a pool with the same calls and compare after each one.

Arguments name blocks by id; :class:`Lockstep` hands the model ids and the
pool its block objects (as each operation's declaration says), then checks
that both returned the same result (or raised the same error type), that
they emitted the same events, fired the same reuse watchers and told a
metrics collector the same, and that they agree on what the call touched.

A call costs what it touches.  After every call the lockstep compares the
call's footprint (:mod:`kvpool.model.footprints`: the blocks and keys it may
change, with their neighbours in the free queue) and checks the model's
invariants there; every ``full_every`` calls, and when asked (``check``), it
compares the whole pool and every invariant, so that damage outside a
footprint is still caught, and the report names the calls since the last
whole check in which it happened.  ``debug`` also checks, after every call,
that the model changed nothing outside the footprint (O(pool size)).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import (
    OPERATIONS,
    REFERENCES,
    Around,
    ContractBroken,
    Footprint,
    Operation,
    initial_state,
    violated,
)
from kvpool.model.footprints import NOTHING, changed_outside
from kvpool.model.guards import MAX_GROUP_ID
from kvpool.model.operations import Translate
from kvpool.model.pool import keys_of
from kvpool.model.request import prefix_key
from kvpool.model.state import Key, Output, PoolState

from ..generate.capabilities import SKIPPED, Unmakeable, declared_lacks, lacked_in
from ..generate.features import FeatureLog, call_features, kept
from .abstraction import (
    concrete_key,
    event_differences,
    key_of,
    pool_event,
    published,
    refusal_name,
    same_refusal,
    short,
)
from .observe import (
    WHITE_BOX,
    Observation,
    Observer,
    accepts,
    comparable,
    model_block_view,
    model_entries,
    observe_model,
)

BLOCKS_PER_CALL = 2
"""How many blocks' worth of whole-pool checking each call pays for, amortized: by default the
whole pool is compared every ``num_blocks // BLOCKS_PER_CALL`` calls, so a call costs about
the same on a pool of any size."""


class Divergence(AssertionError):
    """The pool and the model disagree; the message says where.

    It carries plain data for whoever draws the failure (``kvpool.pictures``):
    ``record``, the last calls (each with the model's state after it, where
    kept); ``first``, how many calls came before them; ``before``, the model's
    state before the first of them (None at the start or when not kept);
    ``model``, the model's state when the difference was seen; and the pool as
    observed then (``pool``, its pending events in ``pool_events``), or why it
    could not be observed (``unobservable``).  ``window`` is the calls in which
    a difference found by a whole-pool check arose: ``(after call, up to call)``.
    """

    parts: list[str]
    """What differs, in a word each: ``refusal``, ``result``, ``events``, ``watchers``, an
    observed field (``ref``, ``free``, ``index``, ``pending event 0``, ...) or a broken invariant."""
    record: list[CallRecord]
    first: int = 0
    before: PoolState | None = None
    model: PoolState | None = None
    pool: Observation | None = None
    pool_events: list[dict[str, Any]] | None = None
    unobservable: str | None = None
    window: tuple[int, int] | None = None
    log: Any = None
    """The run's calls (a :class:`~kvpool.oracle.search.shrink.CallLog`), when the run kept them."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.parts, self.record = [], []


class CallerBrokeContract(Divergence):
    """The caller broke a contract of the pool at ``step``: a verdict about the caller.

    Not a divergence of the pool: the specification says nothing about what a
    pool does then (:mod:`kvpool.model.contracts`), so the call is not run on
    the pool and the comparison stops.
    """

    def __init__(self, text: str, contract: str, step: int) -> None:
        super().__init__(text)
        self.contract, self.step = contract, step


@dataclass(eq=False)
class Watcher:
    """A reuse callback that records which blocks it was told about."""

    name: str
    log: list[tuple[str, int]]

    def __call__(self, block: Any) -> None:
        self.log.append((self.name, block.block_id))


@dataclass
class CallRecord:
    """One call and what came of it, for reports."""

    op: str
    args: tuple[Any, ...]
    outcome: str
    error: str | None = None
    """The error class the model raised, if it refused the call."""
    state: PoolState | None = None
    """The model's state after the call; kept (a copy) for the last :data:`PICTURED` calls of
    small pools only."""
    theirs: str | None = None
    """What the pool answered, where it is not what the model answered (``outcome``)."""

    @property
    def call(self) -> str:
        """The call as one line: ``free_blocks([1, 2])``."""
        return f"{self.op}{short_args(self.args)}"

    @property
    def shown(self) -> str:
        """The call and what came of it: the model's answer, and the pool's beside it if other."""
        theirs = f" (pool: {self.theirs})" if self.theirs is not None else ""
        return f"{self.call} -> {self.outcome}{theirs}"


PICTURED = 12
"""How many of the last calls a divergence reports, with a picture of the pool each."""
PICTURED_BLOCKS = 64
"""Pools up to this size keep a copy of the model's state per reported call (for the pictures)."""


class MetricsRecorder:
    """A metrics collector that writes down what it is told, as the model's ``out.told`` does."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int | None]] = []

    def on_block_allocated(self, block: Any) -> None:
        self.log.append(("allocated", block.block_id))

    def on_block_accessed(self, block: Any) -> None:
        self.log.append(("accessed", block.block_id))

    def on_block_evicted(self, block: Any) -> None:
        self.log.append(("evicted", block.block_id))

    def reset(self) -> None:
        self.log.append(("reset", None))


class Foreign:
    """Stands for a block id outside the pool when the pool's block class cannot be built."""

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_cnt, self.block_hash, self.is_null = block_id, 0, None, False


_Before = tuple[set[int], set[tuple[Key, int]]]
"""What the lockstep notes of the model before a call's update: the queue around the
footprint, and each footprint block's and key's entries (to check both ways after)."""


@dataclass
class Lockstep(Translate):
    """The model and a pool side by side; ``call`` runs one operation on both (see the module docstring)."""

    pool: Any
    model: PoolState
    foreign: Any = None  # a block of no pool, to stand for out-of-range ids
    fired: list[tuple[str, int]] = field(default_factory=list)
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal
    """How a refusal of the pool is matched with the model's (default: the same kind)."""
    trace: deque[CallRecord] = field(default_factory=lambda: deque(maxlen=PICTURED + 1))
    """The last calls (one more than reported: its state is the one before the first shown)."""
    steps: int = 0
    observe: Callable[..., Observation] | None = None
    """An adapter's own observation, ``observe(pool, probes)``; None: :class:`Observer`'s."""
    metrics: MetricsRecorder | None = None
    """The metrics collector attached to the pool, if the pool took one."""
    observer: Observer = field(init=False, repr=False)
    known: OrderedDict[Any, bytes] = field(default_factory=OrderedDict)
    """Request hashes seen lately, by their published form: how a black-box pool's pending
    events name a key to probe (bounded: the most recent ``4 * num_blocks + 1024``)."""
    probed: set[Key] = field(default_factory=set)
    """Keys the model indexed at the last whole check: a key that left the index is probed once more."""
    invariants: Callable[..., list[str]] = violated
    """The model's invariants a state breaks (an exhaustive search passes a memoised one)."""
    full_every: int | None = None
    """Compare the whole pool every this many calls (None: the pool's size over :data:`BLOCKS_PER_CALL`)."""
    debug: bool = False
    """Also check after every call that the model changed nothing outside the footprint."""
    footprints: bool = True
    """Compare each call's footprint on the pool (off: a pool seen only at whole-pool checks, the
    shadow's checker in a process of its own, where computing it would be wasted)."""
    local_invariants: bool = True
    """Check the model's invariants on each call's footprint (off: at whole-pool checks only, for
    a shadow inside an engine, where the invariants' proofs stand for them)."""
    last_full: int = 0
    """The call after which the whole pool was last compared."""
    ops_seen: Counter[str] = field(default_factory=Counter)
    refusals_seen: Counter[str] = field(default_factory=Counter)
    log: Any = None
    """A :class:`~kvpool.oracle.search.shrink.CallLog` that keeps every call, for a shrink (None: none)."""
    which: int = 0
    """Which pool of the run this is (0: the first, 1: a second pool of the same implementation)."""
    features: FeatureLog | None = None
    """Where each call's shape features go (:mod:`.features`; None: not described)."""
    directed: int = 0
    """Calls made on fresh pools after the run to make the feature pairs it missed (:mod:`.directed`)."""
    lacks: frozenset[str] | None = None
    """What the pool declares it lacks, closed (:mod:`..generate.capabilities`): a call with any of
    it is never made (None: read off the pool's ``kvpool_lacks``)."""

    @classmethod
    def fresh(
        cls, pool_factory: Callable[..., Any], num_blocks: int, caching: bool,
        hash_block_size: int, events: bool, reference: str = "0.31", metrics: bool = False,
        **settings: Any,
    ) -> Lockstep:
        """A new pool and the model configured alike, for vLLM ``reference``'s behaviour; with
        ``metrics`` a :class:`MetricsRecorder` if the factory takes one; ``settings``: other fields."""
        recorder = MetricsRecorder() if metrics and accepts(pool_factory, "metrics_collector") else None
        extra = {} if recorder is None else {"metrics_collector": recorder}
        pool = pool_factory(num_blocks, caching, hash_block_size, enable_kv_cache_events=events,
                            **extra)
        if recorder is not None and getattr(pool, "metrics_collector", recorder) is None:
            recorder = None  # the pool took the keyword and attached none (a process that reports none)
        model = initial_state(num_blocks, caching, hash_block_size, events,
                              **REFERENCES[reference])
        try:
            foreign = type(pool.blocks[0])(num_blocks)
        except Exception:  # a block class we cannot build: any object with an id will do
            foreign = Foreign(num_blocks)
        return cls(pool=pool, model=model, foreign=foreign, metrics=recorder, **settings)

    def __post_init__(self) -> None:
        # A stand-in that wraps the pool (a recorder's tap) is observed through the pool itself.
        self.observer = Observer(getattr(self.pool, "wrapped", self.pool))
        if self.lacks is None:
            self.lacks = declared_lacks(self.pool).lacks
        if self.full_every is None:
            self.full_every = max(1, self.model.num_blocks // BLOCKS_PER_CALL)
        expect = getattr(self.pool, "expect", None)
        self._expect = expect if callable(expect) else None
        self.echo = bool(getattr(self.pool, "ahead", False))
        """The pool answers as the model said it would (told by :attr:`_expect`) and compares its
        process's answers itself as they come: nothing is compared here, only asked."""

    def watcher(self, name: str) -> Watcher:
        return Watcher(name, self.fired)

    def level(self) -> dict[str, Any]:
        """What this lockstep observes of the pool: the level and each check, run or skipped."""
        observer = self.observer
        checks = {name: "ran" if observer.has[name] else "skipped: the pool does not expose it"
                  for name in WHITE_BOX}
        if self.observe is not None:
            checks.update({n: "the adapter's own observation" for n in
                           ("index multimap", "secondary keys", "registered watchers")})
        checks["index lookups"] = "ran" if observer.black_box else "not needed: the index is seen whole"
        if observer.api_only:
            checks["ref counts, free queue, block keys"] = (
                "seen only through calls: get_num_free_blocks, is_block_writable, get_cached_block")
        checks["metrics calls"] = "ran" if self.metrics is not None else "skipped: no collector attached"
        return {"level": "custom" if self.observe is not None else observer.level, "checks": checks}

    # ------------------------------------------------------------ what the pool receives

    def key(self, request: Any, prefix_tokens: Any, group: int) -> bytes:
        """The index key of ``request``'s first ``prefix_tokens`` tokens, as the pool spells it;
        an empty key (which no pool accepts) when no hash names that prefix."""
        hbs = self.model.hash_block_size
        if (isinstance(prefix_tokens, int) and 0 < prefix_tokens <= hbs * len(request.block_hashes)
                and not prefix_tokens % hbs):
            return concrete_key(prefix_key(request, prefix_tokens, hbs, group))
        return b""

    def block(self, block_id: Any) -> Any:
        if isinstance(block_id, int) and 0 <= block_id < len(self.pool.blocks):
            return self.pool.blocks[block_id]
        return self.foreign

    def supports(self, op: str) -> bool:
        """Whether the pool has ``op`` (vLLM's private members may be missing from other pools)."""
        return callable(getattr(self.pool, op, None))

    def _remember(self, args: Sequence[Any]) -> None:
        """Note the hashes of any request in ``args``, so events can name keys to probe."""
        for a in args:
            for h in getattr(a, "block_hashes", ()):
                self.known[published(h)] = h
                self.known.move_to_end(published(h))
        while len(self.known) > 4 * self.model.num_blocks + 1024:
            self.known.popitem(last=False)

    # ------------------------------------------------------------ one call

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on both sides; raise :class:`Divergence` on any difference (and
        :class:`~..generate.capabilities.Unmakeable`, having made nothing, for a call with
        something the pool lacks)."""
        if self.lacks and (missing := self._lacked(op, args, kwargs)) is not None:
            raise Unmakeable(op, missing)
        self.steps += 1
        self.ops_seen[op] += 1
        decl = OPERATIONS[op]
        model = self.model
        if self.observer.black_box and not self.echo:
            self._remember(args)
        m_error: Exception | None = None
        m_result: Any = None
        fp, snapshot = NOTHING, None
        noted: _Before = (set(), set())
        bound: tuple[Any, ...] | None = None
        shape: set[str] | None = None
        try:
            bound = decl.bind(args, kwargs)
            if self.features is not None:
                shape = call_features(model, op, bound, second=self.which == 1,
                                      metrics=self.metrics is not None)
            noop = decl.prepare(model, bound)
            if noop is not None:
                m_result = noop.result
            elif decl.role == "query":
                m_result = decl.next(model, *bound)
            else:
                if self.footprints:
                    fp = decl.footprint(model, *bound)
                    noted = self._note(fp)
                snapshot = model.copy() if self.debug else None
                m_result = decl.next(model, *bound)
        except ContractBroken as broken:
            self._record(op, args, f"caller broke {broken.contract}", None)
            reason = str(broken).split(": ", 1)[-1]
            raise self._diverged(f"caller broke {broken.contract} at step {self.steps}", reason,
                                 ["contract"], contract=broken.contract) from None
        except Exception as exc:  # a refusal (or a call the model cannot bind)
            m_error = exc
            model.out = Output()
            fp = self._refused_footprint(decl, bound)
        whole = self.steps - self.last_full >= (self.full_every or 1)
        if self._expect is not None:  # the pool may send what it will be asked after the call with it
            self._expect(model, m_result, m_error, fp, whole)
        try:
            p_result = getattr(self.pool, op)(*self._pool_args(decl, args), **kwargs)
            p_error = None
        except Exception as exc:
            p_error, p_result = exc, None
        refused = refusal_name(m_error) if m_error is not None else None
        self._record(op, args, refused or short(m_result), refused)
        if self.log is not None and not self.echo:  # an echoed run is made again for its failure
            self.log.add(self.which, op, args, None if m_error else m_result, refused)
        if refused is not None:
            self.refusals_seen[refused] += 1
        if self.echo:
            self.fired.clear()
            if self.metrics is not None:
                self.metrics.log.clear()
        elif getattr(p_error, "verdict", None) is not None:  # a pool process that failed: its verdict
            self.trace[-1].theirs = "its process failed"
            raise self._diverged(op, str(p_error).splitlines()[0], ["process"], p_error)
        elif (m_error is None) != (p_error is None) or (
            m_error and not self.errors_match(m_error, p_error)
        ):
            self.trace[-1].theirs = short(p_result) if p_error is None else f"raised {p_error!r}"
            raise self._diverged(op, f"model raised {m_error!r} | pool raised {p_error!r}",
                                 ["refusal"], p_error if m_error is None else None)
        else:
            if m_error is None:
                self._compare_result(decl, m_result, p_result)
            self._compare_notices(op)
        if snapshot is not None and (outside := changed_outside(snapshot, model, fp)):
            raise self._diverged("footprint", f"the model's {op} changed what its declaration "
                                 f"says it does not: {', '.join(outside)}", ["footprint"])
        if shape is not None and self.features is not None:
            self.features.add(kept(shape, op, m_error))
        # a query touches nothing (one that did is seen by the next whole check), a pool seen only
        # through calls shows no footprint; the footprint comes first even before a whole check, so
        # that a call damaging what it touched is named
        if decl.role != "query" and self.footprints and not self.observer.api_only:
            self._check_footprint(op, fp, noted)
        if whole:
            self.check()
        return m_error if m_error else m_result

    def can(self, op: str, *args: Any, **kwargs: Any) -> bool:
        """Whether the pool has all this call has: its operation and each feature of its shape."""
        return not self.lacks or self._lacked(op, args, kwargs) is None

    def maybe(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call`, for a call a generator can do without: left out (``SKIPPED``) when the pool
        lacks something it has."""
        return self.call(op, *args, **kwargs) if self.can(op, *args, **kwargs) else SKIPPED

    def _lacked(self, op: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
        """The first thing the pool lacks that this call has (:func:`lacked_in`), or None."""
        try:
            bound = OPERATIONS[op].bind(args, kwargs)
        except TypeError:  # a malformed call: made, and refused as such
            return None
        return lacked_in(self.lacks or frozenset(), self.model, op, bound, second=self.which == 1,
                         metrics=self.metrics is not None)

    def _refused_footprint(self, decl: Operation, bound: tuple[Any, ...] | None) -> Footprint:
        """What a refused call would have touched: where the pool must show that it changed nothing."""
        if bound is None or decl.role == "query":
            return NOTHING
        try:
            fp = decl.footprint(self.model, *bound)
        except Exception:  # arguments too malformed to say
            return NOTHING
        # only keys a pool can hold: a refused call may name a group id that fits no key
        return Footprint(fp.blocks, frozenset(k for k in fp.keys if isinstance(k[0], bytes)
                                              and isinstance(k[1], int) and 0 <= k[1] <= MAX_GROUP_ID))

    def _pool_args(self, decl: Operation, args: Sequence[Any]) -> tuple[Any, ...]:
        try:
            return decl.pool_args(args, self)
        except (TypeError, IndexError):  # a call the model refused as malformed: pass it on as made
            return tuple(args)

    def _record(self, op: str, args: Sequence[Any], outcome: str, error: str | None) -> None:
        small = self.model.num_blocks <= PICTURED_BLOCKS and not self.echo  # pictures: of a run made again
        shown = tuple(list(a) if isinstance(a, list) else a for a in args)
        self.trace.append(CallRecord(op, shown, outcome, error, self.model.copy() if small else None))

    def _compare_result(self, decl: Operation, m_result: Any, p_result: Any) -> None:
        if decl.result in ("blocks", "blocks?") and p_result is not None:
            p_result = [b.block_id for b in p_result]
        elif decl.result == "key?" and isinstance(p_result, bytes):
            p_result = key_of(p_result)
        if decl.result == "events":
            taken = event_differences(m_result, p_result)
            if taken:
                raise self._diverged(decl.name, "taken events differ: " + "; ".join(taken), ["events"])
        elif m_result != p_result:
            self.trace[-1].theirs = short(p_result)
            raise self._diverged(decl.name, f"model returned {short(m_result)} | pool returned "
                                 f"{short(p_result)}", ["result"])

    def _compare_notices(self, op: str) -> None:
        out = self.model.out
        predicted = [(w.name, b) for w, b in out.fired]
        seen, self.fired[:] = list(self.fired), []
        if predicted != seen:
            raise self._diverged(op, f"watchers: model fired {predicted} | pool fired {seen}", ["watchers"])
        if self.metrics is not None:
            told, self.metrics.log[:] = list(self.metrics.log), []
            if out.told != told:
                raise self._diverged(op, f"metrics collector: model told {out.told} | pool told {told}",
                                     ["metrics calls"])
        pending = self.observer.pending_events()
        if pending is None:
            return
        emitted = out.events
        if not emitted and len(pending) == len(self.model.events):
            return  # nothing emitted, nothing queued
        diff = event_differences(emitted, pending[len(pending) - len(emitted):] if emitted else [])
        if len(pending) != len(self.model.events):
            diff.append(f"events: model {len(self.model.events)} | pool {len(pending)}")
        if diff:
            raise self._diverged(op, "; ".join(f"pending {d}" for d in diff), ["pending events"])

    # ------------------------------------------------------------ the footprint

    def _note(self, fp: Footprint) -> _Before:
        """Before the update: the queue neighbours of the footprint's blocks, and its entries."""
        s = self.model
        entries: set[tuple[Key, int]] = set()
        if self.local_invariants:
            entries = {(k, b) for b in fp.blocks for k in keys_of(s, b)}
            entries |= {(k, b) for k in fp.keys for b in s.index.get(k, ())}
        return _queue_neighbours(s, fp.blocks), entries

    def _check_footprint(self, op: str, fp: Footprint, noted: _Before) -> None:
        """The call's footprint on both sides, and the model's invariants there."""
        s = self.model
        neighbours, entries = noted
        blocks = set(fp.blocks) | neighbours | _queue_neighbours(s, fp.blocks)
        keys = set(fp.keys).union(*(keys_of(s, b) for b in fp.blocks))
        if self.local_invariants:
            entries |= {(k, b) for k in keys for b in s.index.get(k, ())}
            broken = self.invariants(s, Around(blocks, keys, entries))
            if broken:
                raise self._diverged("invariants", "model state breaks " + ", ".join(broken), broken)
        if self.observe is not None:  # an adapter's own observation comes whole only
            return
        observer = self.observer
        if observer.api_only:
            self._check_through_calls(op, fp, keys)
            return
        found = []  # (part, what differs)
        if observer.num_free() != len(s.free):
            found.append(("num_free", f"num_free: model {len(s.free)} | pool {observer.num_free()}"))
        # in no order while all agree; the differences, if any, in order
        differing = [b for b in blocks if not model_block_view(s, b).agrees(observer.block_view(b))]
        found += [(d.split(":", 1)[0], f"block {b} {d}") for b in sorted(differing)
                  for d in model_block_view(s, b).diff(observer.block_view(b))]
        whole = not observer.black_box
        unequal = [k for k in keys if model_entries(s, k, whole) != observer.entries(k)]
        found += [("index" if whole else "lookups", f"index …{k[0][-3:].hex()}/g{k[1]}: model "
                   f"{model_entries(s, k, whole)} | pool {observer.entries(k)}")
                  for k in sorted(unequal, key=repr)]
        self._observed_differences(op, found)

    def _observed_differences(self, op: str, found: list[tuple[str, str]]) -> None:
        """Raise the divergence of a footprint's differences, each ``(part, what)``, if any."""
        if found:
            raise self._diverged(f"observation after {op}", "; ".join(w for _, w in found),
                                 [part for part, _ in found])

    def _check_through_calls(self, op: str, fp: Footprint, keys: set[Key]) -> None:
        """The footprint of a pool seen only through calls: the free count, whether each of its
        blocks is writable (ref count 1, no key), and what a lookup of each of its keys finds."""
        s = self.model
        blocks, probes = sorted(fp.blocks), sorted(keys)
        num_free, writable, hits = self.observer.through_calls(blocks, probes)
        if self.echo:
            return
        found = [("num_free", f"num_free: model {len(s.free)} | pool {num_free}")] * (num_free != len(s.free))
        for b, w in zip(blocks, writable, strict=True):
            if w != (mine := b != 0 and s.ref[b] == 1 and s.primary[b] is None):
                found.append(("writable", f"block {b} writable: model {mine} | pool {w}"))
        for k, hit in zip(probes, hits, strict=True):
            if hit != (mine_hit := model_entries(s, k, False)):
                found.append(("lookups", f"lookup …{k[0][-3:].hex()}/g{k[1]}: model {mine_hit} | pool {hit}"))
        self._observed_differences(op, found)

    # ------------------------------------------------------------ the whole pool

    def _probes(self) -> list[Key]:
        """Keys to look up in a pool whose index cannot be seen whole: those the model indexes or
        indexed at the last check, the pool's blocks' primaries, and its pending events' keys."""
        observer = self.observer
        if not observer.black_box:
            return []
        keys = set(self.model.index) | self.probed
        # a block's hash is hidden by a pool seen only through calls
        keys |= {key_of(h) for b in self.pool.blocks if (h := getattr(b, "block_hash", None)) is not None}
        for event in observer.pending_events() or ():
            fields_ = pool_event(event)
            for h in fields_.get("block_hashes") or ():
                if h in self.known and isinstance(fields_.get("group_idx"), int):
                    keys.add((self.known[h], fields_["group_idx"]))
        self.probed = set(self.model.index)
        return sorted(keys)

    def check(self) -> None:
        """Compare the whole pool's observation and check every invariant of the model."""
        window = (self.last_full, self.steps)
        self.last_full = self.steps
        broken = self.invariants(self.model)
        if broken:
            raise self._diverged("invariants", "model state breaks " + ", ".join(broken), broken,
                                 window=window)
        observer = self.observer
        links = observer.link_errors()  # first: a looping queue must not be walked again
        probes = self._probes()
        theirs = (self.observe(observer.pool, probes) if self.observe is not None
                  else observer.observe(probes))
        if self.echo:
            return
        mine = comparable(observe_model(self.model, probes), theirs)
        diff, parts = mine.diff(theirs), mine.differing_parts(theirs)
        pending = observer.pending_events()
        events = [] if pending is None else event_differences(self.model.events, pending)
        diff += links + [f"pending {d}" for d in events]
        parts += ["free queue links"] * bool(links) + ["pending events"] * bool(events)
        if diff:
            raise self._diverged("observation", "; ".join(diff), parts, window=window)

    def configuration(self) -> str:
        """The pool this lockstep drives, as it was made: ``pool: 8 blocks, caching on, ...``."""
        m = self.model
        which = "the second pool" if self.which == 1 else "pool"
        return (f"{which}: {m.num_blocks} blocks, caching {'on' if m.caching else 'off'}, hash block size "
                f"{m.hash_block_size}, KV events {'on' if m.events_on else 'off'}, metrics collector "
                f"{'attached' if self.metrics is not None else 'none'}"
                + ("" if m.null_counted else ", vLLM 0.33 behaviour"))

    def _diverged(self, where: str, what: str, parts: list[str],
                  crash: BaseException | None = None, contract: str | None = None,
                  window: tuple[int, int] | None = None) -> Divergence:
        shown = list(self.trace)[-PICTURED:]
        lines = [f"step {i}: {s.shown}" for i, s in enumerate(shown, start=self.steps - len(shown) + 1)]
        place = where
        if window is not None and window[1] - window[0] > 1:
            place = (f"{where} (found by the whole-pool check after call {window[1]}; it passed after "
                     f"call {window[0]}: the damage is in calls {window[0] + 1} to {window[1]})")
        text = f"{place}: {what}\n{self.configuration()}\nlast steps:\n  " + "\n  ".join(lines)
        error = (Divergence(text) if contract is None
                 else CallerBrokeContract(text, contract, self.steps))
        error.__cause__ = crash  # the pool's own exception, with its traceback
        error.parts = list(dict.fromkeys(parts))
        error.first, error.record = self.steps - len(shown), shown
        earlier = list(self.trace)[:-PICTURED]
        error.before = earlier[-1].state if earlier else None
        error.model = self.model
        error.window = window
        try:  # the pool as a picture shows it, with the free queue walked safely
            observer = self.observer
            if observer.api_only:
                raise ValueError("the pool shows its state only through calls (api-only)")
            if observer.link_errors():
                raise ValueError("the free queue's links are broken: " + "; ".join(observer.link_errors()))
            error.pool = observer.observe()
            pending = observer.pending_events()
            error.pool_events = None if pending is None else [pool_event(e) for e in pending]
        except Exception as exc:  # a broken pool may not even be observable
            error.unobservable = repr(exc)
        return error


def _queue_neighbours(s: PoolState, blocks: Iterable[int]) -> set[int]:
    """The free-queue neighbours of those of ``blocks`` that are queued."""
    return {x for b in blocks if b in s.free for x in s.free.neighbours(b) if x is not None}


def short_args(args: Iterable[Any]) -> str:
    return "(" + ", ".join(short(a) for a in args) + ")"
