"""The invariants of the specification, each a named predicate on a state.

``INVARIANTS`` is the registry that the proofs, the oracle and the tests
enumerate; add a predicate with ``@invariant`` and it is checked everywhere.
``LEMMAS`` are predicates that follow from the invariants (each names the
ones it follows from); the proofs prove each as such, not by induction.

Each predicate quantifies over blocks and keys, and can be asked about some
of them only (``at``, an :class:`Around`): that is how the lockstep checks
the invariants on what a call touched, at the call's own cost, and on the
whole state every few calls.  With the default (:data:`EVERYWHERE`) it is
the invariant itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from .pool import get_usage, keys_of
from .request import extends
from .state import NULL, BlockId, Key, PoolState


@dataclass(frozen=True)
class Around:
    """The blocks, keys and index entries a check is asked about (``None``: all of them)."""

    blocks: Collection[BlockId] | None = None
    keys: Collection[Key] | None = None
    entries: Collection[tuple[Key, BlockId]] | None = None
    """Entries whose announcement may have changed (checked both ways)."""

    @property
    def whole(self) -> bool:
        return self.blocks is None

    def real_blocks(self, s: PoolState) -> Iterable[BlockId]:
        if self.blocks is None:
            return range(1, s.num_blocks)
        return (b for b in self.blocks if 1 <= b < s.num_blocks)

    def all_blocks(self, s: PoolState) -> Iterable[BlockId]:
        if self.blocks is None:
            return range(s.num_blocks)
        return (b for b in self.blocks if 0 <= b < s.num_blocks)

    def index_keys(self, s: PoolState) -> Iterable[Key]:
        return s.index.keys() if self.keys is None else (k for k in self.keys if k in s.index)


EVERYWHERE = Around()

Invariant = Callable[..., bool]
"""``(state, at=EVERYWHERE) -> bool``."""
INVARIANTS: dict[str, Invariant] = {}
LEMMAS: dict[str, Invariant] = {}
DERIVED_FROM: dict[str, tuple[str, ...]] = {}
"""Per lemma, the invariants it follows from."""


def invariant(pred: Invariant) -> Invariant:
    """Register ``pred`` under its name; its docstring's first line explains it."""
    INVARIANTS[pred.__name__] = pred
    return pred


def lemma(*premises: str) -> Callable[[Invariant], Invariant]:
    """Register a predicate that follows from the invariants named in ``premises``."""

    def register(pred: Invariant) -> Invariant:
        LEMMAS[pred.__name__] = pred
        DERIVED_FROM[pred.__name__] = premises
        return pred

    return register


@invariant
def free_queue_holds_exactly_idle_blocks(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """A real block is in the free queue, once, exactly when nobody references it."""
    if any((b in s.free) != (s.ref[b] == 0) for b in at.real_blocks(s)):
        return False
    return not at.whole or all(isinstance(b, int) and 1 <= b < s.num_blocks for b in s.free)


@invariant
def null_block_inert(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """The null block is never free, never hashed and never indexed."""
    return (NULL not in s.free and s.primary[NULL] is None and not s.secondary[NULL]
            and all(NULL not in s.index[k] for k in at.index_keys(s)))


@invariant
def ref_counts_non_negative(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """No real block has a negative reference count."""
    return all(s.ref[b] >= 0 for b in at.real_blocks(s))


@invariant
def index_matches_block_hashes(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """(key, block) is indexed iff key is the block's primary or secondary key."""
    for b in at.all_blocks(s):
        if any(b not in s.index.get(k, ()) for k in keys_of(s, b)):
            return False
    for k in at.index_keys(s):
        blocks = s.index[k]
        if not blocks or len(set(blocks)) != len(blocks):
            return False
        if any(not (isinstance(b, int) and 0 <= b < s.num_blocks) or k not in keys_of(s, b) for b in blocks):
            return False
    return True


@lemma("free_queue_holds_exactly_idle_blocks")
def idle_hashed_block_is_evictable(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """No hashed block with ref count 0 sits outside the free queue."""
    return all(b in s.free for b in at.real_blocks(s) if s.ref[b] == 0 and s.primary[b] is not None)


@invariant
def secondary_entries_need_primary(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """Only a block with a primary key has secondary keys, none equal to it or repeated."""
    for b in at.all_blocks(s):
        keys, p = s.secondary[b], s.primary[b]
        if keys and (p is None or p.key in keys or len(set(keys)) != len(keys)):
            return False
    return True


@invariant
def primary_covers_whole_chunks(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """A primary key covers a positive whole number of hash chunks."""
    return all(p.num_tokens > 0 and p.num_tokens % s.hash_block_size == 0
               for b in at.all_blocks(s) if (p := s.primary[b]) is not None)


@invariant
def index_entries_are_sound(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """Every index entry points at a block whose KV extends the prefix its key names."""
    for k in at.index_keys(s):
        named = s.names.get(k)
        if named is None or any(not extends(s.holds[b], named) for b in s.index[k]):
            return False
    return True


@lemma("index_matches_block_hashes", "secondary_entries_need_primary")
def writable_blocks_are_unindexed(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """A block its sole owner may write into is not reachable from the index."""
    writable = [b for b in at.real_blocks(s) if s.ref[b] == 1 and s.primary[b] is None]
    if at.whole:
        indexed = {b for blocks in s.index.values() for b in blocks}
        return not any(b in indexed for b in writable)
    keys = list(at.index_keys(s))
    return not any(b in s.index[k] for b in writable for k in keys)


@invariant
def ref_counts_equal_holders(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """Every real block's count is the number of references its callers hold: none leaks."""
    return all(s.ref[b] == s.holders[b] for b in at.real_blocks(s))


@invariant
def announcements_match_index(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """With events on, the live announcements are exactly the index entries."""
    if not s.events_on:
        return True
    if at.whole:
        return s.announced == {(k, b) for k, blocks in s.index.items() for b in blocks}
    for k, b in at.entries or ():
        if ((k, b) in s.announced) != (b in s.index.get(k, ())):
            return False
    return all((k, b) in s.announced for k in at.index_keys(s) for b in s.index[k])


@invariant
def usage_in_unit_interval(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """Reported usage lies between 0 and 1."""
    return 0.0 <= get_usage(s) <= 1.0


@invariant
def watchers_only_on_real_blocks(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """Reuse watchers are registered on real blocks only."""
    watched = s.watchers if at.whole else [b for b in at.blocks or () if b in s.watchers]
    return all(isinstance(b, int) and 1 <= b < s.num_blocks for b in watched)


@invariant
def no_events_when_disabled(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """A pool with events off has no pending events."""
    return s.events_on or not s.events


@invariant
def nothing_cached_without_caching(s: PoolState, at: Around = EVERYWHERE) -> bool:
    """A pool built without prefix caching indexes nothing."""
    return s.caching or not s.index


def violated(s: PoolState, at: Around = EVERYWHERE) -> list[str]:
    """Names of the invariants and lemmas ``s`` breaks (at ``at``; empty when it keeps them all)."""
    return [name for name, pred in (*INVARIANTS.items(), *LEMMAS.items()) if not pred(s, at)]
