"""Check a KV-event stream the way a router that rebuilds the prefix index reads it.

A router (vLLM's KV-aware routing, llm-d, Dynamo) never sees the pool: it
sees ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` and keeps, per
``(block hash, group)``, how many stored copies a worker holds.  The stream is
useful only if that count can be kept without guessing.  This checker plays
such a router and names each event that would make it guess.

What it checks (each holds on every stream the model emits; the doc
``oracle/TRACE_FORMAT.md`` shows what the reference's streams do *not*
promise, with traces).  The first and the last are the model's step
properties of the same names (:mod:`kvpool.model.properties`), read off a
stream instead of the model's log; the second is a router's own rule.

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
``event_announcements_match_index``
    (Traces with observations, events on.)  Broken when, after a call, the pool's index
    holds more copies of a key than the stream has stored and not removed:
    a physical copy was never announced, or its removal was announced
    while it stayed.  The router may count *more* than the pool (phantoms,
    counted): ``emit_cached_block_events`` re-announces hits.

Counted, not reported (a router cannot tell them from legitimate streams):
stores of a key already stored (a second physical copy, or a prefix hit
re-announced by ``emit_cached_block_events``), one-hash stores with an unseen
parent that may be partial entries, empty stores and stores whose
``token_ids`` do not fill ``block_size`` per hash (null or masked blocks).

A trace's ``_insert_block_hash`` line stands for its caller's own ``BlockStored``
of the copied key (vLLM's offload manager appends one; the pool emits none):
the checker announces the key there, as a router would read it.

``AllBlocksCleared`` empties the router's index; the reference emits it
without removals for the entries it drops, so a router must not expect the
index to be empty before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.model.request import prefix_key

from ..trace import FieldError, TraceError, TraceStep, canonical_hash, json_lines, parse_event
from ..trace.read import iter_trace

Key = tuple[Any, Any]  # (hash in int form, group_idx)
_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True)
class Position:
    """Where an event sits: its line, and its index among that line's events (trace files)."""

    line: int
    index: int | None = None

    def __str__(self) -> str:
        return f"line {self.line}" + ("" if self.index is None else f" event {self.index}")


@dataclass(frozen=True)
class Violation:
    rule: str
    position: Position
    message: str


