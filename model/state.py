"""The abstract state of one block pool: the variables of the specification.

Blocks are numbers ``0 .. num_blocks-1``; block 0 is the null block.  Every
per-block variable is a tuple indexed by block id (a function over block ids,
in TLA+ terms).  The state is immutable: actions return a new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from .events import Event, Hash
from .request import Content

BlockId = int
Key = tuple[Hash, int]
"""An index key: a block hash and a KV-cache group id."""
Watcher = Any
"""An opaque reuse callback; compared by identity."""

NULL: BlockId = 0


@dataclass(frozen=True, slots=True)
class Primary:
    """A block's primary index key and the prefix length (tokens) it covers."""

    key: Key
    num_tokens: int


@dataclass(frozen=True, slots=True)
class PoolState:
    """Configuration (first five fields) and the variables of one pool."""

    num_blocks: int
    caching: bool
    hash_block_size: int
    events_on: bool
    medium: str

    ref: tuple[int, ...]
    """Reference count per block; block 0's count moves but means nothing."""
    free: tuple[BlockId, ...]
    """The free queue, head first: the order in which blocks are handed out."""
    primary: tuple[Primary | None, ...]
    """Per block: its primary hash key, if it is cached."""
    secondary: tuple[tuple[Key, ...], ...]
    """Per block: further (partial-prefix) keys, in insertion order."""
    index: Mapping[Key, tuple[BlockId, ...]]
    """The prefix-cache index, a multimap; a lookup returns the first block."""
    watchers: Mapping[BlockId, Watcher]
    """Reuse callbacks of unpinned blocks, in registration order."""
    events: tuple[Event, ...]
    """Events emitted and not yet taken."""
    fired: tuple[tuple[Watcher, BlockId], ...]
    """Reuse notifications delivered so far (callback, block)."""
    told: tuple[tuple[str, BlockId | None], ...]
    """What a metrics collector has been told so far, in order: ``("allocated", b)``,
    ``("accessed", b)``, ``("evicted", b)``, ``("reset", None)``."""

    holds: tuple[Content, ...]
    """Ghost: the prefix whose KV each block holds, as written by its owner."""
    names: Mapping[Key, Content]
    """Ghost: the prefix each index key stands for."""
    holders: tuple[int, ...]
    """Ghost: per block, the references callers hold, counted from the calls' arguments
    (one per block handed out or listing touched, minus one per listing freed or unpinned)."""
    announced: frozenset[tuple[Key, BlockId]]
    """Ghost: the index entries whose announcement (``BlockStored``) is live: stored and
    not yet removed or cleared.  A consumer's count of a key is the number of its entries here."""

    null_counted: bool = True
    """Whether touch/free move the null block's counter (vLLM 0.31) or skip it (0.33)."""
    boundary_partials: bool = False
    """Whether a partial entry may end at a block boundary (vLLM 0.32 on) or only inside one."""


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
        ref=(0,) * num_blocks,
        free=tuple(range(1, num_blocks)),
        primary=(None,) * num_blocks,
        secondary=((),) * num_blocks,
        index={},
        watchers={},
        events=(),
        fired=(),
        told=(),
        holds=((),) * num_blocks,
        names={},
        holders=(0,) * num_blocks,
        announced=frozenset(),
        null_counted=null_counted,
        boundary_partials=boundary_partials,
    )
