"""Warnings on a KV-event stream: what breaks no rule of the stream but leaves a router guessing, at its line.

:mod:`.events_check` names the events that break a rule of vLLM 0.31's stream.
The events named here break none (the model emits every one of them), yet a
router that rebuilds the prefix index from the stream has to guess at each;
``oracle/TRACE_FORMAT.md`` ("What the reference's streams do not promise")
shows each with its trace.  Each warning is named by kvpool's own reading:

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
``empty-store``
    A ``BlockStored`` with no hash (every block of its range was null or masked).
``tokens-not-filling``
    A ``BlockStored`` whose ``token_ids`` are not ``block_size`` per hash (null
    or masked blocks skipped in the hashes, not in the tokens).
``hash-in-two-groups``
    A ``BlockStored`` that makes a 64-bit hash held in a second KV-cache group
    while another group holds it: a reader keyed by the hash alone merges them.
``medium-change``, ``lora-change``
    A ``BlockStored`` whose parent was last stored with another ``medium``, or
    another LoRA adapter (``lora_name``, ``lora_id``): a chain that changes tier
    or adapter part-way.

:func:`add_warnings` fills an :class:`~.events_check.EventsReport`'s
``warnings``; ``kvpool check-events --strict`` fails on any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.model.state import PoolState

from .events_check import (
    EventsReport,
    Position,
    Router,
    Stream,
    Violation,
    _callers_announcement,
    _index_copies,
    _key,
)
from .trace import TraceError, TraceStep, canonical_hash, check_trace

WARNINGS: dict[str, str] = {
    "stored-again": "a store of a key the stream holds: a re-announced hit or a second copy",
    "reannounced-hit": "a store of a key the pool holds, with no new copy (emit_cached_block_events)",
    "second-copy": "a store of a key the pool holds, as one more copy",
    "parent-removed": "a store whose parent was stored and has been removed since",
    "empty-store": "a store with no hash",
    "tokens-not-filling": "a store whose token_ids are not block_size per hash",
    "hash-in-two-groups": "one 64-bit hash held in two KV-cache groups",
    "medium-change": "a store whose parent was stored with another medium",
    "lora-change": "a store whose parent was stored with another LoRA adapter",
}
"""Every warning, by name: what it marks."""

_LOW_64 = (1 << 64) - 1
Key = tuple[Any, Any]
Copies = dict[Key, int]


def pool_copies(step: TraceStep, state: PoolState) -> Copies:
    """The pool's copies per (64-bit hash, group) after a call: its observation's, or the model's."""
    if step.observation is not None and "index" in step.observation:
        return _index_copies(step.observation["index"])
    return {(int.from_bytes(h, "big") & _LOW_64, g): len(ids) for (h, g), ids in state.index.items()}


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


@dataclass
class PoolFacts:
    """What a trace's replay says of each call: its op, and the pool's copies of the keys it stores."""

    ops: dict[int, str] = field(default_factory=dict)
    before: dict[int, Copies] = field(default_factory=dict)
    after: dict[int, Copies] = field(default_factory=dict)


def _named(step: TraceStep, state: PoolState) -> set[Key]:
    """The keys (and parents) the call's stores name, in the checker's key form."""
    keys: set[Key] = set()
    for _, e in step_events(step, state.hash_block_size, state.events_on):
        if e["type"] == "BlockStored":
            group = e.get("group_idx")
            keys.update((canonical_hash(h), group) for h in e["block_hashes"])
            if e.get("parent_block_hash") is not None:
                keys.add((canonical_hash(e["parent_block_hash"]), group))
    return keys


def pool_facts(path: str | Path) -> PoolFacts:
    """Replay a trace on the model; per call, the pool's copies of the keys its stores name.

    The observation's index where a line has one, else the model's.  Lines
    after a call the model does not agree with are not covered.
    """
    facts = PoolFacts()
    prev: list[Copies] = [{}]

    def on_step(step: TraceStep, state: PoolState) -> None:
        facts.ops[step.line] = step.op
        after = pool_copies(step, state)
        keys = _named(step, state)
        if keys:
            facts.before[step.line] = {k: prev[0].get(k, 0) for k in keys}
            facts.after[step.line] = {k: after.get(k, 0) for k in keys}
        prev[0] = after

    check_trace(path, on_step=on_step)
    return facts