@dataclass
class EventsReport:
    """Violations in stream order, and counts that say how much was read."""

    path: str
    events: int = 0
    violations: list[Violation] = field(default_factory=list)
    reannounced: int = 0
    """Stores of a key that already had a stored copy (a second copy, or a re-announcement)."""
    left_stored: int = 0
    """Keys still stored at the end of the stream."""
    unverified_parents: int = 0
    """One-hash stores with an unseen parent that may be partial entries (sizes unknown)."""
    empty_stores: int = 0
    """BlockStored events with no hash (every block of the range was null or masked)."""
    token_mismatches: int = 0
    """BlockStored events whose token_ids do not fill block_size per hash."""
    snapshots: int = 0
    """Trace lines whose observed index was compared with the router's."""
    phantoms: int = 0
    """At the last compared line, keys the router counts more copies of than the pool holds."""
    warnings: list[Violation] = field(default_factory=list)
    """Events that break no rule but leave a router guessing (:mod:`.events_warnings`), in order."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def format(self, limit: int = 50) -> str:
        head = (f"{self.path}: {self.events} events, {len(self.violations)} violation(s); "
                f"not checkable: {self.reannounced} store(s) of already-stored keys, "
                f"{self.unverified_parents} unverified partial-entry parent(s), "
                f"{self.empty_stores} empty store(s), {self.token_mismatches} store(s) with "
                f"token_ids not filling their blocks; {self.left_stored} key(s) stored at the end"
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


@dataclass
class _Pending:
    """A store whose parent the router never saw; a violation unless it was a partial entry."""

    position: Position
    group: Any
    block_size: int
    num_hashes: int
    message: str


@dataclass
class Router:
    """The index a router rebuilds from events: stored copies per key."""

    block_sizes: dict[Any, int] = field(default_factory=dict)
    """Full block size per group, when known (trace header or command line)."""
    copies: dict[Key, int] = field(default_factory=dict)
    seen: set[Key] = field(default_factory=set)
    sizes: dict[Any, set[int]] = field(default_factory=dict)
    pending: list[_Pending] = field(default_factory=list)

    def feed(self, event: dict[str, Any], pos: Position, report: EventsReport) -> None:
        """Apply one (validated) event, appending any violation to ``report``."""
        report.events += 1
        kind = event["type"]
        if kind == "AllBlocksCleared":
            self.copies.clear()
            self.seen.clear()
            return
        group = event.get("group_idx")
        hashes = [canonical_hash(h) for h in event["block_hashes"]]
        if kind == "BlockRemoved":
            for h in hashes:
                key = (h, group)
                if self.copies.get(key, 0) <= 0:
                    what = ("removed more often than stored" if key in self.seen
                            else "never stored since the last AllBlocksCleared")
                    report.violations.append(Violation(
                        "event_removals_name_live_keys", pos, f"BlockRemoved of {_key(key)}: {what}"))
                    continue
                self.copies[key] -= 1
                if not self.copies[key]:
                    del self.copies[key]
            return
        self._store(event, hashes, group, pos, report)

    def _store(self, event: dict[str, Any], hashes: list[Any], group: Any, pos: Position,
               report: EventsReport) -> None:
        size = event["block_size"]
        self.sizes.setdefault(group, set()).add(size)
        if not hashes:
            report.empty_stores += 1
        elif len(event["token_ids"]) != size * len(hashes):
            report.token_mismatches += 1
        parent = event.get("parent_block_hash")
        if parent is not None and hashes:
            key = (canonical_hash(parent), group)
            if key not in self.seen:
                self.pending.append(_Pending(
                    pos, group, size, len(hashes),
                    f"BlockStored of {_key((hashes[0], group))} names parent {_key(key)}, "
                    "never stored in that group since the last AllBlocksCleared"))
        for h in hashes:
            key = (h, group)
            if self.copies.get(key, 0) > 0:
                report.reannounced += 1
            self.copies[key] = self.copies.get(key, 0) + 1
            self.seen.add(key)

    def compare(self, line: int, copies: dict[Key, int], report: EventsReport) -> None:
        """The pool's index after ``line`` against the router's counts.

        Every copy the pool holds must have been announced and not removed
        (``event_announcements_match_index`` otherwise); the router may count more (a hit
        re-announced, see ``emit_cached_block_events``): those are phantoms.
        """
        for key, n in copies.items():
            if self.copies.get(key, 0) < n:
                report.violations.append(Violation(
                    "event_announcements_match_index", Position(line),
                    f"the pool holds {n} cop(ies) of {_key(key)}, the stream accounts for "
                    f"{self.copies.get(key, 0)}"))
        report.phantoms = sum(1 for key, c in self.copies.items() if c > copies.get(key, 0))
        report.snapshots += 1

    def finish(self, report: EventsReport) -> None:
        """Decide the deferred parent checks now that every block size is known, and sort.

        A partial entry is one hash of ``hash_block_size`` tokens, below the
        group's full block size.  Without a declared size, the group's full
        size is the larger of the (at most two) sizes it announced; if it
        announced only one, a one-hash store with an unknown parent cannot
        be told from a partial entry and is counted as unverified.
        """
        for p in self.pending:
            full = self.block_sizes.get(p.group)
            seen = self.sizes.get(p.group, set())
            if p.num_hashes > 1 or (full is not None and p.block_size >= full):
                is_full: bool | None = True
            elif full is not None:
                is_full = False
            elif len(seen) > 1:
                is_full = p.block_size == max(seen)
            else:
                is_full = None
            if is_full:
                report.violations.append(Violation("parent-unknown", p.position, p.message))
            elif is_full is None:
                report.unverified_parents += 1
        report.violations.sort(key=lambda v: (v.position.line, v.position.index or 0))
        report.left_stored = len(self.copies)


def _key(key: Key) -> str:
    h, group = key
    text = f"{h:#018x}" if isinstance(h, int) else str(h)
    return f"{text}/group {group}"


Snapshots = dict[int, dict[Key, int]]
"""Per trace line with an observation: the pool's copies per key after that call."""


@dataclass
class Stream:
    """What a file gives the checker: events with positions, declared sizes, pool snapshots."""

    events: Iterable[tuple[Position, dict[str, Any]]]
    block_sizes: dict[int, int] = field(default_factory=dict)
    snapshots: Iterable[tuple[int, dict[Key, int]]] = ()
    is_trace: bool = False


def _index_copies(index: list[list[Any]]) -> dict[Key, int]:
    """An observation's index as copies per (hash in int form, group): keys end in the group."""
    out: dict[Key, int] = {}
    for key_hex, ids in index:
        raw = bytes.fromhex(key_hex)
        key = (int.from_bytes(raw[:-4], "big") & _LOW_64, int.from_bytes(raw[-4:], "big"))
        out[key] = out.get(key, 0) + len(ids)
    return out


def _callers_announcement(args: dict[str, Any], hash_block_size: int) -> dict[str, Any]:
    """The ``BlockStored`` the caller of ``_insert_block_hash`` publishes for the copied key."""
    block_hash, group = prefix_key(args["request"], args["prefix_tokens"], hash_block_size,
                                   args["kv_cache_group_id"])
    return {"type": "BlockStored", "block_hashes": [canonical_hash(block_hash.hex())],
            "parent_block_hash": None, "token_ids": [], "block_size": 0,
            "group_idx": group}


