"""Recording a trace: a pool running the seeded workload in lockstep with the model, every call kept.

The lockstep compares as it goes, so a recorded run that diverged ends with
the call that diverged, and :func:`~.check.check_trace` on it names the same step.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..core.abstraction import any_value_error, same_refusal, vllm_refusal
from ..core.lockstep import Divergence, Lockstep, Watcher
from ..core.observe import Observation
from ..generate.long_lived import pool_blocks, workload_class
from ..generate.runs import RunConfig
from .schema import DEFAULT_REFERENCE, VERSION, Json
from .write import encode_args, encode_result, event_to_json, observation_to_json


class _Tap:
    """Stands in for a pool: delegates everything, and captures one armed call.

    Lockstep calls the pool's method itself; wrapping the pool is how this
    module sees the pool's own result and error without editing Lockstep.
    """

    def __init__(self, pool: Any):
        self._pool = pool
        self.wrapped = pool  # what the lockstep observes (kvpool.oracle.core.lockstep)
        self._armed: str | None = None
        self.outcome: tuple[Any, BaseException | None] = (None, None)

    def arm(self, op: str) -> None:
        self._armed, self.outcome = op, (None, None)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if name != self._armed:
            return attr
        self._armed = None

        def captured(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attr(*args, **kwargs)
            except Exception as exc:
                self.outcome = (None, exc)
                raise
            self.outcome = (result, None)
            return result

        return captured


class _Tee(list[tuple[str, int]]):
    """A watcher log that also keeps its own copy of this call's firings."""

    def __init__(self, main: list[tuple[str, int]], copy: list[tuple[str, int]]):
        super().__init__()
        self.main, self.mine = main, copy

    def append(self, item: tuple[str, int]) -> None:
        self.main.append(item)
        self.mine.append(item)


@dataclass
class RecordingLockstep(Lockstep):
    """A :class:`Lockstep` that also writes each call, as the pool saw it, to trace lines."""

    lines: list[dict[str, Json]] = field(default_factory=list)
    """The lines written so far, unless they go to ``sink`` as they are made."""
    keep_observations: bool = True
    fired_now: list[tuple[str, int]] = field(default_factory=list)
    sink: Callable[[dict[str, Json]], None] | None = None
    """Where each line goes as it is made (None: kept in ``lines``)."""
    written: int = 0
    request_form: Callable[[Any], Json] | None = None
    """How a request argument is written (None: whole, as the trace format has it)."""

    def watcher(self, name: str) -> Watcher:
        return Watcher(name, _Tee(self.fired, self.fired_now))

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        tap: _Tap = self.pool
        line: dict[str, Json] = {"op": op, "args": encode_args(op, args, kwargs, self.request_form)}
        pending = self.observer.pending_events()
        queued = len(pending) if pending is not None else 0
        self.fired_now.clear()
        tap.arm(op)
        try:
            return super().call(op, *args, **kwargs)
        finally:
            result, error = tap.outcome
            line["result"] = None if error else encode_result(op, result)
            line["error"] = type(error).__name__ if error else None  # the pool's own class
            pending = self.observer.pending_events()
            line["events"] = (None if pending is None else [] if op == "take_events"
                              else [event_to_json(e) for e in pending[queued:]])
            line["fired"] = [[n, b] for n, b in self.fired_now]
            if self.keep_observations and not self.observer.api_only:  # calls show it, as lines
                line["observation"] = observation_to_json(
                    self.observe(self.observer.pool, ()) if self.observe is not None
                    else self.observer.observe())
            self.written += 1
            (self.sink or self.lines.append)(line)