class _Finder:
    """Reads the stream once, warning before each event is counted by check-events' own reader."""

    def __init__(self, facts: PoolFacts | None):
        self.facts = facts
        self.reader = Router()
        """The copies and the keys seen since the last clear, as check-events counts them."""
        self.scratch = EventsReport("<warnings>")
        self.groups: dict[Any, set[Any]] = {}
        """Per hash: the groups it was stored in since the last clear."""
        self.last: dict[Key, tuple[Any, Any, Any]] = {}
        """Per key: medium, lora_name and lora_id of its last store that said them."""
        self.out: list[Violation] = []

    def warn(self, rule: str, pos: Position, message: str) -> None:
        self.out.append(Violation(rule, pos, message))

    def feed(self, pos: Position, event: dict[str, Any]) -> None:
        if event["type"] == "AllBlocksCleared":
            self.groups.clear()
        elif event["type"] == "BlockStored":
            self._store(pos, event, [canonical_hash(h) for h in event["block_hashes"]],
                        event.get("group_idx"))
        self.reader.feed(event, pos, self.scratch)

    def _store(self, pos: Position, event: dict[str, Any], hashes: list[Any], group: Any) -> None:
        copies = self.reader.copies
        size, tokens = event["block_size"], event["token_ids"]
        if not hashes:
            self.warn("empty-store", pos, f"BlockStored with no hash and {len(tokens)} token(s): every "
                      "block of the range was null or masked")
        elif len(tokens) != size * len(hashes) and size:
            self.warn("tokens-not-filling", pos, f"BlockStored of {len(hashes)} hash(es) of block_size "
                      f"{size} carries {len(tokens)} token_ids, not {size * len(hashes)}: null or masked "
                      "blocks are skipped in the hashes, not in the tokens")
        before = self.facts.before.get(pos.line) if self.facts else None
        after = self.facts.after.get(pos.line) if self.facts else None
        parent = event.get("parent_block_hash")
        if parent is not None and hashes:
            self._parent((canonical_hash(parent), group), pos, event, before)
        here = (event.get("medium"), event.get("lora_name"), event.get("lora_id"))
        for h in hashes:
            key = (h, group)
            if before is not None and after is not None:
                if before.get(key, 0) > 0:
                    rule = "second-copy" if after.get(key, 0) > before[key] else "reannounced-hit"
                    what = ("one more copy" if rule == "second-copy"
                            else "no new copy: a prefix hit announced again")
                    self.warn(rule, pos, f"BlockStored of {_key(key)}, which the pool held "
                              f"{before[key]} cop(ies) of: {what}")
            elif copies.get(key, 0) > 0:
                self.warn("stored-again", pos, f"BlockStored of {_key(key)}, which the stream holds: a "
                          "prefix hit re-announced (no new copy) or a second copy; the stream does not "
                          "say which")
            if not copies.get(key, 0):
                others = {g for g in self.groups.get(h, ()) if g != group and copies.get((h, g), 0) > 0}
                if others:
                    self.warn("hash-in-two-groups", pos, f"BlockStored of {_key(key)}, a 64-bit hash "
                              f"group(s) {sorted(others, key=repr)} hold too")
            self.groups.setdefault(h, set()).add(group)
            if "medium" in event:  # the offload caller's announcement says neither medium nor LoRA
                self.last[key] = here

    def _parent(self, key: Key, pos: Position, event: dict[str, Any], before: Copies | None) -> None:
        held = before.get(key, 0) if before is not None else self.reader.copies.get(key, 0)
        if key in self.reader.seen and held <= 0:
            self.warn("parent-removed", pos, f"BlockStored names parent {_key(key)}, stored since the "
                      "last AllBlocksCleared and removed since")
        last = self.last.get(key)
        if last is None or "medium" not in event:
            return
        medium, lora_name, lora_id = last
        if medium != event.get("medium"):
            self.warn("medium-change", pos, f"BlockStored with medium {event.get('medium')!r} names parent "
                      f"{_key(key)}, stored with medium {medium!r}")
        if (lora_name, lora_id) != (event.get("lora_name"), event.get("lora_id")):
            self.warn("lora-change", pos, f"BlockStored with LoRA {event.get('lora_name')!r} names parent "
                      f"{_key(key)}, stored with LoRA {lora_name!r}")


def find_warnings(events: Sequence[tuple[Position, dict[str, Any]]],
                  facts: PoolFacts | None = None) -> list[Violation]:
    """The warnings of a validated stream, in stream order; ``facts`` tell copies apart (traces)."""
    finder = _Finder(facts)
    for pos, event in events:
        finder.feed(pos, event)
    return finder.out


def add_warnings(report: EventsReport, stream: Stream, path: str | Path, is_trace: bool) -> EventsReport:
    """Fill ``report.warnings`` for ``stream``, read from ``path`` (a trace is replayed on the model)."""
    facts = None
    if is_trace:
        try:
            facts = pool_facts(path)
        except TraceError:
            facts = None
    report.warnings = find_warnings(stream.events, facts)
    return report
