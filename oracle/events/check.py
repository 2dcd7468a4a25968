"""Check a KV-event file the way a router that rebuilds the prefix index reads it.

A router (vLLM's KV-aware routing, llm-d, Dynamo) never sees the pool: it
sees ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` and keeps, per
``(block hash, group)``, how many stored copies a worker holds.  The stream is
useful only if that count can be kept without guessing.  The rules and the
warnings are :class:`~.online.StreamChecker`'s (the one implementation, fed
event by event, here from a file and in ``kvpool watch`` from the wire);
:mod:`.kinds` names them all.  The rules:

``event_removals_name_live_keys``
    Broken when a ``BlockRemoved`` names a key with no stored copy left since the last
    ``AllBlocksCleared``: removed before stored, removed twice, or removed
    more often than stored.  (Removes never exceed stores, per key.)
``parent-unknown``
    Broken when a ``BlockStored`` of full blocks names a ``parent_block_hash`` never
    stored in that group since the last ``AllBlocksCleared``.  Partial-entry
    stores (``block_size`` below the group's full block size) are exempt:
    their parent is at the finer ``hash_block_size`` grain and was announced
    only if an earlier partial entry ended exactly there.
``hash-repeated``
    Broken when a ``BlockStored`` names one hash twice, or its own parent.
``event_announcements_match_index``
    (Traces with observations, events on.)  Broken when, after a call, the pool's index
    holds more copies of a key than the stream has stored and not removed:
    a physical copy was never announced, or its removal was announced
    while it stayed.  The router may count *more* than the pool (phantoms,
    counted): ``emit_cached_block_events`` re-announces hits.

What breaks no rule but leaves a router guessing is a positioned warning
(:mod:`.warnings`).  A trace's ``_insert_block_hash`` line stands for its
caller's own ``BlockStored`` of the copied key (vLLM's offload manager appends
one; the pool emits none): the checker announces the key there, as a router
would read it.

``AllBlocksCleared`` empties the router's index; the reference emits it
without removals for the entries it drops, so a router must not expect the
index to be empty before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..trace import FieldError, json_lines, parse_event
from ..trace.read import guarded, iter_trace
from .facts import PoolFacts, index_copies, step_events
from .kinds import Key, Position, Violation
from .online import Facts, StreamChecker
from .reading import Reading
from .routers.check import Factory, RouterReport


@dataclass
class EventsReport:
    """Violations and warnings in stream order, and counts that say how much was read."""

    path: str
    events: int = 0
    violations: list[Violation] = field(default_factory=list)
    reannounced: int = 0
    """Stores of a key that already had a stored copy (a second copy, or a re-announcement)."""
    left_stored: int = 0
    """Keys still stored at the end of the stream."""
    unverified_parents: int = 0
    """One-hash stores with an unannounced parent that may be partial entries (sizes unknown)."""
    empty_stores: int = 0
    """BlockStored events with no hash (every block of the range was null or masked)."""
    token_mismatches: int = 0
    """BlockStored events whose token_ids do not fill block_size per hash."""
    snapshots: int = 0
    """Trace lines whose observed index was compared with the router's."""
    phantoms: int = 0
    """At the last compared line, keys the router counts more copies of than the pool holds."""
    unjudged: int = 0
    """Removals and parents naming keys the checker could not see (before a horizon, or forgotten)."""
    warnings: list[Violation] = field(default_factory=list)
    """Events that break no rule but leave a router guessing (:mod:`.warnings`), in order."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @classmethod
    def of(cls, path: str, checker: StreamChecker) -> EventsReport:
        """The report of a checker that read the whole stream (and was finished)."""
        return cls(path, checker.events, _in_order(checker.violations), warnings=_in_order(checker.warnings),
                   **{name: getattr(checker, name) for name in COUNTS})

    def format(self, limit: int = 50) -> str:
        head = (f"{self.path}: {self.events} events, {len(self.violations)} violation(s); "
                f"not checkable: {self.reannounced} store(s) of already-stored keys, "
                f"{self.unverified_parents} unverified partial-entry parent(s), "
                f"{self.empty_stores} empty store(s), {self.token_mismatches} store(s) with "
                f"token_ids not filling their blocks"
                + (f", {self.unjudged} removal(s) or parent(s) of keys not seen" if self.unjudged else "")
                + f"; {self.left_stored} key(s) stored at the end"
                + (f"; compared with the pool's index at {self.snapshots} line(s), {self.phantoms} "
                   "phantom key(s) at the last" if self.snapshots else ""))
        lines = [f"{self.path}:{v.position.line}: {v.position}: [{v.rule}] {v.message}"
                 for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more")
        if self.warnings:
            head += f"; {len(self.warnings)} warning(s)"
            lines += [f"{self.path}:{w.position.line}: {w.position}: warning [{w.rule}] {w.message}"
                      for w in self.warnings[:limit]]
            if len(self.warnings) > limit:
                lines.append(f"... and {len(self.warnings) - limit} more warning(s)")
        return "\n".join([head, *lines])

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path, "events": self.events, "ok": self.ok,
                **{name: getattr(self, name) for name in COUNTS},
                "violations": [_finding(v) for v in self.violations],
                "warnings": [_finding(w) for w in self.warnings]}


COUNTS = ("reannounced", "left_stored", "unverified_parents", "empty_stores", "token_mismatches", "snapshots",
          "phantoms", "unjudged")
"""The report's counts, as the checker keeps them and in the order the JSON has them."""


def _in_order(found: list[Violation]) -> list[Violation]:
    return sorted(found, key=lambda v: v.position.order())


