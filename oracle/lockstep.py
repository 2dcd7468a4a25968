"""Drive the model and a pool with the same calls and compare after each one.

Arguments name blocks by id; :class:`Lockstep` hands the model ids and the
pool its block objects, then checks that both returned the same result (or
raised the same error type), that their observations agree, that every
model invariant holds, and that they emitted the same events and fired the
same reuse watchers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import ACTIONS, QUERIES, REFERENCES, ContractBroken, initial_state, violated
from kvpool.model.request import prefix_key
from kvpool.model.state import Key, PoolState

from .abstraction import (
    concrete_key,
    event_differences,
    key_of,
    pool_event,
    published,
    refusal_name,
    same_refusal,
)
from .observe import WHITE_BOX, Observation, Observer, comparable, observe_model

# Which positional arguments name blocks: "one" a single id, "many" a list.
BLOCK_ARGS: dict[str, dict[int, str]] = {
    "free_blocks": {0: "many"},
    "touch": {0: "many"},
    "unpin_blocks": {0: "many"},
    "cache_full_blocks": {1: "many"},
    "cache_partial_block": {1: "one"},
    "move_block_hashes": {0: "one", 1: "one"},
    "is_block_writable": {0: "one"},
    "_maybe_evict_cached_block": {0: "one"},
}
RETURNS_BLOCKS = {"get_new_blocks", "get_cached_block"}
RETURNS_KEY = {"cache_partial_block"}


class Divergence(AssertionError):
    """The pool and the model disagree; the message says where.

    It carries plain data for whoever draws the failure (``kvpool.pictures``):
    ``record``, the last calls (each with the model's state after it);
    ``first``, how many calls came before them; ``before``, the model's state
    before the first of them (None at the start); ``model``, the model's state
    when the difference was seen; and the pool as observed then (``pool``,
    its pending events in ``pool_events``), or why it could not be observed
    (``unobservable``).
    """

    parts: list[str]
    """What differs, in a word each: ``refusal``, ``result``, ``events``, ``watchers``, an
    observed field (``ref``, ``free``, ``index``, ``pending event 0``, ...) or a broken invariant."""
    record: list[Step]
    first: int
    before: PoolState | None
    model: PoolState | None
    pool: Observation | None
    pool_events: list[dict[str, Any]] | None
    unobservable: str | None

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.parts, self.record, self.first, self.before, self.model = [], [], 0, None, None
        self.pool, self.pool_events, self.unobservable = None, None, None


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
class Step:
    """One call and what came of it, for traces."""

    op: str
    args: tuple[Any, ...]
    outcome: str
    error: str | None = None
    """The error class the model raised, if it refused the call."""
    state: PoolState | None = None
    """The model's state after the call; kept for the last :data:`PICTURED` steps only."""

    @property
    def call(self) -> str:
        """The call as one line: ``free_blocks([1, 2])``."""
        return f"{self.op}{short_args(self.args)}"


PICTURED = 12
"""How many of the last steps a divergence reports, with a picture of the pool each."""


class MetricsRecorder:
    """A metrics collector that writes down what it is told, as the model's ``told`` does."""

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


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` takes ``keyword`` (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class _Foreign:
    """Stands for a block id outside the pool when the pool's block class cannot be built."""

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_cnt, self.block_hash, self.is_null = block_id, 0, None, False


@dataclass
class Lockstep:
    """The model and a pool side by side; ``call`` runs one operation on both.

    After every call it compares results and refusals, the whole observation
    at the level the pool allows (:class:`~kvpool.oracle.observe.Observer`),
    the events, the reuse watchers' calls and, when a metrics collector is
    attached, what it was told; and checks every invariant of the model.
    """

    pool: Any
    model: PoolState
    foreign: Any = None  # a block of no pool, to stand for out-of-range ids
    fired: list[tuple[str, int]] = field(default_factory=list)
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal
    """How a refusal of the pool is matched with the model's (default: the same kind)."""
    trace: list[Step] = field(default_factory=list)
    steps: int = 0
    observe: Callable[..., Observation] | None = None
    """An adapter's own observation, ``observe(pool, probes)``; None: :class:`Observer`'s."""
    metrics: MetricsRecorder | None = None
    """The metrics collector attached to the pool, if the pool took one."""
    observer: Observer = field(init=False, repr=False)
    known: dict[Any, bytes] = field(default_factory=dict)
    """Request hashes seen, by their published form: how events name a key to probe."""
    probed: set[Key] = field(default_factory=set)
    """Keys the model indexed at the last check: a key that left the index is probed once more."""
    invariants: Callable[[PoolState], list[str]] = violated
    """The model's invariants a state breaks (an exhaustive search passes a memoised one)."""

    @classmethod
    def fresh(
        cls, pool_factory: Callable[..., Any], num_blocks: int, caching: bool,
        hash_block_size: int, events: bool, reference: str = "0.31", metrics: bool = False,
    ) -> Lockstep:
        """A new pool and the model configured alike, for vLLM ``reference``'s behaviour.

        With ``metrics``, the pool is built with a :class:`MetricsRecorder` if
        its factory takes a ``metrics_collector``.
        """
        recorder = MetricsRecorder() if metrics and _accepts(pool_factory, "metrics_collector") else None
        extra = {} if recorder is None else {"metrics_collector": recorder}
        pool = pool_factory(num_blocks, caching, hash_block_size, enable_kv_cache_events=events,
                            **extra)
        model = initial_state(num_blocks, caching, hash_block_size, events,
                              **REFERENCES[reference])
        try:
            foreign = type(pool.blocks[0])(num_blocks)
        except Exception:  # a block class we cannot build: any object with an id will do
            foreign = _Foreign(num_blocks)
        return cls(pool=pool, model=model, foreign=foreign, metrics=recorder)

    def __post_init__(self) -> None:
        # A stand-in that wraps the pool (a recorder's tap) is observed through the pool itself.
        self.observer = Observer(getattr(self.pool, "wrapped", self.pool))

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

    def _key(self, request: Any, prefix_tokens: Any, group: int) -> bytes:
        """The index key of ``request``'s first ``prefix_tokens`` tokens, as the pool spells it;
        an empty key (which no pool accepts) when no hash names that prefix."""
        hbs = self.model.hash_block_size
        if (isinstance(prefix_tokens, int) and 0 < prefix_tokens <= hbs * len(request.block_hashes)
                and not prefix_tokens % hbs):
            return concrete_key(prefix_key(request, prefix_tokens, hbs, group))
        return b""

    def supports(self, op: str) -> bool:
        """Whether the pool has ``op`` (vLLM's private members may be missing from other pools)."""
        return callable(getattr(self.pool, op, None))

    def _block(self, block_id: Any) -> Any:
        if isinstance(block_id, int) and 0 <= block_id < len(self.pool.blocks):
            return self.pool.blocks[block_id]
        return self.foreign

    def _pool_args(self, op: str, args: Sequence[Any]) -> list[Any]:
        if op == "_insert_block_hash":  # the model's (request, prefix, group) is the key the pool gets
            request, prefix_tokens, group, block_id, num_tokens = args
            return [self._key(request, prefix_tokens, group), self._block(block_id), num_tokens]
        out = list(args)
        for pos, kind in BLOCK_ARGS.get(op, {}).items():
            if kind == "one":
                out[pos] = self._block(args[pos])
            else:
                out[pos] = [self._block(b) for b in args[pos]]
        return out

    def _remember(self, args: Sequence[Any]) -> None:
        """Note the hashes of any request in ``args``, so events can name keys to probe."""
        for a in args:
            for h in getattr(a, "block_hashes", ()):
                self.known[published(h)] = h

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on both sides; raise :class:`Divergence` on any difference."""
        self.steps += 1
        before_fired = len(self.model.fired)
        before_told = len(self.model.told)
        model_fn = ACTIONS.get(op)
        query = model_fn is None
        if self.observer.black_box:
            self._remember(args)
        try:
            if query:
                m_result, m_state = QUERIES[op](self.model, *args, **kwargs), self.model
            else:
                m_state, m_result = model_fn(self.model, *args, **kwargs)  # type: ignore[misc]
            m_error = None
        except Exception as exc:
            m_error, m_result, m_state = exc, None, self.model
        if isinstance(m_error, ContractBroken):
            self.trace.append(Step(op, tuple(list(a) if isinstance(a, list) else a for a in args),
                                   f"caller broke {m_error.contract}", None, self.model))
            reason = str(m_error).split(": ", 1)[-1]
            raise self._diverged(f"caller broke {m_error.contract} at step {self.steps}", reason,
                                 ["contract"], contract=m_error.contract)
        try:
            p_result = getattr(self.pool, op)(*self._pool_args(op, args), **kwargs)
            p_error = None
        except Exception as exc:
            p_error, p_result = exc, None
        outcome = refusal_name(m_error) if m_error else repr(m_result)
        self.trace.append(Step(op, tuple(list(a) if isinstance(a, list) else a for a in args),
                               outcome, refusal_name(m_error) if m_error else None, m_state))
        if len(self.trace) > PICTURED + 1:  # one more: the state before the first shown step
            self.trace[-PICTURED - 2].state = None
        if (m_error is None) != (p_error is None) or (
            m_error and not self.errors_match(m_error, p_error)
        ):
            raise self._diverged(op, f"model raised {m_error!r} | pool raised {p_error!r}",
                                 ["refusal"], p_error if m_error is None else None)
        if m_error is None:
            if op in RETURNS_BLOCKS and p_result is not None:
                p_result = [b.block_id for b in p_result]
            elif op in RETURNS_KEY and isinstance(p_result, bytes):
                p_result = key_of(p_result)
            if op == "take_events":
                taken = event_differences(m_result, p_result)
                if taken:
                    raise self._diverged(op, "taken events differ: " + "; ".join(taken), ["events"])
            elif m_result != p_result:
                raise self._diverged(op, f"model returned {m_result!r} | pool returned {p_result!r}",
                                     ["result"])
        self.model = m_state
        self.check()
        predicted = [(w.name, b) for w, b in self.model.fired[before_fired:]]
        seen, self.fired[:] = list(self.fired), []
        if predicted != seen:
            raise self._diverged(op, f"watchers: model fired {predicted} | pool fired {seen}",
                                 ["watchers"])
        if self.metrics is not None:
            told, self.metrics.log[:] = list(self.metrics.log), []
            if list(self.model.told[before_told:]) != told:
                raise self._diverged(op, f"metrics collector: model told "
                                         f"{list(self.model.told[before_told:])} | pool told {told}",
                                     ["metrics calls"])
        return m_error if m_error else m_result

    def _probes(self) -> list[Key]:
        """Keys to look up in a pool whose index cannot be seen whole.

        Every key the model indexes, every key it indexed at the last check,
        every key a block of the pool names as its primary, and every key of
        the pending events the pool shows (named through the requests seen).
        """
        observer = self.observer
        if not observer.black_box:
            return []
        keys = set(self.model.index) | self.probed
        for b in self.pool.blocks:
            block_hash = getattr(b, "block_hash", None)  # hidden by a pool seen only through calls
            if block_hash is not None:
                keys.add(key_of(block_hash))
        for event in observer.pending_events() or ():
            fields_ = pool_event(event)
            for h in fields_.get("block_hashes") or ():
                if h in self.known and isinstance(fields_.get("group_idx"), int):
                    keys.add((self.known[h], fields_["group_idx"]))
        self.probed = set(self.model.index)
        return sorted(keys)

    def check(self) -> None:
        """Compare observations and check every invariant of the model."""
        broken = self.invariants(self.model)
        if broken:
            raise self._diverged("invariants", "model state breaks " + ", ".join(broken), broken)
        observer = self.observer
        links = observer.link_errors()  # first: a looping queue must not be walked again
        probes = self._probes()
        theirs = (self.observe(observer.pool, probes) if self.observe is not None
                  else observer.observe(probes))
        mine = comparable(observe_model(self.model, probes), theirs)
        diff, parts = mine.diff(theirs), mine.differing_parts(theirs)
        pending = observer.pending_events()
        events = [] if pending is None else event_differences(self.model.events, pending)
        diff += links + [f"pending {d}" for d in events]
        parts += ["free queue links"] * bool(links) + ["pending events"] * bool(events)
        if diff:
            raise self._diverged("observation", "; ".join(diff), parts)

    def _diverged(self, where: str, what: str, parts: list[str],
                  crash: BaseException | None = None, contract: str | None = None) -> Divergence:
        first = max(0, len(self.trace) - PICTURED)
        lines = [f"step {i + 1}: {s.op}{short_args(s.args)} -> {s.outcome}"
                 for i, s in enumerate(self.trace[first:], start=first)]
        text = f"{where}: {what}\nlast steps:\n  " + "\n  ".join(lines)
        error = (Divergence(text) if contract is None
                 else CallerBrokeContract(text, contract, self.steps))
        error.__cause__ = crash  # the pool's own exception, with its traceback
        error.parts = list(dict.fromkeys(parts))
        error.first, error.record = first, self.trace[first:]
        error.before = self.trace[first - 1].state if first > 0 else None
        error.model = self.model
        try:
            observer = self.observer
            error.pool = comparable_pool(observer)
            pending = observer.pending_events()
            error.pool_events = None if pending is None else [pool_event(e) for e in pending]
        except Exception as exc:  # a broken pool may not even be observable
            error.unobservable = repr(exc)
        return error


def comparable_pool(observer: Observer) -> Observation:
    """The pool as a picture shows it, with the free queue walked safely."""
    if observer.api_only:
        raise ValueError("the pool shows its state only through calls (api-only)")
    if observer.link_errors():
        raise ValueError("the free queue's links are broken: " + "; ".join(observer.link_errors()))
    return observer.observe()


def short_args(args: tuple[Any, ...]) -> str:
    parts = []
    for a in args:
        if hasattr(a, "request_id"):
            parts.append(f"<request {a.request_id}>")
        elif isinstance(a, bytes):  # a block hash, by the digits that name it in pictures
            parts.append("…" + a[-3:].hex())
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"
