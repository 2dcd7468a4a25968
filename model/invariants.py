"""The invariants of the specification, each a named predicate on a state.

``INVARIANTS`` is the registry that the proofs, the oracle and the tests
enumerate; add a predicate with ``@invariant`` and it is checked everywhere.
``LEMMAS`` are predicates that follow from the invariants (each names the
ones it follows from); the proofs prove each as such, not by induction.
"""

from __future__ import annotations

from collections.abc import Callable

from .actions import get_usage
from .state import NULL, Key, PoolState

Invariant = Callable[[PoolState], bool]
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


def _real_blocks(s: PoolState) -> range:
    return range(1, s.num_blocks)


def _keys_of(s: PoolState, b: int) -> list[Key]:
    p = s.primary[b]
    return ([p.key] if p else []) + list(s.secondary[b])


@invariant
def free_queue_holds_exactly_idle_blocks(s: PoolState) -> bool:
    """A real block is in the free queue, once, exactly when nobody references it."""
    idle = {b for b in _real_blocks(s) if s.ref[b] == 0}
    return len(s.free) == len(set(s.free)) and set(s.free) == idle


@invariant
def null_block_inert(s: PoolState) -> bool:
    """The null block is never free, never hashed and never indexed."""
    return (
        NULL not in s.free
        and s.primary[NULL] is None
        and not s.secondary[NULL]
        and all(NULL not in blocks for blocks in s.index.values())
    )


@invariant
def ref_counts_non_negative(s: PoolState) -> bool:
    """No real block has a negative reference count."""
    return all(s.ref[b] >= 0 for b in _real_blocks(s))


@invariant
def index_matches_block_hashes(s: PoolState) -> bool:
    """(key, block) is indexed iff key is the block's primary or secondary key."""
    from_blocks = {(key, b) for b in range(s.num_blocks) for key in _keys_of(s, b)}
    from_index = [(key, b) for key, blocks in s.index.items() for b in blocks]
    return (
        all(s.index.values())
        and len(from_index) == len(set(from_index))
        and set(from_index) == from_blocks
    )


@lemma("free_queue_holds_exactly_idle_blocks")
def idle_hashed_block_is_evictable(s: PoolState) -> bool:
    """No hashed block with ref count 0 sits outside the free queue."""
    free = set(s.free)
    return all(
        b in free for b in _real_blocks(s) if s.ref[b] == 0 and s.primary[b] is not None
    )


@invariant
def secondary_entries_need_primary(s: PoolState) -> bool:
    """Only a block with a primary key has secondary keys, none equal to it or repeated."""
    for b in range(s.num_blocks):
        keys = s.secondary[b]
        p = s.primary[b]
        if keys and (p is None or p.key in keys or len(set(keys)) != len(keys)):
            return False
    return True


@invariant
def primary_covers_whole_chunks(s: PoolState) -> bool:
    """A primary key covers a positive whole number of hash chunks."""
    return all(
        p.num_tokens > 0 and p.num_tokens % s.hash_block_size == 0
        for p in s.primary if p is not None
    )


@invariant
def index_entries_are_sound(s: PoolState) -> bool:
    """Every index entry points at a block whose KV extends the prefix its key names."""
    for key, blocks in s.index.items():
        named = s.names.get(key)
        if named is None:
            return False
        for b in blocks:
            if s.holds[b][: len(named)] != named:
                return False
    return True


@lemma("index_matches_block_hashes", "secondary_entries_need_primary")
def writable_blocks_are_unindexed(s: PoolState) -> bool:
    """A block its sole owner may write into is not reachable from the index."""
    indexed = {b for blocks in s.index.values() for b in blocks}
    return all(
        b not in indexed
        for b in _real_blocks(s) if s.ref[b] == 1 and s.primary[b] is None
    )


@invariant
def ref_counts_equal_holders(s: PoolState) -> bool:
    """Every real block's count is the number of references its callers hold: none leaks."""
    return all(s.ref[b] == s.holders[b] for b in _real_blocks(s))


@invariant
def announcements_match_index(s: PoolState) -> bool:
    """With events on, the live announcements are exactly the index entries."""
    entries = {(key, b) for key, blocks in s.index.items() for b in blocks}
    return not s.events_on or s.announced == entries


@invariant
def usage_in_unit_interval(s: PoolState) -> bool:
    """Reported usage lies between 0 and 1."""
    return 0.0 <= get_usage(s) <= 1.0


@invariant
def watchers_only_on_real_blocks(s: PoolState) -> bool:
    """Reuse watchers are registered on real blocks only."""
    return all(1 <= b < s.num_blocks for b in s.watchers)


@invariant
def no_events_when_disabled(s: PoolState) -> bool:
    """A pool with events off has no pending events."""
    return s.events_on or not s.events


@invariant
def nothing_cached_without_caching(s: PoolState) -> bool:
    """A pool built without prefix caching indexes nothing."""
    return s.caching or not s.index


def violated(s: PoolState) -> list[str]:
    """Names of the invariants and lemmas ``s`` breaks (empty when it is a good state)."""
    return [name for name, pred in (*INVARIANTS.items(), *LEMMAS.items()) if not pred(s)]