def _finding(v: Violation) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": v.rule, "line": v.position.line, "event": v.position.index,
                           "message": v.message}
    if v.position.seq is not None:
        out["seq"] = v.position.seq
    return out


Item = tuple[Position, dict[str, Any] | None, dict[Key, int] | None]
"""One thing a reader meets in a file, in order: an event, or the pool's copies after a line."""


@dataclass
class Stream:
    """What a file gives the checker: its items, read again on each pass (a pass holds one line, never
    the file), and the block sizes it declares."""

    path: str
    items: Callable[[str | Path], Iterator[Item]]
    block_sizes: dict[int, int] = field(default_factory=dict)
    is_trace: bool = False

    @property
    def events(self) -> Iterator[tuple[Position, dict[str, Any]]]:
        """The events alone, with their positions (a new pass each time)."""
        return ((pos, event) for pos, event, _ in self.items(self.path) if event is not None)


def _trace_items(path: str | Path) -> Iterator[Item]:
    header, steps = iter_trace(path)
    events_on = header.enable_kv_cache_events
    for step in steps:
        for pos, event in step_events(step, header.hash_block_size, events_on):
            yield pos, event, None
        if events_on and step.observation is not None and "index" in step.observation:
            yield Position(step.line), None, index_copies(step.observation["index"])


LOOKAHEAD = "lookahead_token_ids"
"""vLLM 0.33's one field more on ``BlockStored``: tokens after each block that its hash covers."""


def parse_stream_event(value: Any, where: str) -> dict[str, Any]:
    """One event of a bare stream: the trace format's event, and vLLM 0.33's ``lookahead_token_ids``."""
    if isinstance(value, dict) and LOOKAHEAD in value and value.get("type") == "BlockStored":
        look = value[LOOKAHEAD]
        if look is not None and not (isinstance(look, list) and all(
                isinstance(x, list) and all(type(t) is int for t in x) for x in look)):
            raise FieldError(f"{where}.{LOOKAHEAD}: expected null or a list of lists of integers")
        event = parse_event({k: v for k, v in value.items() if k != LOOKAHEAD}, where)
        event[LOOKAHEAD] = look
        return event
    return parse_event(value, where)


def _bare_items(path: str | Path) -> Iterator[Item]:
    for number, value in json_lines(path):
        yield Position(number), guarded(str(path), number, partial(parse_stream_event, value, "event")), None


def load_events(path: str | Path) -> Stream:
    """The validated events of a trace file (emission order) or of a JSONL event stream.

    From a trace, also the declared block sizes and, for each line with an
    observation (events on), the pool's index as copies per key.  Nothing is
    held: each pass reads the file again (a bad line raises :class:`TraceError`
    when a pass reaches it).
    """
    first = next(json_lines(path), None)
    if first is not None and isinstance(first[1], dict) and "kvpool_trace" in first[1]:
        header, _ = iter_trace(path)
        return Stream(str(path), _trace_items, dict(header.block_sizes or {}), is_trace=True)
    return Stream(str(path), _bare_items)


def check_events(path: str | Path, block_sizes: dict[int, int] | None = None) -> EventsReport:
    """Read a stream as a router would; raise :class:`TraceError` on an unreadable file.

    ``block_sizes`` (group -> full block size) overrides a trace header's.  A
    trace is also replayed on the model, to tell its warnings apart by the
    pool's index (a re-announced hit from a second copy).
    """
    return check_stream(load_events(path), str(path), block_sizes, facts=True)


def check_stream(stream: Stream, name: str, block_sizes: dict[int, int] | None = None, *,
                 facts: bool = False) -> EventsReport:
    """:func:`check_events` on a stream already loaded (:func:`load_events`), in one pass;
    ``facts``: replay a trace on the model to tell its warnings apart."""
    return read_stream(stream, name, block_sizes, facts=facts)[0]


def read_stream(stream: Stream, name: str, block_sizes: dict[int, int] | None = None,
                profiles: Sequence[tuple[str, Factory]] = (), *, facts: bool = False,
                ) -> tuple[EventsReport, list[RouterReport]]:
    """A loaded stream read once by the checker and the router ``profiles`` together."""
    sizes = {**stream.block_sizes, **(block_sizes or {})}
    known = PoolFacts(stream.path) if facts and stream.is_trace else None
    return read_items(stream.items(stream.path), name, sizes, known, profiles)


def check_event_list(events: Sequence[dict[str, Any]], name: str = "<events>",
                     block_sizes: dict[int, int] | None = None) -> EventsReport:
    """The same check on validated events in memory, positioned by their 1-based indices."""
    return read_items(((Position(i), e, None) for i, e in enumerate(events, 1)), name, block_sizes, None)[0]


def read_items(items: Iterator[Item], name: str, block_sizes: dict[int, int] | None, facts: Facts | None,
               profiles: Sequence[tuple[str, Factory]] = ()) -> tuple[EventsReport, list[RouterReport]]:
    """Events and pool copies in file order, through one :class:`~.reading.Reading`."""
    reading = Reading(name, block_sizes, profiles, facts=facts)
    for pos, event, copies in items:
        if event is not None:
            reading.feed(event, pos)
        elif copies is not None:
            reading.checker.compare(pos.line, copies)
    routers = reading.reports()
    return EventsReport.of(name, reading.checker), routers


__all__ = [
    "EventsReport", "Item", "Key", "Position", "Stream", "Violation", "check_event_list",
    "check_events", "check_stream", "load_events", "parse_stream_event", "read_items", "read_stream",
    "step_events",
]
