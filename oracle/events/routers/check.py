"""A router profile against the pool: after every call, its prefix answers against what the pool serves.

On a trace, the model replays every call (:func:`~kvpool.oracle.trace.check_trace`),
so after each call the pool's index is known: the observation's when the line
has one, else the model's state.  The profile reads the same events a router
would (the calls' events, and the offload caller's own announcement of each
``_insert_block_hash``); every request the trace names is a prefix query, in
each KV-cache group it was cached in.  After each call that changed the
events or the index, each query is asked of both; a difference is an
*over-claim* (the router believes more leading blocks held than the pool
serves: a request routed there misses) or an *under-claim* (fewer: a hit is
given away).  Each difference is reported once, at the call after which it
appears, with the rule that made the router's index wrong and the call whose
event applied it.

On a bare event stream no query has an answer; only what the profile cannot
index as meant is reported (dropped stores, inputs it cannot handle, clears it
ignores), and what the stream cannot tell anyone (a store of a stored key is a
re-announced hit or a second copy: the profile reads it as one of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.model.request import hashes_at
from kvpool.model.state import PoolState

from ...trace import CheckReport, TraceStep, check_trace
from ...trace.read import iter_trace
from ..facts import pool_copies, step_events
from ..kinds import hash64
from .base import Cause, Profile, Query, Reaction, Rule

Copies = dict[tuple[int, int], int]
Factory = Callable[[dict[int, int]], Profile]

_CACHING_OPS = ("cache_full_blocks", "cache_partial_block", "emit_cached_block_events")
"""Calls that name a request, its group and the group's block size: each names a query."""


@dataclass(frozen=True)
class Difference:
    """A query the profile answers otherwise than the pool serves, from the call it appeared after."""

    kind: str  # "over-claim" | "under-claim"
    line: int
    op: str
    query: str
    group: int
    predicted: int
    served: int
    block: int
    cause: Cause
    cause_op: str | None


@dataclass
class RouterReport:
    """One profile's verdict on one file."""

    profile: str
    path: str
    lines: int = 0
    events: int = 0
    queries: int = 0
    over: int = 0
    """Queries answered with more leading blocks than the pool serves."""
    under: int = 0
    differences: list[Difference] = field(default_factory=list)
    reactions: list[tuple[Reaction, str | None]] = field(default_factory=list)
    """What the profile did not index as meant, with the call that emitted the event."""
    repeated_stores: int | None = None
    """(A bare stream.)  Stores of a key the stream holds: a re-announced hit or a second copy.
    On a trace, ``kvpool check-events`` tells them apart (``reannounced-hit``, ``second-copy``)."""
    stopped: str | None = None
    """Why the comparison ended before the file did (the trace left the model)."""
    note: str | None = None
    rules: dict[str, Rule] = field(default_factory=dict)
    """The profile's rules, by id: what each does and the source it follows."""
    unjudged: int = 0
    """Reactions to events that rest on what the reading could not see (after lost batches): not
    reported, the profile lacking what the real router holds."""
    reacted: int = 0
    """Reactions handed to a live sink rather than kept in ``reactions``."""

    @property
    def ok(self) -> bool:
        return not self.differences and not self.reactions and not self.reacted

    def format(self, limit: int = 50) -> str:
        if self.queries or self.stopped is not None or self.note is None:
            head = (f"{self.path}: router {self.profile}: {self.queries} prefix queries after "
                    f"{self.lines} call(s): {self.over} over-claim(s), {self.under} under-claim(s), "
                    f"{len(self.differences)} difference(s) reported at their line; "
                    f"{len(self.reactions)} input(s) not indexed as meant")
        else:
            head = (f"{self.path}: router {self.profile}: {self.events} event(s), "
                    f"{len(self.reactions)} input(s) not indexed as meant")
        if self.unjudged:
            head += f"; {self.unjudged} not judged (events after lost batches)"
        lines = [head]
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.stopped:
            lines.append(f"  stopped: {self.stopped}")
        items = [((r.position.line, r.position.index or 0), f"{self.path}:{r.position.line}: "
                  f"{r.position}{_op(op)}: {r.kind} [{r.rule}] {r.message}") for r, op in self.reactions]
        items += [((d.line, 1 << 30), (
            f"{self.path}:{d.line}: after {d.op}: {d.kind} of {d.query} (group {d.group}): router "
            f"{d.predicted} block(s), pool serves {d.served}; block {d.block}: [{d.cause.rule}] "
            f"{d.cause.detail}"
            + ("" if d.cause.position is None else f"; applied at {d.cause.position}{_op(d.cause_op)}")))
            for d in self.differences]
        items.sort(key=lambda x: x[0])
        lines += [text for _, text in items[:limit]]
        if len(items) > limit:
            lines.append(f"... and {len(items) - limit} more")
        named = sorted({r.rule for r, _ in self.reactions} | {d.cause.rule for d in self.differences})
        if named:
            lines.append("  rules named above, and the source each follows:")
            lines += [f"    {rule}: {self.rules[rule].does} [{self.rules[rule].source}]"
                      if rule in self.rules else f"    {rule}" for rule in named]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile, "file": self.path, "ok": self.ok, "lines": self.lines,
            "events": self.events, "queries": self.queries, "over_claims": self.over,
            "under_claims": self.under, "repeated_stores": self.repeated_stores,
            "stopped": self.stopped, "note": self.note, "unjudged": self.unjudged,
            "differences": [{
                "kind": d.kind, "line": d.line, "op": d.op, "query": d.query, "group": d.group,
                "predicted": d.predicted, "served": d.served, "block": d.block, "rule": d.cause.rule,
                "detail": d.cause.detail,
                "cause_line": None if d.cause.position is None else d.cause.position.line,
                "cause_event": None if d.cause.position is None else d.cause.position.index,
                "cause_op": d.cause_op} for d in self.differences],
            "reactions": [{"kind": r.kind, "rule": r.rule, "line": r.position.line,
                           "event": r.position.index, "op": op, "message": r.message}
                          for r, op in self.reactions],
            "rules": {r.id: {"does": r.does, "source": r.source} for r in self.rules.values()},
        }


