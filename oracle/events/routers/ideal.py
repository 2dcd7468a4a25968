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

from typing import Any, ClassVar

from ..kinds import Key, Position
from .base import KVPOOL_DOC, Cause, Profile, Query, Reaction, Recent, Rule, event_group, event_hashes


def _rules(name: str, **does: str) -> dict[str, Rule]:
    return {f"{name}.{rule}": Rule(f"{name}.{rule}", text, KVPOOL_DOC) for rule, text in does.items()}


class _KeyReader(Profile):
    """A reader of ``(hash, group_idx)`` keys: per key, the stores it counts (at most one, unless it
    ``counts`` copies), its latest store, and why it stopped being held."""

    counts: ClassVar[bool]
    """Whether each store is one more copy (``refcount``) or the key is merely held (``set``)."""

    def __init__(self, block_sizes: dict[int, int]):
        super().__init__(block_sizes)
        self.stores: dict[Key, int] = {}
        """Per held key: the stores counted, one copy each."""
        self.latest: Recent[Key, Position] = Recent()
        """Per key: its latest store (what stays counted when removals take the oldest first)."""
        self.gone: Recent[Key, tuple[str, Position]] = Recent()

    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        if event["type"] == "AllBlocksCleared":
            self.gone.update((k, (f"{self.name}.clear", pos)) for k in self.stores)
            self.stores.clear()
            return []
        group = event_group(event)
        act = self.stored if event["type"] == "BlockStored" else self.removed
        for h in event_hashes(event):
            act((h, group), pos)
        return []

    def forget(self, key: Key) -> None:
        self.stores.pop(key, None)
        self.latest.pop(key, None)
        self.gone.pop(key, None)

    def stored(self, key: Key, pos: Position) -> None:
        self.stores[key] = self.stores.get(key, 0) + 1 if self.counts else 1
        self.latest[key] = pos
        self.gone.pop(key, None)

    def removed(self, key: Key, pos: Position) -> None:
        n = self.stores.get(key)
        if n is None:
            return
        if n > 1:
            self.stores[key] = n - 1
            return
        del self.stores[key]
        self.gone[key] = (f"{self.name}.remove", pos)

    def holds(self, key: Key) -> bool:
        return key in self.stores

    def prefix(self, query: Query) -> int:
        return query.leading(self.holds)

    held_text: ClassVar[str]
    """Why a held key is held (``{n}``: the stores still counted)."""
    lost_text: ClassVar[str]
    """Why a key stored once is no longer held."""

    def explain(self, query: Query, block: int, held: bool) -> Cause:
        key = (query.hashes[block], query.group)
        if held:
            return Cause(f"{self.name}.store", self.latest.get(key),
                         self.held_text.format(n=self.stores.get(key, 0)))
        rule, pos = self.gone.get(key, (f"{self.name}.store", None))
        return Cause(rule, pos, "never stored by the stream" if pos is None else self.lost_text)


class SetReader(_KeyReader):
    """Held or not, per key: a store makes it held, a removal not, a clear nothing."""

    name = "set"
    repeats = "one copy"
    counts = False
    rules = _rules("set", store="a BlockStored makes each of its keys held",
                   remove="a BlockRemoved makes its key not held, however often it was stored",
                   clear="an AllBlocksCleared makes every key not held")
    held_text = "stored there; a store of a held key is read as the same copy"
    lost_text = "not held since then, though the pool kept a copy"


class RefcountReader(_KeyReader):
    """Copies per key: a store adds one, a removal takes one, a clear sets all to none."""

    name = "refcount"
    repeats = "another copy"
    counts = True
    rules = _rules("refcount", store="a BlockStored adds one copy of each of its keys, whether it made one "
                   "or announced a hit again",
                   remove="a BlockRemoved takes one copy of its key away (never below none)",
                   clear="an AllBlocksCleared leaves no copy of any key")
    held_text = ("{n} store(s) still counted as copies after the removals, this one the latest: a store that "
                 "made no new copy (a re-announced hit) is counted all the same")
    lost_text = "no copy counted since then, though the pool holds one"
