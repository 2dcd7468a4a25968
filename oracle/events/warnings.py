"""Warnings on a KV-event stream: what breaks no rule of the stream but leaves a router guessing, at its line.

:mod:`.check` names the events that break a rule of vLLM 0.31's stream.  The
events named here break none (the model emits most of them; the others are
what a fleet's stream can do: several media, mixed group fields, a block size
that changes), yet a router that rebuilds the prefix index from the stream
has to guess at each; ``oracle/TRACE_FORMAT.md`` ("What the reference's
streams do not promise") shows the model's with their traces.  Every name is
in :data:`WARNINGS` (:mod:`.kinds`), with what it marks; the checker that finds them is
:class:`~.online.StreamChecker`, the rules' own, in the same pass.

:func:`add_warnings` fills an :class:`~.check.EventsReport`'s ``warnings``;
``kvpool check-events --strict`` fails on any.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .check import EventsReport, Stream, read_items
from .facts import PoolFacts, pool_copies
from .kinds import WARNINGS, Position, Violation
from .online import Facts


def find_warnings(events: Iterable[tuple[Position, dict[str, Any]]], facts: Facts | None = None,
                  block_sizes: dict[int, int] | None = None) -> list[Violation]:
    """The warnings of a validated stream, in stream order; ``facts`` tell copies apart (traces)."""
    return read_items(((pos, event, None) for pos, event in events), "", block_sizes, facts)[0].warnings


def add_warnings(report: EventsReport, stream: Stream, path: str | Path, is_trace: bool) -> EventsReport:
    """Fill ``report.warnings`` for ``stream``, read from ``path`` (a trace is replayed on the model)."""
    facts = PoolFacts(path) if is_trace else None
    report.warnings = find_warnings(stream.events, facts, stream.block_sizes)
    return report


__all__ = ["WARNINGS", "PoolFacts", "add_warnings", "find_warnings", "pool_copies"]