def step_events(step: TraceStep, hash_block_size: int, events_on: bool
                ) -> list[tuple[Position, dict[str, Any]]]:
    """The events a router reads from one call, positioned: the call's own, then (for
    ``_insert_block_hash``) the offload caller's announcement of the key it copied.

    A pool that does not show each call's events (``events: null``) hands them
    over in ``take_events``: there they are read, when the router would receive them.
    """
    own = step.events
    if own is None and step.op == "take_events" and step.error is None:
        own = step.result
    events = [(Position(step.line, i), e) for i, e in enumerate(own or ())]
    if step.op == "_insert_block_hash" and step.error is None and events_on:
        events.append((Position(step.line, len(events)), _callers_announcement(step.args, hash_block_size)))
    return events


Item = tuple[Position, dict[str, Any] | None, dict[Key, int] | None]
"""One thing a reader meets in a file, in order: an event, or the pool's copies after a line."""


class _Reread:
    """A file's items, read again on each pass: a pass holds one line, never the file."""

    def __init__(self, path: str | Path, items: Callable[[str | Path], Iterator[Item]], pool: bool):
        self.path, self.items, self.pool = path, items, pool

    def __iter__(self) -> Iterator[Any]:
        for pos, event, copies in self.items(self.path):
            if self.pool:
                if copies is not None:
                    yield pos.line, copies
            elif event is not None:
                yield pos, event


def _trace_items(path: str | Path) -> Iterator[Item]:
    header, steps = iter_trace(path)
    events_on = header.enable_kv_cache_events
    for step in steps:
        for pos, event in step_events(step, header.hash_block_size, events_on):
            yield pos, event, None
        if events_on and step.observation is not None and "index" in step.observation:
            yield Position(step.line), None, _index_copies(step.observation["index"])


def _bare_items(path: str | Path) -> Iterator[Item]:
    name = str(path)
    for number, value in json_lines(path):
        try:
            yield Position(number), parse_event(value, "event"), None
        except FieldError as exc:
            raise TraceError(name, number, str(exc)) from None
        except RecursionError:
            raise TraceError(name, number, "value nested too deeply") from None


def load_events(path: str | Path) -> Stream:
    """The validated events of a trace file (emission order) or of a JSONL event stream.

    From a trace with events on, also the declared block sizes and, for each
    line with an observation, the pool's index as copies per key.  Nothing is
    held: ``events`` and ``snapshots`` read the file again on each pass (a bad
    line raises :class:`TraceError` when a pass reaches it).
    """
    first = next(json_lines(path), None)
    if first is None:
        return Stream([])
    if isinstance(first[1], dict) and "kvpool_trace" in first[1]:
        header, _ = iter_trace(path)
        return Stream(_Reread(path, _trace_items, False), dict(header.block_sizes or {}),
                      _Reread(path, _trace_items, True), is_trace=True)
    return Stream(_Reread(path, _bare_items, False))


def check_events(path: str | Path, block_sizes: dict[int, int] | None = None) -> EventsReport:
    """Read a stream as a router would; raise :class:`TraceError` on an unreadable file.

    ``block_sizes`` (group -> full block size) overrides a trace header's.
    """
    return check_stream(load_events(path), str(path), block_sizes)


def check_stream(stream: Stream, name: str, block_sizes: dict[int, int] | None = None) -> EventsReport:
    """:func:`check_events` on a stream already loaded (:func:`load_events`), in one pass."""
    sizes = {**stream.block_sizes, **(block_sizes or {})}
    if isinstance(stream.events, _Reread):
        return _check_items(stream.events.items(stream.events.path), name, sizes)
    return check_event_list([e for _, e in stream.events], name, sizes,
                            [p for p, _ in stream.events], dict(stream.snapshots))


def check_event_list(
    events: Sequence[dict[str, Any]], name: str = "<events>",
    block_sizes: dict[int, int] | None = None, positions: Sequence[Position] | None = None,
    snapshots: Snapshots | None = None,
) -> EventsReport:
    """The same check on validated events in memory; positions default to 1-based indices.

    With ``snapshots`` (trace lines -> the pool's copies per key), the
    router's counts are also compared with the pool after each such line.
    """
    pending = sorted((snapshots or {}).items())
    items: list[Item] = []
    for i, event in enumerate(events):
        pos = positions[i] if positions else Position(i + 1)
        while pending and pending[0][0] < pos.line:
            line, copies = pending.pop(0)
            items.append((Position(line), None, copies))
        items.append((pos, event, None))
    items += [(Position(line), None, copies) for line, copies in pending]
    return _check_items(iter(items), name, block_sizes)


def _check_items(items: Iterator[Item], name: str, block_sizes: dict[int, int] | None) -> EventsReport:
    """The router's reading of events and pool copies in file order."""
    report = EventsReport(name)
    router = Router(block_sizes=dict(block_sizes or {}))
    for pos, event, copies in items:
        if event is not None:
            router.feed(event, pos, report)
        elif copies is not None:
            router.compare(pos.line, copies, report)
    router.finish(report)
    return report
