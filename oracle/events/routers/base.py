"""What every router profile offers: read one event, answer a prefix query, say why.

A profile is a small re-reading of one router's indexing rules (Dynamo's radix
tree, llm-d's hash index) or of an idealised reader (``set``, ``refcount``).
It never sees the pool: it reads the KV events, in order, and answers "how
many leading blocks of this request does the engine hold?".  The checker
(:mod:`.check`) compares that answer with what the pool serves.

Every rule a profile applies is a :class:`Rule` naming the file and revision of
the router's public source it follows, so that a report can say which rule
made the router's index wrong.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

from ..kinds import Position, event_group, hash64


@dataclass(frozen=True)
class Rule:
    """One indexing rule of a router, as read from its source."""

    id: str
    does: str
    """What the router does, in one sentence."""
    source: str
    """Where it is written: repository, file and revision (or kvpool's own page)."""


class Reaction(NamedTuple):
    """An input a profile does not index as the pool meant it, at its position."""

    kind: str
    rule: str
    position: Position
    message: str


REACTION_KINDS: dict[str, str] = {
    "dropped-store": "a BlockStored the router does not index (whole or in part)",
    "unhandled": "an input the router cannot handle: it errs, panics or corrupts its index",
    "ignored-clear": "an AllBlocksCleared the router ignores",
    "restarted-chain": "a BlockStored the router indexes as the start of a new chain",
    "misread-store": "a BlockStored the router indexes under other tokens than its blocks hold",
}
"""The kinds of :class:`Reaction`, each a way the router's index departs from the stream."""


@dataclass(frozen=True)
class Query:
    """One prefix query: a request's full blocks in one KV-cache group.

    ``hashes`` are the pool's keys of those blocks (low 64 bits, as events carry
    them); the routers that key by tokens read ``tokens``, ``lora_name`` and
    ``mm`` (multimodal items: identifier, offset, length) instead.
    """

    name: str
    group: int
    block_size: int
    tokens: tuple[int, ...]
    hashes: tuple[int, ...]
    lora_name: str | None = None
    mm: tuple[tuple[str, int, int], ...] = ()

    def chunks(self, size: int) -> list[tuple[int, ...]]:
        """The query's tokens in whole chunks of ``size``."""
        return [self.tokens[i:i + size] for i in range(0, len(self.tokens) - size + 1, size)]

    def leading(self, held: Callable[[tuple[int, int]], bool]) -> int:
        """How many of its leading blocks ``held`` says are held, asked by key."""
        return next((i for i, h in enumerate(self.hashes) if not held((h, self.group))), len(self.hashes))

    def mm_in(self, start: int, end: int) -> tuple[str, ...]:
        """Identifiers of the multimodal items overlapping tokens ``[start, end)``, by offset."""
        return tuple(i for i, off, n in sorted(self.mm, key=lambda m: m[1]) if off < end and start < off + n)


@dataclass(frozen=True)
class Cause:
    """Why a profile holds (or lacks) one block: the rule, and the event that applied it."""

    rule: str
    position: Position | None
    detail: str


class Profile(ABC):
    """A router's reading of one engine's stream."""

    name: str
    """The profile's name as ``--router`` spells it (a release's options included)."""
    rules: ClassVar[Mapping[str, Rule]]
    repeats: ClassVar[str]
    """How it reads a second store of a stored key: ``"one copy"`` or ``"another copy"``."""

    def __init__(self, block_sizes: Mapping[int, int]):
        self.block_sizes = dict(block_sizes)

    @abstractmethod
    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        """Apply one validated event; return what the router did not index as meant."""

    @abstractmethod
    def prefix(self, query: Query) -> int:
        """How many leading blocks of ``query`` (at its block size) the router believes held."""

    @abstractmethod
    def explain(self, query: Query, block: int, held: bool) -> Cause:
        """Why block ``block`` of ``query`` is held (``held``) or not, by the router's rules."""

    def answers(self, group: int) -> bool:
        """Whether the router's answer is meant for this group (it reads that group's events)."""
        return True

    explains: bool = True
    """Whether it keeps what only :meth:`explain` reads (why a key went, why a store was dropped)."""

    def unasked(self) -> None:
        """No query will be asked of it (a bare stream, a live engine: only its reactions are read), so
        it keeps its index and nothing kept only to explain an answer; :meth:`explain` then refuses."""
        self.explains = False

    def _explaining(self) -> None:
        if not self.explains:
            raise RuntimeError(f"{self.name} was told no query would be asked (unasked): it kept nothing "
                               "to explain an answer with")

    cap: int = 65_536
    """How much the profile keeps to explain its answers, and of what its router would keep forever
    (:meth:`bound`)."""

    def bound(self, cap: int) -> None:
        """Keep at most ``cap`` entries in each of its bounded memories (:class:`Recent` and the like)."""
        self.cap = cap
        for value in vars(self).values():
            if isinstance(value, Recent):
                value.cap = cap

    def trim(self) -> None:
        """Cut its bounded memories back to their bound (the reading calls it every so often)."""
        for value in vars(self).values():
            if isinstance(value, Recent):
                value.trim()

    @abstractmethod
    def forget(self, key: tuple[int, int]) -> None:
        """Drop what the profile holds for a key the engine no longer holds and the checker no
        longer remembers (:class:`~..reading.Reading` calls it): memory stays bounded by the engine's
        index, not by the run's length.  Its answers on that key are no longer the router's."""


K = TypeVar("K")
V = TypeVar("V")

RECENT = 65_536
"""What a profile keeps to explain its answers (why a key went, why a store was dropped), per dict."""


class Recent(dict[K, V]):
    """A dict of what a profile keeps to explain itself: set natively (fast), cut back to its ``cap``
    oldest-first by :meth:`trim` (the reading calls it every so often)."""

    def __init__(self, cap: int = RECENT):
        super().__init__()
        self.cap = cap

    def trim(self) -> None:
        over = len(self) - self.cap
        if over > 0:
            for key in list(itertools.islice(self, over)):
                del self[key]


def event_hashes(event: dict[str, Any]) -> list[int]:
    """An event's hashes in their 64-bit integer form."""
    return [h if type(h) is int and h >= 0 else int(hash64(h)) for h in event["block_hashes"]]


def event_parent(event: dict[str, Any]) -> int | None:
    parent = event.get("parent_block_hash")
    return None if parent is None else int(hash64(parent))


def show_hash(h: int) -> str:
    return f"{h:#018x}"


KVPOOL_DOC = "kvpool oracle/TRACE_FORMAT.md"
"""The source of the idealised readers' rules: kvpool's own description of the stream."""


__all__ = ["KVPOOL_DOC", "REACTION_KINDS", "Cause", "Profile", "Query", "Reaction", "Recent",
           "Rule", "event_group", "event_hashes", "event_parent", "show_hash"]
