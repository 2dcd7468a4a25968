"""The two idealised readings of a stream, keyed by ``(hash, group_idx)`` as the pool keys it.

``set``: a key is held from its store to its removal, however often it was
stored.  ``refcount``: each store is one more copy, each removal one fewer.
vLLM 0.31's stream cannot serve both: a prefix hit re-announced by
``emit_cached_block_events`` (no new copy) and a second physical copy of a
key are the same events (stored, stored, removed), and each reading is right
on one of them only (``oracle/TRACE_FORMAT.md``, "Stores are not one per
physical copy").
"""

from __future__ import annotations

from typing import Any

from ..events_check import Position
from .base import KVPOOL_DOC, Cause, Profile, Query, Reaction, Rule, event_group, event_hashes

Key = tuple[int, int]


def _rules(*rules: Rule) -> dict[str, Rule]:
    return {r.id: r for r in rules}


def _leading(query: Query, held: Any) -> int:
    n = 0
    for h in query.hashes:
        if not held((h, query.group)):
            break
        n += 1
    return n


class SetReader(Profile):
    """Held or not, per key: a store makes it held, a removal not, a clear nothing."""

    name = "set"
    repeats = "one copy"
    rules = _rules(
        Rule("set.store", "a BlockStored makes each of its keys held", KVPOOL_DOC),
        Rule("set.remove", "a BlockRemoved makes its key not held, however often it was stored",
             KVPOOL_DOC),
        Rule("set.clear", "an AllBlocksCleared makes every key not held", KVPOOL_DOC),
    )

    def __init__(self, block_sizes: dict[int, int]):
        super().__init__(block_sizes)
        self.held: dict[Key, Position] = {}
        self.gone: dict[Key, tuple[str, Position]] = {}

    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        kind = event["type"]
        if kind == "AllBlocksCleared":
            self.gone.update((k, ("set.clear", pos)) for k in self.held)
            self.held.clear()
            return []
        group = event_group(event)
        for h in event_hashes(event):
            key = (h, group)
            if kind == "BlockStored":
                self.held[key] = pos
                self.gone.pop(key, None)
            elif self.held.pop(key, None) is not None:
                self.gone[key] = ("set.remove", pos)
        return []

    def prefix(self, query: Query) -> int:
        return _leading(query, self.held.__contains__)

    def explain(self, query: Query, block: int, held: bool) -> Cause:
        key = (query.hashes[block], query.group)
        if held:
            return Cause("set.store", self.held.get(key), "stored there; a store of a held key is "
                         "read as the same copy")
        rule, pos = self.gone.get(key, ("set.store", None))
        if pos is None:
            return Cause("set.store", None, "never stored by the stream")
        return Cause(rule, pos, "not held since then, though the pool kept a copy")


class RefcountReader(Profile):
    """Copies per key: a store adds one, a removal takes one, a clear sets all to none."""

    name = "refcount"
    repeats = "another copy"
    rules = _rules(
        Rule("refcount.store", "a BlockStored adds one copy of each of its keys", KVPOOL_DOC),
        Rule("refcount.remove", "a BlockRemoved takes one copy of its key away (never below none)",
             KVPOOL_DOC),
        Rule("refcount.clear", "an AllBlocksCleared leaves no copy of any key", KVPOOL_DOC),
    )

    def __init__(self, block_sizes: dict[int, int]):
        super().__init__(block_sizes)
        self.copies: dict[Key, int] = {}
        self.stores: dict[Key, list[Position]] = {}
        self.gone: dict[Key, tuple[str, Position]] = {}

    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        kind = event["type"]
        if kind == "AllBlocksCleared":
            self.gone.update((k, ("refcount.clear", pos)) for k in self.copies)
            self.copies.clear()
            self.stores.clear()
            return []
        group = event_group(event)
        for h in event_hashes(event):
            key = (h, group)
            if kind == "BlockStored":
                self.copies[key] = self.copies.get(key, 0) + 1
                self.stores.setdefault(key, []).append(pos)
                self.gone.pop(key, None)
            elif self.copies.get(key, 0) > 0:
                self.copies[key] -= 1
                if not self.copies[key]:
                    del self.copies[key]
                    del self.stores[key]
                    self.gone[key] = ("refcount.remove", pos)
        return []

    def prefix(self, query: Query) -> int:
        return _leading(query, self.copies.__contains__)

    def explain(self, query: Query, block: int, held: bool) -> Cause:
        key = (query.hashes[block], query.group)
        if held:
            stores = self.stores.get(key, [])
            last = stores[-1] if stores else None
            return Cause("refcount.remove", last,
                         f"{len(stores)} store(s) since its copies last reached none, "
                         f"{len(stores) - self.copies.get(key, 0)} removal(s): a store that made no "
                         "new copy (a re-announced hit) is still counted")
        rule, pos = self.gone.get(key, ("refcount.store", None))
        return Cause(rule, pos, "never stored by the stream" if pos is None
                     else "no copy counted since then, though the pool holds one")
