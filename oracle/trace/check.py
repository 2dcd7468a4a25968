"""Checking a trace: each recorded call replayed on the model, the first difference named.

Results, error classes, events, watcher firings and observations are
compared as JSON values, strictly (``true`` is not ``1``), except the usage
fraction (within :data:`~.schema.USAGE_TOLERANCE`), the order of index keys,
and event hashes (compared in their 64-bit integer form).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.model import ACTIONS, OPERATIONS, QUERIES, REFERENCES, ContractBroken, initial_state
from kvpool.model.state import Key, PoolState

from ..core.abstraction import names_refusal, refusal_name, removals_in_order
from ..core.lockstep import Watcher
from ..core.observe import observe_model
from ..events.kinds import hash64
from .read import TraceStep, iter_trace
from .schema import EVENT_FIELDS, OBSERVATION_FIELDS, USAGE_TOLERANCE, Json, is_int, show
from .write import encode_model_result, model_event_to_json, observation_to_json


@dataclass
class StepDivergence:
    """The first step where the trace and the model disagree."""

    line: int
    step: int
    op: str
    diffs: list[str]


@dataclass
class StepContract:
    """The first step at which the recorded caller broke a contract of the pool."""

    line: int
    step: int
    op: str
    contract: str
    message: str


@dataclass
class CheckReport:
    """What :func:`check_trace` found: ``divergence`` and ``contract`` are None when every step agrees.

    ``contract`` is set when the trace's caller broke a contract of the pool
    (:mod:`kvpool.model.contracts`): a verdict about the caller; the replay stops there.
    """

    path: str
    steps: int
    divergence: StepDivergence | None = None
    contract: StepContract | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.contract is None

    def format(self) -> str:
        if self.contract is not None:
            c = self.contract
            return (f"{self.path}:{c.line}: caller broke {c.contract} at step {c.step} ({c.op}); "
                    f"{self.steps - 1} calls agreed before it\n  {c.message}")
        if self.divergence is None:
            return f"{self.path}: ok, {self.steps} calls agree with the model"
        d = self.divergence
        body = "\n  ".join(d.diffs)
        return (f"{self.path}:{d.line}: step {d.step} ({d.op}) differs from the model "
                f"({self.steps - 1} calls agreed before it)\n  {body}")


def canonical_event(e: dict[str, Json]) -> dict[str, Json]:
    """An event's fields, in the schema's order, with hashes in int form (hex bytes' low 64 bits), for
    comparison."""
    spec = EVENT_FIELDS.get(str(e.get("type")), {})
    out: dict[str, Json] = {"type": e.get("type"), **{name: e[name] for name in spec if name in e}}
    if "block_hashes" in out and isinstance(out["block_hashes"], list):
        out["block_hashes"] = [hash64(h) for h in out["block_hashes"]]
    if out.get("parent_block_hash") is not None:
        out["parent_block_hash"] = hash64(out["parent_block_hash"])
    return out


def _strict_equal(a: Json, b: Json) -> bool:
    """JSON equality that does not confuse true with 1."""
    if type(a) is list and type(b) is list and a == b and all(type(x) is int for x in a) and all(
            type(y) is int for y in b):
        return True  # lists of plain ints (token ids, block ids): equal at once
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_strict_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return False
    return type(a) is type(b) and a == b if not (_is_num(a) and _is_num(b)) else a == b


def _is_num(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and not isinstance(v, bool)


def _event_diffs(where: str, recorded: list[dict[str, Json]], model: list[dict[str, Json]]) -> list[str]:
    rec = removals_in_order([canonical_event(e) for e in recorded])
    mod = removals_in_order([canonical_event(e) for e in model])
    out = []
    for i, (r, m) in enumerate(zip(rec, mod, strict=False)):
        if r.get("type") != m.get("type"):
            out.append(f"{where}[{i}]: recorded {r['type']}, model {m['type']}")
            continue
        for name in m:  # a field the trace leaves out (an optional one) is not compared
            if name in r and not _strict_equal(r[name], m[name]):
                out.append(f"{where}[{i}].{name}: recorded {show(r[name])}, model {show(m[name])}")
    if len(rec) != len(mod):
        out.append(f"{where}: recorded {len(rec)} event(s), model {len(mod)}; "
                   f"model's: {[e['type'] for e in mod]}")
    return out


def observation_diffs(recorded: dict[str, Json], model: dict[str, Json]) -> list[str]:
    out = []
    for name in OBSERVATION_FIELDS:
        if name not in recorded:  # not shown by the pool that recorded the trace
            continue
        r, m = recorded[name], model[name]
        if name == "primary" and isinstance(r, list) and isinstance(m, list):
            m = [q if p is None or q is None or p[1] is not None else [q[0], None]
                 for p, q in zip(r, m, strict=False)] + m[len(r):]
        if name == "index":  # key order is not significant; per-key block order is
            r = dict(sorted((k, v) for k, v in r))
            m = dict(sorted((k, v) for k, v in m))
        if not _strict_equal(r, m):
            out.append(f"observation.{name}: recorded {show(r)}, model {show(m)}")
    return out


def model_call(state: PoolState, step: TraceStep, watchers: dict[str, Watcher],
               log: list[tuple[str, int]]) -> tuple[PoolState, Any, BaseException | None]:
    """One trace line's call on the model (in place); watchers by name.  The model's refusal is
    returned as the error, like the pool's."""
    args = dict(step.args)
    if "on_reuse" in args:
        name = args["on_reuse"]
        args["on_reuse"] = watchers.setdefault(name, Watcher(name, log))
    try:
        if step.op in ACTIONS:
            new, result = ACTIONS[step.op](state, **args)
            return new, result, None
        return state, QUERIES[step.op](state, **args), None
    except Exception as exc:  # the model refusing the call (or recursing) is a result, like the pool's
        return state, None, exc


@dataclass
class Expected:
    """What the model says a call's line must hold: its refusal, result, events and watchers fired."""

    error: BaseException | None
    result: Json
    events: list[dict[str, Json]]
    fired: list[list[Json]]


def expected_of(op: str, after: PoolState, result: Any, error: BaseException | None,
                name: Callable[[Any], str] = lambda w: str(w.name)) -> Expected:
    """The model's outcome of one call, as a trace line writes it (``name``: a watcher's name)."""
    if error is not None:
        return Expected(error, None, [], [])
    events = [] if op == "take_events" else [model_event_to_json(e) for e in after.out.events]
    return Expected(None, encode_model_result(op, result), events,
                    [[name(w), b] for w, b in after.out.fired])


def outcome_diffs(step: TraceStep, expected: Expected, *, vllm_errors: bool = False) -> list[str]:
    """Every difference between one recorded call (but its observation) and the model's outcome."""
    diffs: list[str] = []
    error = expected.error
    if not names_refusal(step.error, error, vllm_errors=vllm_errors):
        m_error = refusal_name(error) if error is not None else None
        diffs.append(f"error: recorded {step.error}, model {m_error}"
                     + (f" ({error})" if error is not None else ""))
    if error is None and step.error is None:  # a call only one side refused has no result to compare
        m_result = expected.result
        if type(step.result) is type(m_result) and step.result == m_result:
            same = True  # the reader took each value as its kind: equal values are strictly equal
        elif step.op == "get_usage" and _is_num(step.result):
            same = math.isclose(step.result, m_result, rel_tol=0, abs_tol=USAGE_TOLERANCE)
        elif step.op == "take_events":
            diffs += _event_diffs("result", step.result, m_result)
            same = True
        else:
            same = _strict_equal(step.result, m_result)
        if not same:
            diffs.append(f"result: recorded {show(step.result)}, model {show(m_result)}")
    if step.events is not None and (step.events or expected.events):  # null: events not shown
        diffs += _event_diffs("events", step.events, expected.events)
    if step.fired is not None and not _strict_equal(step.fired, expected.fired):
        diffs.append(f"fired: recorded {show(step.fired)}, model {show(expected.fired)}")
    return diffs


def compare_step(step: TraceStep, after: PoolState, result: Any,
                 error: BaseException | None, *, vllm_errors: bool = False) -> list[str]:
    """Every difference between one recorded call and the model's run of it."""
    diffs = outcome_diffs(step, expected_of(step.op, after, result, error), vllm_errors=vllm_errors)
    if step.observation is not None:
        diffs += observation_diffs(step.observation, observation_to_json(observe_model(after)))
    return diffs


def check_trace(path: str | Path, *, vllm_errors: bool = False,
                on_step: Callable[[TraceStep, PoolState], None] | None = None) -> CheckReport:
    """Replay a trace on the model; report the first call that differs.

    ``vllm_errors`` (or the header's) accepts vLLM's plain ``ValueError`` where
    the model raises ``NotEnoughFreeBlocksError``.  ``on_step`` is called with
    each call that agrees and the model's state after it (what the pool holds
    then), in order, up to the first difference.  Raises :class:`TraceError`
    on a bad file.
    """
    steps = agreeing_steps(path, vllm_errors=vllm_errors)
    while True:
        try:
            step, state, _keys = next(steps)
        except StopIteration as done:
            report: CheckReport = done.value
            return report
        if on_step is not None:
            on_step(step, state)


def agreeing_steps(path: str | Path, *, vllm_errors: bool = False, footprints: bool = False,
                   ) -> Generator[tuple[TraceStep, PoolState, frozenset[Key]], None, CheckReport]:
    """The trace's calls that agree with the model, each with the model's state after it, as
    they are read; the generator's value is the :func:`check_trace` report.

    With ``footprints``, each comes with the keys its declaration says it may
    change (computed before the call, at its cost), so that a reader of the
    pool's index follows it without walking the index.
    """
    h, steps = iter_trace(path)
    vllm_errors = vllm_errors or h.vllm_errors
    state = initial_state(h.num_blocks, h.enable_caching, h.hash_block_size,
                          h.enable_kv_cache_events, h.medium,
                          **REFERENCES[h.reference])
    watchers: dict[str, Watcher] = {}
    log: list[tuple[str, int]] = []
    number = 0
    for number, step in enumerate(steps, start=1):
        keys = _footprint_keys(state, step) if footprints else frozenset()
        new, result, error = model_call(state, step, watchers, log)
        if isinstance(error, ContractBroken):
            return CheckReport(str(path), number, contract=StepContract(
                step.line, number, step.op, error.contract, str(error).split(": ", 1)[-1]))
        try:
            diffs = compare_step(step, new, result, error, vllm_errors=vllm_errors)
        except RecursionError:
            diffs = ["value nested too deeply to compare"]
        if diffs:
            return CheckReport(str(path), number, StepDivergence(step.line, number, step.op, diffs))
        yield step, new, keys
        state = new
    return CheckReport(str(path), number)


def _footprint_keys(state: PoolState, step: TraceStep) -> frozenset[Key]:
    """The keys a call may change, by its declaration; none for a query or a call it cannot bind."""
    decl = OPERATIONS.get(step.op)
    if decl is None or decl.role == "query":
        return frozenset()
    try:
        args = {k: (None if k == "on_reuse" else v) for k, v in step.args.items()}
        return decl.footprint(state, *decl.bind((), args)).keys
    except Exception:  # a call the model refuses changes nothing
        return frozenset()


__all__ = ["CheckReport", "Expected", "StepContract", "StepDivergence", "agreeing_steps", "canonical_event",
           "check_trace", "compare_step", "expected_of", "model_call", "observation_diffs",
           "outcome_diffs"]
