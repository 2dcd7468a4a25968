"""The engines a watcher reads: per engine a sequencer, a decoder and a reading; findings, counts, lag.

No sockets here: :class:`Fleet` takes the wire's records (a message as
received, the watcher giving up on a hole) and answers the replays to ask.
``kvpool watch`` feeds it from ZMQ sockets (:mod:`.subscribe`) and
``kvpool check-events`` from a capture's records, so both find the same.

An engine is a ``(source, topic)``: one subscribed endpoint (a data-parallel
rank has its own, its port offset by the rank) and the topic its publisher
sends on (several publishers may connect to one bound endpoint, told apart by
topic).  A batch's ``data_parallel_rank`` is checked against the rank its
endpoint says.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..trace import TraceError
from .capture import Source, read_capture
from .kinds import Position
from .online import HISTORY
from .reading import Finding, Reading
from .routers.check import Factory
from .sequence import Ask, Deliver, Note, Reset, Sequencer
from .wire import END_SEQ, Decoder, WireError, parse_frames


@dataclass(frozen=True)
class Report:
    """One finding of one engine, when it was made: a line of ``kvpool watch``'s output."""

    engine: str
    finding: Finding
    time: float
    lost: int = 0
    recovered: int = 0

    def to_json(self) -> dict[str, Any]:
        f, pos = self.finding, self.finding.position
        out: dict[str, Any] = {"time": round(self.time, 6), "engine": self.engine, "kind": f.kind,
                               "rule": f.rule, "record": pos.line, "seq": pos.seq, "event": pos.index,
                               "message": f.message}
        if f.profile is not None:
            out["profile"], out["reaction"] = f.profile, f.reaction
        if f.kind in ("gap", "joined"):
            out["lost"], out["recovered"] = self.lost, self.recovered
        return out


ReportSink = Callable[[Report], None]


@dataclass
class Counts:
    """What one engine's reading came to so far (``kvpool watch``'s summary and metrics)."""

    batches: int = 0
    events: int = 0
    findings: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Per (kind, rule, profile or ""): how many."""
    lag: float = 0.0
    """Seconds from the batch's timestamp to the end of its check, for the last batch."""
    lag_max: float = 0.0


_position: Any = tuple.__new__
"""Makes a Position from its three fields without a Python-level call (one is made per event)."""

GC_THRESHOLDS = (50_000, 20, 100)
"""The collector's thresholds for a process that reads streams for days: its index's objects live long
and hold few cycles, and the default (700, 10, 10) spends a third of a watcher's time traversing them."""


