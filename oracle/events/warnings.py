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

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvpool.model.state import PoolState

from ..trace import TraceError, TraceStep, canonical_hash
from ..trace.check import agreeing_steps
from .check import (
    EventsReport,
    Key,
    Position,
    Router,
    Stream,
    Violation,
    _index_copies,
    _key,
    step_events,
)

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
Copies = dict[Key, int]


def pool_copies(step: TraceStep, state: PoolState) -> Copies:
    """The pool's copies per (64-bit hash, group) after a call: its observation's, or the model's."""
    if step.observation is not None and "index" in step.observation:
        return _index_copies(step.observation["index"])
    return {(int.from_bytes(h, "big") & _LOW_64, g): len(ids) for (h, g), ids in state.index.items()}


class PoolFacts:
    """What a trace's replay says of each call, read as the stream advances: the pool's copies,
    before and after the call, of the keys its stores name.

    The replay runs at most one call ahead of the reader, and follows the
    index by each call's footprint: memory and cost per call are the pool's
    and the call's, never the trace's.  Lines after a call the model does
    not agree with (or an unreadable line) are not covered.
    """

    def __init__(self, path: str | Path):
        self._facts = _replay(path)
        self._next: tuple[int, Copies, Copies] | None = None
        self._done = False

    def at(self, line: int) -> tuple[Copies, Copies] | None:
        """Before and after ``line``'s call, for the keys its stores name; lines only increase."""
        while not self._done and (self._next is None or self._next[0] < line):
            try:
                self._next = next(self._facts)
            except (StopIteration, TraceError):
                self._done, self._next = True, None
        if self._next is not None and self._next[0] == line:
            return self._next[1], self._next[2]
        return None


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


def _replay(path: str | Path) -> Iterator[tuple[int, Copies, Copies]]:
    """Per call whose stores name keys: its line, and the pool's copies of them before and after.

    The observation's index where a line has one, else the model's, kept per
    key as each call's declared footprint changes it.
    """
    copies: Copies = {}
    for step, state, keys in agreeing_steps(path, footprints=True):
        named = _named(step, state)
        before = {k: copies.get(k, 0) for k in named}
        if step.observation is not None and "index" in step.observation:
            copies = _index_copies(step.observation["index"])
        else:
            for h, g in keys:
                key, held = (int.from_bytes(h, "big") & _LOW_64, g), len(state.index.get((h, g), ()))
                if held:
                    copies[key] = held
                else:
                    copies.pop(key, None)
        if named:
            yield step.line, before, {k: copies.get(k, 0) for k in named}


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
        facts = self.facts.at(pos.line) if self.facts else None
        before, after = facts if facts is not None else (None, None)
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


def find_warnings(events: Iterable[tuple[Position, dict[str, Any]]],
                  facts: PoolFacts | None = None) -> list[Violation]:
    """The warnings of a validated stream, in stream order; ``facts`` tell copies apart (traces)."""
    finder = _Finder(facts)
    for pos, event in events:
        finder.feed(pos, event)
    return finder.out


def add_warnings(report: EventsReport, stream: Stream, path: str | Path, is_trace: bool) -> EventsReport:
    """Fill ``report.warnings`` for ``stream``, read from ``path`` (a trace is replayed on the model)."""
    facts = PoolFacts(path) if is_trace else None
    report.warnings = find_warnings(stream.events, facts)
    return report