def _op(op: str | None) -> str:
    return "" if op is None else f" ({op})"


def query_of(request: Any, group: int, block_size: int, hash_block_size: int) -> Query:
    """The prefix query a request names in one group: its full blocks and their keys."""
    hashes = tuple(int(hash64(h)) for h in hashes_at(request, hash_block_size, block_size))
    lora = request.lora_request.lora_name if request.lora_request else None
    mm = tuple((f.identifier, f.mm_position.offset, f.mm_position.length)
               for f in request.mm_features or ())
    return Query(request.request_id, group, block_size,
                 tuple(request.all_token_ids[:len(hashes) * block_size]), hashes, lora, mm)


class RouterCheck:
    """Feeds one profile a trace call by call and compares its answers with the pool's index."""

    def __init__(self, factory: Factory, name: str, path: str, block_sizes: dict[int, int] | None):
        self.factory = factory
        self.report = RouterReport(name, path)
        self.declared = dict(block_sizes or {})
        self.learned: dict[int, int] = {}
        self.profile: Profile | None = None
        self.queries: dict[tuple[str, int], Query] = {}
        self.verdicts: dict[tuple[str, int], str] = {}
        self.ops: dict[int, str] = {}
        self.last: Copies | None = None

    def _profile(self) -> Profile:
        if self.profile is None:
            self.profile = self.factory({**self.learned, **self.declared})
            self.report.rules = dict(self.profile.rules)
        return self.profile

    def step(self, step: TraceStep, state: PoolState) -> None:
        """One call that agreed with the model, and the model's state after it."""
        self.report.lines += 1
        self.ops[step.line] = step.op
        changed = self._register(step, state)
        events = step_events(step, state.hash_block_size, state.events_on)
        if events:
            profile = self._profile()
            for pos, event in events:
                self.report.events += 1
                self.report.reactions += [(r, step.op) for r in profile.feed(event, pos)]
            changed = True
        copies = pool_copies(step, state)
        if copies != self.last:
            self.last, changed = copies, True
        if changed and self.queries:
            self._compare(step, copies)

    def _register(self, step: TraceStep, state: PoolState) -> bool:
        if step.op not in _CACHING_OPS or step.error is not None:
            return False
        args = step.args
        group, size = args["kv_cache_group_id"], args["block_size"]
        if size <= 0 or size % state.hash_block_size:
            return False
        self.learned.setdefault(group, size)
        query = query_of(args["request"], group, size, state.hash_block_size)
        key = (query.name, group)
        if self.queries.get(key) == query:
            return False
        self.queries[key] = query
        return True

    def _compare(self, step: TraceStep, copies: Copies) -> None:
        profile = self._profile()
        for key, query in self.queries.items():
            if not profile.answers(query.group) or not query.hashes:
                continue
            self.report.queries += 1
            predicted, truth = profile.prefix(query), query.leading(lambda key: copies.get(key, 0) > 0)
            kind = "over-claim" if predicted > truth else "under-claim" if predicted < truth else ""
            self.report.over += kind == "over-claim"
            self.report.under += kind == "under-claim"
            if kind and self.verdicts.get(key) != kind:
                block = min(predicted, truth)
                cause = profile.explain(query, block, held=kind == "over-claim")
                cause_op = None if cause.position is None else self.ops.get(cause.position.line)
                self.report.differences.append(Difference(
                    kind, step.line, step.op, query.name, query.group, predicted, truth, block, cause,
                    cause_op))
            self.verdicts[key] = kind

    def finish(self, result: CheckReport) -> RouterReport:
        """Close the report with the trace check's result (where the replay stopped, if it did)."""
        if result.contract is not None:
            self.report.stopped = (f"line {result.contract.line}: the trace's caller broke "
                                   f"{result.contract.contract}; no call after it is compared")
        elif result.divergence is not None:
            self.report.stopped = (f"line {result.divergence.line}: the trace differs from the model; "
                                   "no call from it on is compared")
        self._profile()  # made once, so that the report names its rules
        return self.report


def check_trace_routers(path: str | Path, factories: Sequence[tuple[str, Factory]], *,
                        vllm_errors: bool = False) -> tuple[CheckReport, list[RouterReport]]:
    """Replay a trace on the model once, with every profile in ``factories`` reading along."""
    header, _ = iter_trace(path)  # a bad header raises here what check_trace would
    checks = [RouterCheck(factory, name, str(path), header.block_sizes) for name, factory in factories]

    def on_step(step: TraceStep, state: PoolState) -> None:
        for c in checks:
            c.step(step, state)

    result = check_trace(path, vllm_errors=vllm_errors, on_step=on_step)
    reports = [c.finish(result) for c in checks]
    if not header.enable_kv_cache_events:
        for r in reports:
            r.note = "the trace has KV events off: a router learns nothing from it"
    return result, reports
