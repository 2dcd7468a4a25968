"""The model's invariants restated over :class:`~kvpool.proofs.symbolic.SymState`.

Each predicate carries the SAME NAME as its counterpart in
:data:`kvpool.model.INVARIANTS`, so the proofs enumerate the model's registry
and a new model invariant without an encoding (or a reason in
:data:`NOT_ENCODED`) fails a test.  :data:`SYM_LEMMAS` restate the model's
lemmas, proven from the invariants they name (not by induction).
Quantifiers are plain ``ForAll`` over ``Block``/``Key``; z3 Skolemizes the
negated goal itself.
"""

from __future__ import annotations

from collections.abc import Callable

import z3  # type: ignore[import-untyped]

from .symbolic import NULL, Block, Expr, KeySort, SymState, prefix

SymInvariant = Callable[[SymState], Expr]
SYM_INVARIANTS: dict[str, SymInvariant] = {}
SYM_LEMMAS: dict[str, SymInvariant] = {}


def encoded(pred: SymInvariant) -> SymInvariant:
    """Register ``pred`` under its (model) name."""
    SYM_INVARIANTS[pred.__name__] = pred
    return pred


def encoded_lemma(pred: SymInvariant) -> SymInvariant:
    """Register a lemma under its (model) name; its premises are the model's ``DERIVED_FROM``."""
    SYM_LEMMAS[pred.__name__] = pred
    return pred


_b = z3.Const("bound.b", Block)
_k = z3.Const("bound.k", KeySort)


@encoded
def free_queue_holds_exactly_idle_blocks(s: SymState) -> Expr:
    """The free blocks are exactly the real blocks with count 0 (membership only: no order, no
    duplicates).  NULL is not free: the model's queue equals the set of idle REAL blocks."""
    return z3.And(z3.Not(s.free[NULL]),
                  z3.ForAll([_b], z3.Implies(_b != NULL, s.free[_b] == (s.ref[_b] == 0))))


@encoded
def null_block_inert(s: SymState) -> Expr:
    """NULL is never free, has no primary, no secondary and no index entry."""
    return z3.And(
        z3.Not(s.free[NULL]),
        z3.Not(s.prim[NULL]),
        z3.ForAll([_k], z3.And(z3.Not(s.sec[NULL, _k]), z3.Not(s.idx[_k, NULL]))),
    )


@encoded
def ref_counts_non_negative(s: SymState) -> Expr:
    """No real block has a negative count (NULL's count means nothing)."""
    return z3.ForAll([_b], z3.Implies(_b != NULL, s.ref[_b] >= 0))


@encoded
def index_matches_block_hashes(s: SymState) -> Expr:
    """(k, b) is indexed iff k is b's primary or secondary key."""
    return z3.ForAll([_k, _b], s.idx[_k, _b] == s.has_key(_b, _k))


@encoded_lemma
def idle_hashed_block_is_evictable(s: SymState) -> Expr:
    """A real hashed block with count 0 is in the free queue."""
    return z3.ForAll([_b], z3.Implies(
        z3.And(_b != NULL, s.ref[_b] == 0, s.prim[_b]), s.free[_b]))


@encoded
def secondary_entries_need_primary(s: SymState) -> Expr:
    """Only a block with a primary key has secondary keys, none equal to the primary."""
    return z3.ForAll([_b, _k], z3.Implies(
        s.sec[_b, _k], z3.And(s.prim[_b], s.pkey[_b] != _k)))


@encoded
def primary_covers_whole_chunks(s: SymState) -> Expr:
    """A primary key covers a positive whole number of hash chunks."""
    return z3.ForAll([_b], z3.Implies(
        s.prim[_b], z3.And(s.ptok[_b] > 0, s.ptok[_b] % s.hbs == 0)))


@encoded
def index_entries_are_sound(s: SymState) -> Expr:
    """Every entry (k, b) points at a block whose KV extends the prefix k names."""
    return z3.ForAll([_k, _b], z3.Implies(s.idx[_k, _b], prefix(s.names[_k], s.holds[_b])))


@encoded_lemma
def writable_blocks_are_unindexed(s: SymState) -> Expr:
    """A real block with count 1 and no primary is in no index entry."""
    return z3.ForAll([_k, _b], z3.Implies(
        z3.And(_b != NULL, s.ref[_b] == 1, z3.Not(s.prim[_b])), z3.Not(s.idx[_k, _b])))


@encoded
def ref_counts_equal_holders(s: SymState) -> Expr:
    """Every real block's count equals the references its callers hold."""
    return z3.ForAll([_b], z3.Implies(_b != NULL, s.ref[_b] == s.holders[_b]))


@encoded
def announcements_match_index(s: SymState) -> Expr:
    """With events on, the live announcements are exactly the index entries."""
    return z3.Implies(s.events, z3.ForAll([_k, _b], s.live[_k, _b] == s.idx[_k, _b]))


@encoded
def watchers_only_on_real_blocks(s: SymState) -> Expr:
    """NULL has no watcher (the upper bound on ids is implicit in the sort)."""
    return z3.Not(s.watched[NULL])


@encoded
def nothing_cached_without_caching(s: SymState) -> Expr:
    """Without caching the index is empty."""
    return z3.Or(s.caching, z3.ForAll([_k, _b], z3.Not(s.idx[_k, _b])))


NOT_ENCODED: dict[str, str] = {
    "usage_in_unit_interval": (
        "a statement about len(free) / (num_blocks - 1): the abstraction keeps free-queue "
        "membership, not its length or the pool size (it follows from "
        "free_queue_holds_exactly_idle_blocks plus 'no duplicates', checked by the model only)"),
    "no_events_when_disabled": (
        "the pending events are not part of the symbolic state (what they publish is: ghost "
        "live); the only event-producing branches are guarded by events_on in the model itself"),
}
"""Model invariants with no z3 counterpart, and why."""

PARTIAL: dict[str, str] = {
    "free_queue_holds_exactly_idle_blocks": "'once' (no duplicates in the queue) is not encoded",
    "index_matches_block_hashes": "'no empty lists, no duplicate entries' hold by construction",
    "secondary_entries_need_primary": "'not repeated' holds by construction (a relation)",
    "index_entries_are_sound": "'every indexed key has a name' holds by construction (names is total)",
    "watchers_only_on_real_blocks": "'id < num_blocks' holds by construction (the sort)",
}
"""Encoded invariants whose z3 form drops a conjunct the abstraction makes trivial."""


def inv(s: SymState) -> Expr:
    """The conjunction of every encoded invariant: the inductive invariant."""
    return z3.And(*[pred(s) for pred in SYM_INVARIANTS.values()])