@dataclass
class Recording:
    """A recorded run: the trace lines (unless written as they were made), and the lockstep
    divergence if there was one."""

    header: dict[str, Json]
    lines: list[dict[str, Json]]
    divergence: str | None
    calls: int = -1
    """How many calls were recorded (``len(lines)`` unless they were streamed to a file)."""

    def __post_init__(self) -> None:
        if self.calls < 0:
            self.calls = len(self.lines)

    def write(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as out:
            for obj in [self.header, *self.lines]:
                out.write(_line(obj))


def _line(obj: dict[str, Json]) -> str:
    return _ENCODE(obj) + "\n"


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""One encoder for every line (``json.dumps`` with options makes one per call)."""


def recording_pair(
    pool_factory: Callable[..., Any], num_blocks: int, caching: bool, hash_block_size: int,
    events: bool, *, reference: str = DEFAULT_REFERENCE,
    block_sizes: dict[int, int] | None = None, meta: dict[str, Json] | None = None,
) -> tuple[RecordingLockstep, dict[str, Json]]:
    """A fresh recording lockstep pair and the trace header that describes it.

    For hand-written scenarios: call ``pair.call(op, ...)`` and write
    ``Recording(header, pair.lines, None)``.
    """
    pair = cast(RecordingLockstep, RecordingLockstep.fresh(
        lambda *a, **k: _Tap(pool_factory(*a, **k)), num_blocks, caching, hash_block_size, events, reference))
    header: dict[str, Json] = {
        "kvpool_trace": VERSION, "num_blocks": num_blocks, "enable_caching": caching,
        "hash_block_size": hash_block_size, "enable_kv_cache_events": events,
        "medium": getattr(pair.pool, "medium", "GPU"), "reference": reference}
    if block_sizes:
        header["block_sizes"] = {str(g): n for g, n in block_sizes.items()}
    if meta:
        header["meta"] = meta
    return pair, header


def record(pool_factory: Callable[..., Any], seed: int, steps: int, *, misuse: bool = True,
           observe: bool = True,
           errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
           reference: str = DEFAULT_REFERENCE,
           observe_pool: Callable[..., Observation] | None = None,
           vllm_errors: bool = False, path: str | Path | None = None,
           blocks: int | None = None, long_lived: bool = False) -> Recording:
    """Run the seeded workload (as ``campaign.run_one``) and keep every call as a trace line.

    A divergence stops the run; the trace then ends with the call that
    diverged, so ``check_trace`` on it names the same step.  ``observe_pool``
    replaces the default observation of the pool (an adapter's).  With
    ``path`` each line is written there as it is made (memory independent of
    the run's length) and the recording keeps none.  ``blocks`` and ``long_lived`` are the
    pool's size and life, as in ``campaign.run_one``.
    """
    rng = random.Random(seed)
    cfg = RunConfig.draw(rng, blocks=pool_blocks(seed, blocks, long_lived))
    pair, header = recording_pair(
        pool_factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events,
        reference=reference, block_sizes=cfg.block_sizes,
        meta={"seed": seed, "steps": steps, "pool": _name(pool_factory), "misuse": misuse,
              **({"long_lived": True} if long_lived else {})})
    pair.errors_match = errors_match
    if vllm_errors or errors_match in (vllm_refusal, any_value_error):  # check-trace: as recorded
        header["vllm_errors"] = True
    pair.keep_observations = observe
    if observe_pool is not None:
        pair.observe = observe_pool
    work = workload_class(long_lived)(rng, cfg, pair, misuse_on=misuse)
    divergence = None
    with contextlib.ExitStack() as stack:
        if path is not None:
            out = stack.enter_context(open(path, "w", encoding="utf-8"))
            out.write(_line(header))
            def sink(line: dict[str, Json]) -> None:
                out.write(_line(line))

            pair.sink = sink
        try:
            for _ in range(steps):
                work.step()
            pair.check()
        except Divergence as exc:
            divergence = str(exc)
    return Recording(header, pair.lines, divergence, pair.written)


def record_adapter(adapter: Any, seed: int, steps: int, *, observe: bool = True,
                   reference: str = DEFAULT_REFERENCE, misuse: bool | None = None,
                   path: str | Path | None = None, blocks: int | None = None,
                   long_lived: bool = False) -> Recording:
    """:func:`record` through an ``oracle.core.adapter.Adapter``: its constructor, observation,
    error pairing and misuse setting (``misuse`` None: whatever the adapter supports)."""

    def factory(num_blocks: int, caching: bool, hash_block_size: int,
                enable_kv_cache_events: bool = False) -> Any:
        return adapter.construct(num_blocks, caching, hash_block_size, enable_kv_cache_events)

    factory.__qualname__ = str(getattr(adapter, "name", "adapter"))
    supported = bool(adapter.supports_misuse)
    return record(factory, seed, steps, misuse=supported if misuse is None else misuse and supported,
                  observe=observe, errors_match=adapter.errors_match, reference=reference,
                  observe_pool=getattr(adapter, "observe", None),
                  vllm_errors=getattr(adapter, "matcher", None) in (vllm_refusal, any_value_error),
                  path=path, blocks=blocks, long_lived=long_lived)


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


__all__ = ["Recording", "RecordingLockstep", "record", "record_adapter", "recording_pair"]