class Engine:
    """One engine's stream: in sequence, decoded, read; its findings to the fleet's sink."""

    def __init__(self, fleet: Fleet, source: int, topic: bytes):
        self.fleet, self.source, self.topic = fleet, source, topic
        src = fleet.sources[source]
        text = topic.decode("utf-8", "replace")
        self.name = src.endpoint + (f" topic {text}" if text else "")
        self.sequencer = Sequencer(src.replay is not None, reorder=fleet.reorder, hold=fleet.hold)
        self.decoder = Decoder()
        self.reading = Reading(self.name, fleet.block_sizes, fleet.profiles, history=fleet.history,
                               sink=self._found)
        self.counts = Counts()
        self.reported_unknown = 0
        self.ranks_seen: set[int] = set()
        self.since: float | None = None
        """Since when batches are held for a hole with none delivered (the watcher may give up)."""

    def _found(self, finding: Finding, lost: int = 0, recovered: int = 0) -> None:
        key = (finding.kind, finding.rule, finding.profile or "")
        self.counts.findings[key] = self.counts.findings.get(key, 0) + 1
        self.fleet.sink(Report(self.name, finding, self.fleet.clock(), lost, recovered))

    def _note(self, kind: str, record: int, seq: int | None, message: str, lost: int = 0,
              recovered: int = 0) -> None:
        self._found(Finding(kind, kind, Position(record, None, seq), message), lost, recovered)

    def run(self, actions: Sequence[Any], t: float) -> list[int]:
        """Do what the sequencer answered; the replay starts to ask."""
        asks: list[int] = []
        moved = False
        for action in actions:
            if isinstance(action, Deliver):
                self._deliver(action)
                moved = True
            elif isinstance(action, Reset):
                self.reading.restart(Position(action.record), action.known_empty)
            elif isinstance(action, Note):
                self._note(action.kind, action.record, action.seq, action.message, action.lost,
                           action.recovered)
            elif isinstance(action, Ask):
                asks.append(action.start)
        # the wait is counted from the last batch delivered: a hole filling slowly is not given up on
        self.since = None if not self.sequencer.waiting else t if moved or self.since is None else self.since
        return asks

    def _deliver(self, d: Deliver) -> None:
        self.counts.batches += 1
        try:
            batch = self.decoder.decode(d.payload)
        except WireError as exc:
            self._note("undecodable", d.record, d.seq, f"batch {d.seq}: {exc}; its events are lost, the "
                       "reading restarts")
            self.reading.restart(Position(d.record, None, d.seq), known_empty=False)
            return
        for label in self.decoder.unknown[self.reported_unknown:]:
            self._note("unknown-field", d.record, d.seq, f"{label}: no vLLM release kvpool knows has it; "
                       "tolerated (not checked), reported once")
        self.reported_unknown = len(self.decoder.unknown)
        rank = batch.data_parallel_rank
        expected = self.fleet.sources[self.source].rank
        if rank is not None and rank != expected and rank not in self.ranks_seen:
            self.ranks_seen.add(rank)
            self._note("dp-rank-mismatch", d.record, d.seq, f"data_parallel_rank {rank} on an endpoint "
                       f"of rank {expected} (its port is the base port plus the rank)")
        feed, record, seq = self.reading.feed, d.record, d.seq
        for i, event in enumerate(batch.events):
            feed(event, _position(Position, (record, i, seq)))
        self.counts.events += len(batch.events)
        self.counts.lag = lag = self.fleet.clock() - batch.ts
        self.counts.lag_max = max(self.counts.lag_max, lag)


