"""The model's step properties restated over one z3 step, for any pool size.

A step property (:mod:`kvpool.model.properties`) speaks of one call: the state
before it, its arguments and what came of it.  Each one here carries the
SAME NAME as its model counterpart and says which per-block steps it speaks
of; it must hold in every state satisfying the invariants (a property about
accepted calls says so with ``Implies(pre, ...)``).  The eviction-order
properties are proven on the free queue with places (:mod:`.order`); the rest
of the model's step properties are in :data:`NOT_ENCODED_STEPS` with the reason.

The event-log pair is what makes the KV-event stream trustworthy for every
pool size: a removal names an entry whose announcement is live, an
announcement never doubles a live one, and the live announcements after the
step are the index.  A consumer's count of a key is the number of its live
entries, so these three facts mean "announcements minus removals equal the
index" after every step, per key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3  # type: ignore[import-untyped]

from .symbolic import NULL, Block, Expr, KeySort, SymState, prefix
from .transitions import STEPS, SymStep

_b = z3.Const("bound.b", Block)
_k = z3.Const("bound.k", KeySort)

StepClaim = Callable[[SymState, list[Expr], SymStep], Expr]


@dataclass(frozen=True)
class SymStepProperty:
    """A step property: the steps it speaks of (``None``: every step) and the claim."""

    steps: tuple[str, ...] | None
    claim: StepClaim


def _removals_live(s: SymState, _args: list[Expr], st: SymStep) -> Expr:
    return z3.Implies(z3.And(st.pre, s.events), z3.ForAll(
        [_k, _b], z3.Implies(st.removed[_k, _b], s.live[_k, _b])))


def _announcements_match(s: SymState, _args: list[Expr], st: SymStep) -> Expr:
    fresh = z3.ForAll([_k, _b], z3.Implies(
        st.stored[_k, _b], z3.Not(z3.And(s.live[_k, _b], z3.Not(st.removed[_k, _b])))))
    matches = z3.ForAll([_k, _b], st.post.live[_k, _b] == st.post.idx[_k, _b])
    return z3.Implies(z3.And(st.pre, s.events), z3.And(fresh, matches))


def _idle(s: SymState) -> Expr:
    return z3.ForAll([_b], z3.Implies(_b != NULL, s.ref[_b] == 0))


def _reset_guard(s: SymState, _args: list[Expr], st: SymStep) -> Expr:
    forgets = z3.And(z3.ForAll([_k, _b], z3.Not(st.post.idx[_k, _b])),
                     z3.ForAll([_b], z3.Not(st.post.watched[_b])))
    return z3.And(st.pre == _idle(s), z3.Implies(st.pre, forgets))


def _alloc_live(s: SymState, args: list[Expr], st: SymStep) -> Expr:
    b = args[0]
    return st.pre == z3.And(b != NULL, s.ref[b] == 0)


def _conflicts_refused(s: SymState, args: list[Expr], st: SymStep) -> Expr:
    b, t = args[0], args[2]
    return z3.Implies(st.pre, z3.Or(z3.Not(s.prim[b]), s.ptok[b] < t))


def _content_through_holders(s: SymState, _args: list[Expr], st: SymStep) -> Expr:
    held = z3.Or(s.holders[_b] >= 1, st.post.holders[_b] >= 1)
    return z3.Implies(st.pre, z3.ForAll([_b], z3.Implies(st.post.holds[_b] != s.holds[_b], held)))


def _shared_grows(s: SymState, _args: list[Expr], st: SymStep) -> Expr:
    return z3.Implies(st.pre, z3.ForAll([_b], z3.Implies(
        s.holders[_b] >= 2, prefix(s.holds[_b], st.post.holds[_b]))))


def _evicted_unindexed(s: SymState, args: list[Expr], st: SymStep) -> Expr:
    b = args[0]
    return z3.Implies(st.pre, z3.And(z3.Not(st.post.prim[b]), z3.ForAll(
        [_k], z3.And(z3.Not(st.post.sec[b, _k]), z3.Not(st.post.idx[_k, b])))))


SYM_STEP_PROPERTIES: dict[str, SymStepProperty] = {
    "event_removals_name_live_keys": SymStepProperty(None, _removals_live),
    "event_announcements_match_index": SymStepProperty(None, _announcements_match),
    "reset_needs_an_idle_pool": SymStepProperty(("reset",), _reset_guard),
    "allocation_succeeds_iff_enough_free": SymStepProperty(("alloc",), _alloc_live),
    "conflicting_caches_are_refused": SymStepProperty(("cache_full",), _conflicts_refused),
    "content_changes_only_through_holders": SymStepProperty(
        tuple(st for st in STEPS if st not in ("cache_full", "cache_partial")), _content_through_holders),
    "evicted_blocks_leave_the_index": SymStepProperty(("evict",), _evicted_unindexed),
    "shared_content_only_grows": SymStepProperty(None, _shared_grows),
}
"""Every encoded step property, by its model name."""

SYM_STEP_DOCS: dict[str, str] = {
    "event_removals_name_live_keys": "a removal names an entry whose announcement is live",
    "event_announcements_match_index":
        "an announcement never doubles a live one, and the live announcements after the "
        "step are exactly the index",
    "reset_needs_an_idle_pool":
        "reset is enabled exactly when no real block is referenced, and then forgets every "
        "entry and watcher",
    "allocation_succeeds_iff_enough_free":
        "a block can be handed out exactly when it is real and idle (so get_new_blocks(n) "
        "succeeds iff n blocks are idle, by induction over the batch)",
    "conflicting_caches_are_refused":
        "an accepted cache_full never re-caches a block at a prefix as long as it has",
    "content_changes_only_through_holders":
        "a block's ghost content changes only while a caller holds it, before or after the step "
        "(every step but cache_full and cache_partial, the model's CACHE_RECORDS)",
    "evicted_blocks_leave_the_index":
        "after an evict step the block has no primary, no secondary and no index entry",
    "shared_content_only_grows":
        "a block two or more callers hold keeps what it holds or extends it",
}
"""What each encoded step property says of one step, in a line."""

NOT_ENCODED_STEPS: dict[str, str] = {
    "queue_keeps_relative_order": "proven on the free queue with places (proofs/order.py)",
    "queue_follows_eviction_policy": "proven on the free queue with places (proofs/order.py)",
    "fired_watchers_were_registered": (
        "the callbacks are opaque (watched is a flag); checked by the BMC and the lockstep"),
    "changes_stay_in_footprint": (
        "each z3 step states its frame itself: it updates only the cells of the blocks and keys "
        "it is given (Store and per-block Lambdas), so no step can change another; the model's "
        "declared footprints are checked by the BMC on every transition and by the lockstep's "
        "debug mode"),
    "refused_call_changes_nothing": (
        "a refused call is not a step (its precondition fails, so no post-state exists); "
        "checked by the BMC and the lockstep"),
}
"""Model step properties with no z3 form here, and why."""


def applies(name: str, step: str) -> bool:
    """Whether step property ``name`` speaks of per-block step ``step``."""
    steps = SYM_STEP_PROPERTIES[name].steps
    return steps is None or step in steps
