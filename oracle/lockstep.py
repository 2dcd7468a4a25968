"""Drive the model and a pool with the same calls and compare after each one.

Arguments name blocks by id; :class:`Lockstep` hands the model ids and the
pool its block objects, then checks that both returned the same result (or
raised the same error type), that their observations agree, that every
model invariant holds, and that they emitted the same events and fired the
same reuse watchers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import ACTIONS, QUERIES, REFERENCES, initial_state, violated
from kvpool.model.state import PoolState

from .abstraction import event_differences, key_of, pool_event, refusal_name, same_refusal
from .observe import Observation, free_queue_link_errors, observe_model, observe_pool

# Which positional arguments name blocks: "one" a single id, "many" a list.
BLOCK_ARGS: dict[str, dict[int, str]] = {
    "free_blocks": {0: "many"},
    "touch": {0: "many"},
    "unpin_blocks": {0: "many"},
    "cache_full_blocks": {1: "many"},
    "cache_partial_block": {1: "one"},
    "move_block_hashes": {0: "one", 1: "one"},
    "is_block_writable": {0: "one"},
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


@dataclass
class Lockstep:
    """The model and a pool side by side; ``call`` runs one operation on both."""

    pool: Any
    model: PoolState
    foreign: Any = None  # a block of no pool, to stand for out-of-range ids
    fired: list[tuple[str, int]] = field(default_factory=list)
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal
    """How a refusal of the pool is matched with the model's (default: the same kind)."""
    trace: list[Step] = field(default_factory=list)
    steps: int = 0
    observe: Callable[[Any], Observation] = observe_pool
    """How the pool is observed (an adapter may supply its own)."""

    @classmethod
    def fresh(
        cls, pool_factory: Callable[..., Any], num_blocks: int, caching: bool,
        hash_block_size: int, events: bool, reference: str = "0.31",
    ) -> Lockstep:
        """A new pool and the model configured alike, for vLLM ``reference``'s behaviour."""
        pool = pool_factory(num_blocks, caching, hash_block_size, enable_kv_cache_events=events)
        model = initial_state(num_blocks, caching, hash_block_size, events,
                              null_counted=REFERENCES[reference])
        return cls(pool=pool, model=model, foreign=type(pool.blocks[0])(num_blocks))

    def watcher(self, name: str) -> Watcher:
        return Watcher(name, self.fired)

    def _block(self, block_id: Any) -> Any:
        if isinstance(block_id, int) and 0 <= block_id < len(self.pool.blocks):
            return self.pool.blocks[block_id]
        return self.foreign

    def _pool_args(self, op: str, args: Sequence[Any]) -> list[Any]:
        out = list(args)
        for pos, kind in BLOCK_ARGS.get(op, {}).items():
            if kind == "one":
                out[pos] = self._block(args[pos])
            else:
                out[pos] = [self._block(b) for b in args[pos]]
        return out

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on both sides; raise :class:`Divergence` on any difference."""
        self.steps += 1
        before_fired = len(self.model.fired)
        model_fn = ACTIONS.get(op)
        query = model_fn is None
        try:
            if query:
                m_result, m_state = QUERIES[op](self.model, *args, **kwargs), self.model
            else:
                m_state, m_result = model_fn(self.model, *args, **kwargs)  # type: ignore[misc]
            m_error = None
        except Exception as exc:
            m_error, m_result, m_state = exc, None, self.model
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
            raise self._diverged(op, f"model raised {m_error!r}, pool raised {p_error!r}", ["refusal"])
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
                raise self._diverged(op, f"model returned {m_result!r}, pool {p_result!r}", ["result"])
        self.model = m_state
        self.check()
        predicted = [(w.name, b) for w, b in self.model.fired[before_fired:]]
        seen, self.fired[:] = list(self.fired), []
        if predicted != seen:
            raise self._diverged(op, f"watchers: model fired {predicted}, pool fired {seen}",
                                 ["watchers"])
        return m_error if m_error else m_result

    def check(self) -> None:
        """Compare observations and check every invariant of the model."""
        broken = violated(self.model)
        if broken:
            raise self._diverged("invariants", "model state breaks " + ", ".join(broken), broken)
        mine, theirs = observe_model(self.model), self.observe(self.pool)
        diff = mine.diff(theirs)
        parts = [name for name in Observation.__slots__ if getattr(mine, name) != getattr(theirs, name)]
        links = free_queue_link_errors(self.pool.free_block_queue)
        events = event_differences(self.model.events, self.pool.kv_event_queue)
        diff += links + [f"pending {d}" for d in events]
        parts += ["free queue links"] * bool(links) + ["pending events"] * bool(events)
        if diff:
            raise self._diverged("observation", "; ".join(diff), parts)

    def _diverged(self, where: str, what: str, parts: list[str]) -> Divergence:
        first = max(0, len(self.trace) - PICTURED)
        lines = [f"step {i + 1}: {s.op}{short_args(s.args)} -> {s.outcome}"
                 for i, s in enumerate(self.trace[first:], start=first)]
        error = Divergence(f"{where}: {what}\nlast steps:\n  " + "\n  ".join(lines))
        error.parts = list(dict.fromkeys(parts))
        error.first, error.record = first, self.trace[first:]
        error.before = self.trace[first - 1].state if first > 0 else None
        error.model = self.model
        try:
            error.pool = self.observe(self.pool)
            pending = getattr(self.pool, "kv_event_queue", None)
            error.pool_events = None if pending is None else [pool_event(e) for e in pending]
        except Exception as exc:  # a broken pool may not even be observable
            error.unobservable = repr(exc)
        return error


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
