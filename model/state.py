"""The variables of the specification: the abstract state of one block pool.

Blocks are numbers ``0 .. num_blocks-1``; block 0 is the null block.  A
per-block variable is a list indexed by block id (a function over block ids,
in TLA+ terms); the free queue is a :class:`Queue`, a sequence of distinct
blocks.  Actions update a state in place and cost what the call touches, so
the model keeps pace with an engine-sized pool over a long run; whatever
branches from a state (the bounded model checker, the refinement, the
agreement check) takes an explicit :meth:`PoolState.copy`.

What a call tells the world besides its result (reuse notices, metrics
notices, the events it emitted) is its :class:`Output`: the caller reads it
after the call, and the next call starts a new one, so no history grows in
the state.  The pending events are the one exception, because the pool holds
them too (vLLM's ``kv_event_queue``): ``take_events`` empties them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .events import Event, Hash
from .request import EMPTY, Content

BlockId = int
Key = tuple[Hash, int]
"""An index key: a block hash and a KV-cache group id."""
Watcher = Any
"""An opaque reuse callback; compared by identity."""
Notice = tuple[str, "BlockId | None"]
"""What a metrics collector is told: ``("allocated", b)``, ``("accessed", b)``,
``("evicted", b)``, ``("reset", None)``."""

NULL: BlockId = 0


class QueuedTwice(ValueError):
    """A block was put in the free queue while in it: the queue cannot hold a block twice.

    Only a wrong action does this (the model's never do): its search reports
    it as a breach of ``free_queue_holds_exactly_idle_blocks``, whose "once"
    the queue keeps by construction.
    """

    invariant = "free_queue_holds_exactly_idle_blocks"

    def __init__(self, block: BlockId) -> None:
        super().__init__(f"block {block} is queued already: the free queue holds each block once")
        self.block = block


class Queue:
    """A sequence of distinct blocks: both ends, membership and each member's neighbours in O(1).

    The free queue, head first.  It is stored as the successor and
    predecessor of each member, so that taking the head, putting blocks at
    either end and taking one out of the middle cost nothing more than the
    blocks moved.
    """

    __slots__ = ("_after", "_before", "_head", "_seq", "_tail")

    def __init__(self, blocks: Iterable[BlockId] = ()) -> None:
        """``blocks`` in order (each at most once: :class:`QueuedTwice` otherwise)."""
        self._after: dict[BlockId, BlockId | None] = {}
        self._before: dict[BlockId, BlockId | None] = {}
        self._head: BlockId | None = None
        self._tail: BlockId | None = None
        self._seq: tuple[BlockId, ...] | None = ()
        """The members in order, kept between changes (reading is free until the next change)."""
        self.push_tail(blocks)

    def __len__(self) -> int:
        return len(self._after)

    def __contains__(self, b: object) -> bool:
        return b in self._after

    def __iter__(self) -> Iterator[BlockId]:
        return iter(self.members())

    def members(self) -> tuple[BlockId, ...]:
        """The members, head first (O(length) after a change, then free)."""
        if self._seq is None:
            out = []
            b = self._head
            while b is not None:
                out.append(b)
                b = self._after[b]
            self._seq = tuple(out)
        return self._seq

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Queue):
            return len(self) == len(other) and self.members() == other.members()
        if isinstance(other, tuple | list):
            return self.members() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Queue({list(self)})"

    def neighbours(self, b: BlockId) -> tuple[BlockId | None, BlockId | None]:
        """The members before and after ``b`` (``None`` at an end)."""
        return self._before[b], self._after[b]

    def first(self, n: int) -> list[BlockId]:
        """The first ``n`` members, head first, left in place."""
        out: list[BlockId] = []
        b = self._head
        while b is not None and len(out) < n:
            out.append(b)
            b = self._after[b]
        return out

    def take_head(self, n: int) -> list[BlockId]:
        """Remove and return the first ``n`` members."""
        taken = self.first(n)
        for b in taken:
            self.remove(b)
        return taken

    def remove(self, b: BlockId) -> None:
        """Take ``b`` out, its neighbours closing the gap."""
        self._seq = None
        before, after = self._before.pop(b), self._after.pop(b)
        if before is None:
            self._head = after
        else:
            self._after[before] = after
        if after is None:
            self._tail = before
        else:
            self._before[after] = before

    def push_tail(self, blocks: Iterable[BlockId]) -> None:
        """Append ``blocks`` in order: the last one becomes the tail."""
        for b in blocks:
            self._not_queued(b)
            self._seq = None
            self._after[b], self._before[b] = None, self._tail
            if self._tail is None:
                self._head = b
            else:
                self._after[self._tail] = b
            self._tail = b

    def push_head(self, blocks: Iterable[BlockId]) -> None:
        """Put ``blocks`` in front, in order: the first one becomes the head."""
        for b in reversed(list(blocks)):
            self._not_queued(b)
            self._seq = None
            self._after[b], self._before[b] = self._head, None
            if self._head is None:
                self._tail = b
            else:
                self._before[self._head] = b
            self._head = b

    def _not_queued(self, b: BlockId) -> None:
        if b in self._after:
            raise QueuedTwice(b)

    def copy(self) -> Queue:
        out = Queue()
        out._after, out._before = dict(self._after), dict(self._before)
        out._head, out._tail, out._seq = self._head, self._tail, self._seq
        return out


@dataclass(frozen=True, slots=True)
class Primary:
    """A block's primary index key and the prefix length (tokens) it covers."""

    key: Key
    num_tokens: int


@dataclass(slots=True)
class Output:
    """What one call tells the world besides its result, in order."""

    events: list[Event] = field(default_factory=list)
    """The events it emitted (also appended to the pending events)."""
    fired: list[tuple[Watcher, BlockId]] = field(default_factory=list)
    """The reuse notices it delivered: (callback, block)."""
    told: list[Notice] = field(default_factory=list)
    """What it told a metrics collector."""


@dataclass(eq=False)
class PoolState:
    """Configuration (the first five fields and the last two) and the variables of one pool.

    Built from plain values too (``PoolState(..., free=(1, 2), ref=(0, 0, 0), ...)``):
    every variable is taken as a fresh container, so a state never shares one
    with another (``dataclasses.replace(s, ...)`` is a copy with changes).
    """

    num_blocks: int
    caching: bool
    hash_block_size: int
    events_on: bool
    medium: str

    ref: list[int]
    """Reference count per block; block 0's count moves but means nothing."""
    free: Queue
    """The free queue, head first: the order in which blocks are handed out."""
    primary: list[Primary | None]
    """Per block: its primary hash key, if it is cached."""
    secondary: list[tuple[Key, ...]]
    """Per block: further (partial-prefix) keys, in insertion order."""
    index: dict[Key, tuple[BlockId, ...]]
    """The prefix-cache index, a multimap; a lookup returns the first block."""
    watchers: dict[BlockId, Watcher]
    """Reuse callbacks of unpinned blocks, in registration order."""
    events: list[Event]
    """Events emitted and not yet taken."""

    holds: list[Content]
    """Ghost: the prefix whose KV each block holds, as written by its owner."""
    names: dict[Key, Content]
    """Ghost: the prefix each indexed key stands for."""
    holders: list[int]
    """Ghost: per block, the references callers hold, counted from the calls' arguments
    (one per block handed out or listing touched, minus one per listing freed or unpinned)."""
    announced: set[tuple[Key, BlockId]]
    """Ghost: the index entries whose announcement (``BlockStored``) is live: stored and
    not yet removed or cleared.  A consumer's count of a key is the number of its entries here."""

    null_counted: bool = True
    """Whether touch/free move the null block's counter (vLLM 0.31) or skip it (0.33)."""
    boundary_partials: bool = False
    """Whether a partial entry may end at a block boundary (vLLM 0.32 on) or only inside one."""

    out: Output = field(default_factory=Output, repr=False)
    """What the last call told besides its result (not a variable: each call starts anew)."""

    def __post_init__(self) -> None:
        self.ref, self.primary, self.holders = list(self.ref), list(self.primary), list(self.holders)
        self.secondary, self.holds, self.events = list(self.secondary), list(self.holds), list(self.events)
        self.free = self.free.copy() if isinstance(self.free, Queue) else Queue(self.free)
        self.index, self.watchers, self.names = dict(self.index), dict(self.watchers), dict(self.names)
        self.announced = set(self.announced)
        self.out = Output()

    def copy(self) -> PoolState:
        """An independent copy (O(pool size)): for searches that branch from a state."""
        out = object.__new__(PoolState)
        for name in _CONFIG:
            setattr(out, name, getattr(self, name))
        out.ref, out.primary, out.holders = self.ref[:], self.primary[:], self.holders[:]
        out.secondary, out.holds, out.events = self.secondary[:], self.holds[:], self.events[:]
        out.free = self.free.copy()
        out.index, out.watchers, out.names = dict(self.index), dict(self.watchers), dict(self.names)
        out.announced = set(self.announced)
        out.out = Output()
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PoolState):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _COMPARED)

    __hash__ = None  # type: ignore[assignment]

    def variables(self) -> tuple[Any, ...]:
        """The variables as one hashable value, dictionary order included (a memo key)."""
        return (tuple(self.ref), self.free.members(), tuple(self.primary), tuple(self.secondary),
                tuple(self.holds), tuple(self.index.items()), tuple(self.watchers.items()),
                tuple(self.names.items()), tuple(self.holders), frozenset(self.announced))

    def emit(self, event: Event) -> None:
        """Queue ``event`` for ``take_events`` and report it as this call's."""
        self.events.append(event)
        self.out.events.append(event)

    def tell(self, what: str, b: BlockId | None) -> None:
        """Tell the metrics collector ``what`` happened to block ``b``."""
        self.out.told.append((what, b))

    def fire(self, watcher: Watcher, b: BlockId) -> None:
        """Deliver a reuse notice for ``b`` to ``watcher``."""
        self.out.fired.append((watcher, b))


