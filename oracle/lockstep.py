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

from kvpool.impl.errors import NotEnoughFreeBlocksError
from kvpool.impl.events import event_fields
from kvpool.model import ACTIONS, QUERIES, REFERENCES, initial_state, violated
from kvpool.model.state import PoolState

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


def same_error_type(model_error: Exception, pool_error: Exception | None) -> bool:
    """Strict matching: the pool raised exactly the model's error class."""
    return type(model_error) is type(pool_error)


def vllm_errors_match(model_error: Exception, pool_error: Exception | None) -> bool:
    """vLLM raises a plain ``ValueError`` (same message) when it runs out of blocks."""
    if isinstance(model_error, NotEnoughFreeBlocksError):
        return type(pool_error) in (ValueError, NotEnoughFreeBlocksError) and str(
            model_error) == str(pool_error)
    return same_error_type(model_error, pool_error)


class Divergence(AssertionError):
    """The pool and the model disagree; the message says where.

    ``steps`` holds the last calls with a picture of the pool after each
    (the schema of ``kvpool/VERIFY_SCHEMA.md``'s TraceStep).
    """

    steps: list[dict[str, Any]]

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.steps = []


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


PICTURED = 12
"""How many of the last steps a divergence reports, with a picture of the pool each."""


@dataclass
class Lockstep:
    """The model and a pool side by side; ``call`` runs one operation on both."""

    pool: Any
    model: PoolState
    foreign: Any = None  # a block of no pool, to stand for out-of-range ids
    fired: list[tuple[str, int]] = field(default_factory=list)
    errors_match: Callable[[Exception, Exception | None], bool] = same_error_type
    """How a refusal of the pool is matched with the model's (default: same type)."""
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
        outcome = type(m_error).__name__ if m_error else repr(m_result)
        self.trace.append(Step(op, tuple(list(a) if isinstance(a, list) else a for a in args),
                               outcome, type(m_error).__name__ if m_error else None, m_state))
        if len(self.trace) > PICTURED + 1:  # one more: the state before the first shown step
            self.trace[-PICTURED - 2].state = None
        if (m_error is None) != (p_error is None) or (
            m_error and not self.errors_match(m_error, p_error)
        ):
            raise self._diverged(op, f"model raised {m_error!r}, pool raised {p_error!r}")
        if m_error is None:
            if op in RETURNS_BLOCKS and p_result is not None:
                p_result = [b.block_id for b in p_result]
            if op == "take_events":
                m_result = [event_fields(e) for e in m_result]
                p_result = [event_fields(e) for e in p_result]
            if m_result != p_result:
                raise self._diverged(op, f"model returned {m_result!r}, pool {p_result!r}")
        self.model = m_state
        self.check()
        predicted = [(w.name, b) for w, b in self.model.fired[before_fired:]]
        seen, self.fired[:] = list(self.fired), []
        if predicted != seen:
            raise self._diverged(op, f"watchers: model fired {predicted}, pool fired {seen}")
        return m_error if m_error else m_result

    def check(self) -> None:
        """Compare observations and check every invariant of the model."""
        broken = violated(self.model)
        if broken:
            raise self._diverged("invariants", "model state breaks " + ", ".join(broken))
        diff = observe_model(self.model).diff(self.observe(self.pool))
        diff += free_queue_link_errors(self.pool.free_block_queue)
        pending = self.pool.kv_event_queue
        if len(pending) != len(self.model.events) or any(
            event_fields(m) != event_fields(p) for m, p in zip(self.model.events, pending, strict=True)
        ):
            diff.append(f"pending events: model {list(self.model.events)} != pool {pending}")
        if diff:
            raise self._diverged("observation", "; ".join(diff))

    def _diverged(self, where: str, what: str) -> Divergence:
        first = max(0, len(self.trace) - PICTURED)
        lines = [f"step {i + 1}: {s.op}{_short(s.args)} -> {s.outcome}"
                 for i, s in enumerate(self.trace[first:], start=first)]
        error = Divergence(f"{where}: {what}\nlast steps:\n  " + "\n  ".join(lines))
        error.steps = self._pictured_steps(first)
        return error

    def _pictured_steps(self, first: int) -> list[dict[str, Any]]:
        """The last steps as the verify report shows them (``kvpool/VERIFY_SCHEMA.md``)."""
        from kvpool.pictures import (
            describe_events,
            event_names,
            picture_changes,
            picture_differences,
            picture_of_observation,
            picture_of_state,
        )

        previous = self.trace[first - 1].state if first > 0 else None
        before = picture_of_state(previous) if previous is not None else None
        out: list[dict[str, Any]] = []
        for number, step in enumerate(self.trace[first:], start=first + 1):
            state = step.state if step.state is not None or number < len(self.trace) else self.model
            picture = picture_of_state(state) if state is not None else None
            out.append({"index": number, "call": f"{step.op}{_short(step.args)}",
                        "outcome": step.outcome,
                        "changes": picture_changes(before, picture) if before and picture else [],
                        "picture": picture, "pool_picture": None, "differs": []})
            before = picture
        if not out:  # diverged before the first call: the pools differ as built
            out.append({"index": 0, "call": "(the pool as constructed)", "outcome": "",
                        "changes": [], "picture": picture_of_state(self.model),
                        "pool_picture": None, "differs": []})
        if out[-1]["picture"] is not None:
            last = self.trace[-1].state if self.trace and self.trace[-1].state else self.model
            try:
                known = event_names(last)
                pending = getattr(self.pool, "kv_event_queue", None)
                pool = picture_of_observation(
                    self.observe(self.pool), events=None if pending is None else describe_events(
                        pending, known))
            except Exception as exc:  # a broken pool may not even be observable
                out[-1]["changes"].append(f"the pool could not be observed: {exc!r}")
            else:
                out[-1]["pool_picture"] = pool
                out[-1]["differs"] = picture_differences(out[-1]["picture"], pool)
        return out


def _short(args: tuple[Any, ...]) -> str:
    parts = []
    for a in args:
        if hasattr(a, "request_id"):
            parts.append(f"<request {a.request_id}>")
        elif isinstance(a, bytes):  # a block hash, by the digits that name it in pictures
            parts.append("…" + a[-3:].hex())
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"
