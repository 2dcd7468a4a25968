"""Warnings on a KV-event stream: what breaks no rule of the stream but leaves a router guessing, at its line.

:mod:`.check` names the events that break a rule of vLLM 0.31's stream.  The
events named here break none (the model emits most of them; the others are
what a fleet's stream can do: several media, mixed group fields, a block size
that changes), yet a router that rebuilds the prefix index from the stream
has to guess at each; ``oracle/TRACE_FORMAT.md`` ("What the reference's
streams do not promise") shows the model's with their traces.  Every name is
in :data:`WARNINGS` (:mod:`.kinds`); the checker that finds them is
:class:`~.online.StreamChecker`, the rules' own, in the same pass:

``stored-again``
    (A stream alone.)  A ``BlockStored`` of a key the stream already holds: a
    prefix hit re-announced by ``emit_cached_block_events`` (no new copy) or a
    second physical copy; the stream does not say which.
``reannounced-hit``, ``second-copy``
    (A trace.)  The same, told apart by the pool's index before and after the
    call: its copies of the key did not grow (re-announced), or grew (a second copy).
``parent-removed``
    A ``BlockStored`` naming a parent that was stored since the last
    ``AllBlocksCleared`` and is removed now (on a trace: the pool held no
    copy of it before the call).
``parent-unannounced``, ``partial-entry``
    A one-hash ``BlockStored`` whose parent was never announced, that the
    checker cannot tell from a partial entry (its group showed one block
    size); and a store it knows is a partial entry.
``empty-store``, ``tokens-not-filling``
    A ``BlockStored`` with no hash, or whose ``token_ids`` are not
    ``block_size`` per hash (null or masked blocks skipped in the hashes, not
    in the tokens).
``hash-in-two-groups``
    A ``BlockStored`` that makes a 64-bit hash held in a second KV-cache group
    while another group holds it: a reader keyed by the hash alone merges them.
``medium-change``, ``lora-change``, ``medium-copy``, ``medium-mismatch``, ``clear-names-no-medium``
    A chain that changes tier or adapter part-way; a key stored in a second
    medium; a removal in a medium none of its copies has; a clear (which
    names no medium) while two media hold keys.
``group-missing``, ``block-size-change``, ``extra-keys-not-per-hash``, ``lookahead-not-per-hash``
    Events that leave their group unsaid in a stream that says it elsewhere;
    a block size a group cannot have; per-hash fields of another length.

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