class Fleet:
    """Every engine the watcher reads, keyed by (source, topic), from the wire's records."""

    def __init__(self, sources: Sequence[Source], *, block_sizes: dict[int, int] | None = None,
                 profiles: Sequence[tuple[str, Factory]] = (), history: int = HISTORY,
                 sink: ReportSink | None = None, clock: Callable[[], float] | None = None,
                 reorder: int = 16, hold: int = 4_096):
        self.sources = list(sources)
        self.block_sizes = dict(block_sizes or {})
        self.profiles = list(profiles)
        self.history, self.reorder, self.hold = history, reorder, hold
        self.reports: list[Report] = []
        self.sink: ReportSink = sink or self.reports.append
        self.clock = clock or time.time
        self.engines: dict[tuple[int, bytes], Engine] = {}
        self.asking: dict[int, list[bytes]] = {}
        """Per source: the topics whose replay was asked and not yet ended, in order asked."""

    def engine(self, source: int, topic: bytes) -> Engine:
        key = (source, topic)
        found = self.engines.get(key)
        if found is None:
            found = self.engines[key] = Engine(self, source, topic)
        return found

    def message(self, record: int, t: float, source: int, via: str, frames: list[bytes]
                ) -> list[tuple[int, bytes, int]]:
        """One message as received; the replays to ask, as (source, topic, start)."""
        try:
            topic, seq, payload = parse_frames(frames)
        except WireError as exc:
            src = self.sources[source].endpoint
            finding = Finding("undecodable", "undecodable", Position(record), f"a message that is not "
                              f"vLLM's: {exc}")
            self.sink(Report(src, finding, self.clock()))
            return []
        if via == "replay" and seq == END_SEQ and not topic and not payload:
            asked = self.asking.get(source)
            if not asked:
                return []
            engine = self.engine(source, asked.pop(0))
            return self._asks(engine, engine.run(engine.sequencer.replay_ended(record), t))
        engine = self.engine(source, topic)
        actions = engine.sequencer.arrive(record, seq, payload, replayed=via == "replay")
        return self._asks(engine, engine.run(actions, t))

    def gave_up(self, record: int, t: float, source: int, topic: bytes) -> list[tuple[int, bytes, int]]:
        """The watcher stopped waiting for ``topic``'s hole to fill."""
        engine = self.engines.get((source, topic))
        if engine is None:
            return []
        asked = self.asking.get(source)
        if asked and topic in asked:
            asked.remove(topic)
        return self._asks(engine, engine.run(engine.sequencer.gave_up(record), t))

    def _asks(self, engine: Engine, starts: list[int]) -> list[tuple[int, bytes, int]]:
        if starts:
            self.asking.setdefault(engine.source, []).append(engine.topic)
        return [(engine.source, engine.topic, s) for s in starts]

    def waiting(self) -> list[tuple[int, bytes, float]]:
        """Engines holding batches for a hole: (source, topic, since when)."""
        return [(e.source, e.topic, e.since) for e in self.engines.values() if e.since is not None]

    def finish(self) -> None:
        """The end of what is read (a capture's end): undecided stores reported."""
        for e in self.engines.values():
            e.reading.finish()

    # ------------------------------------------------------------------ what it came to

    def totals(self) -> dict[str, Any]:
        """Sums over the engines, for the summary line."""
        engines = self.engines.values()
        out: dict[str, Any] = {"engines": len(self.engines)}
        for name in ("batches", "events"):
            out[name] = sum(getattr(e.counts, name) for e in engines)
        for kind in ("violation", "warning", "reaction"):
            out[kind] = sum(n for e in engines for (k, _, _), n in e.counts.findings.items() if k == kind)
        for name in ("gaps", "lost", "recovered", "restarts", "duplicates"):
            out[name] = sum(getattr(e.sequencer.stats, name) for e in engines)
        for name in ("lag", "lag_max"):
            out[name] = max([0.0, *(getattr(e.counts, name) for e in engines)])
        out["unjudged"] = sum(e.reading.checker.unjudged + sum(r.unjudged for r in e.reading.routers)
                              for e in engines)
        return out

    def summary(self, elapsed: float | None = None) -> str:
        """The one-line summary ``kvpool watch`` prints every so often."""
        t = self.totals()
        rate = f" ({t['events'] / elapsed:,.0f}/s)" if elapsed else ""
        return (f"kvpool watch: {t['engines']} engine(s), {t['batches']:,} batch(es), {t['events']:,} "
                f"event(s){rate}; {t['violation']} violation(s), {t['warning']} warning(s), "
                f"{t['reaction']} router reaction(s); {t['gaps']} gap(s) ({t['lost']} batch(es) lost, "
                f"{t['recovered']} replayed), {t['restarts']} restart(s), {t['duplicates']} duplicate(s); "
                f"{t['unjudged']} not judged; lag {t['lag'] * 1000:.1f} ms "
                f"(max {t['lag_max'] * 1000:.1f} ms)")


def replay_capture(path: str | Path, *, block_sizes: dict[int, int] | None = None,
                   profiles: Sequence[tuple[str, Factory]] = (), history: int = HISTORY) -> Fleet:
    """A capture's records through a fleet, as the watcher fed them: its reports in ``reports``.

    Lag is measured to each message's receipt.  :class:`TraceError` on an unreadable capture.
    """
    header, records = read_capture(path)
    now = [header.started]
    fleet = Fleet(header.sources, block_sizes=block_sizes, profiles=profiles, history=history,
                  clock=lambda: now[0])
    name = str(path)
    for number, record in records:
        try:
            kind, t, source = record[0], float(record[1]), int(record[2])
        except (IndexError, TypeError, ValueError):
            raise TraceError(name, number, "a record starts [kind, time, source]") from None
        if not 0 <= source < len(fleet.sources):
            raise TraceError(name, number, f"source {source}: the header names {len(fleet.sources)}")
        now[0] = t
        if kind == "msg" and len(record) == 5 and isinstance(record[4], list) and all(
                isinstance(f, bytes) for f in record[4]):
            fleet.message(number, t, source, str(record[3]), record[4])
        elif kind == "gave-up" and len(record) == 4 and isinstance(record[3], bytes):
            fleet.gave_up(number, t, source, record[3])
        elif kind != "ask":
            raise TraceError(name, number, f"a {kind!r} record of {len(record)} fields is not one this "
                             "version writes")
    fleet.finish()
    return fleet


__all__ = ["GC_THRESHOLDS", "Counts", "Engine", "Fleet", "Report", "ReportSink", "replay_capture"]