_CONFIG = ("num_blocks", "caching", "hash_block_size", "events_on", "medium", "null_counted",
           "boundary_partials")
_COMPARED = (*_CONFIG, "ref", "free", "primary", "secondary", "index", "watchers", "events", "holds",
             "names", "holders", "announced")


class Reference(TypedDict):
    """The settings of :class:`PoolState` that differ between vLLM versions."""

    null_counted: bool
    boundary_partials: bool


REFERENCES: dict[str, Reference] = {
    "0.31": {"null_counted": True, "boundary_partials": False},
    "0.33": {"null_counted": False, "boundary_partials": True},
}
"""vLLM versions the model reproduces, and the settings of :class:`PoolState` each implies
(``initial_state(..., **REFERENCES[version])``)."""


def initial_state(
    num_blocks: int,
    caching: bool,
    hash_block_size: int,
    events_on: bool = False,
    medium: str = "GPU",
    null_counted: bool = True,
    boundary_partials: bool = False,
) -> PoolState:
    """A fresh pool: every block but the null block free, in id order."""
    return PoolState(
        num_blocks=num_blocks,
        caching=caching,
        hash_block_size=hash_block_size,
        events_on=events_on,
        medium=medium,
        ref=[0] * num_blocks,
        free=Queue(range(1, num_blocks)),
        primary=[None] * num_blocks,
        secondary=[()] * num_blocks,
        index={},
        watchers={},
        events=[],
        holds=[EMPTY] * num_blocks,
        names={},
        holders=[0] * num_blocks,
        announced=set(),
        null_counted=null_counted,
        boundary_partials=boundary_partials,
    )
