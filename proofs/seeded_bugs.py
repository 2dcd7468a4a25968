"""Broken variants of the steps, each modelled on a real block-pool failure.

They test the proofs themselves: a proof harness that "proves" a broken step
proves nothing.  Every bug must be refuted (some encoded invariant gets a
counterexample), and every encoded invariant must refute at least one bug,
so no invariant is dead weight and none is vacuously true.

The two model invariants without a z3 form (``NOT_ENCODED``) are refuted by
the bounded model checker's seeded bugs (:data:`.bmc.BUGS`), and the
free-queue order by :data:`.order.ORDER_BUGS` and the BMC's order bugs;
``tests/test_bmc.py`` checks the union: every bug refuted, every model
invariant and every BMC property refuting at least one bug.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import z3  # type: ignore[import-untyped]

from . import transitions as t
from .inductive import COUNTEREXAMPLE, SCOPE, TIMEOUT_MS, Result, find_counterexample
from .invariants import SYM_INVARIANTS
from .symbolic import EMPTY, NULL, Expr, SymState
from .transitions import Step, StepSpec


@dataclass(frozen=True)
class Bug:
    """A broken step, the correct step it mutates, and the failure it mimics."""

    step: StepSpec
    mutates: str
    story: str


def _without(pre: Expr, *dropped: Expr) -> Expr:
    """``pre`` (a conjunction) minus the conjuncts ``dropped``: a forgotten check."""
    kept = [c for c in pre.children() if not any(c.eq(d) for d in dropped)]
    assert len(kept) == len(pre.children()) - len(dropped), "a dropped check is not a conjunct"
    return z3.And(*kept)


def _free_without_refcount_check(s: SymState, b: Expr) -> Step:
    """Release with no ``ref > 0`` check: a double free drives the count to -1."""
    return Step(pre=z3.BoolVal(True), post=t.release(s, b).post)


def _free_same_block_twice(s: SymState, b: Expr) -> Step:
    """``free_blocks([b, b])`` checked once per distinct block against the state before the call.

    The loop invariant of a batch checks each listing against the running
    state; this variant checks ``ref > 0`` once, before both releases.
    """
    return Step(pre=z3.Or(b == NULL, s.ref[b] > 0), post=t.release(t.release(s, b).post, b).post)


def _evict_forgets_index(s: SymState, b: Expr) -> Step:
    """Eviction clears the block's hash fields but leaves its index entries behind."""
    d = t.drop_hashes(s, b)
    return Step(pre=z3.BoolVal(True), post=replace(d, idx=s.idx))


def _evict_keeps_secondaries(s: SymState, b: Expr) -> Step:
    """Eviction removes only the primary key; partial entries outlive it."""
    k = s.pkey[b]
    return Step(pre=z3.BoolVal(True), post=replace(
        s, prim=z3.Store(s.prim, b, False),
        idx=z3.If(s.prim[b], z3.Store(s.idx, k, b, False), s.idx)))


def _touch_leaves_block_free(s: SymState, b: Expr) -> Step:
    """A prefix hit takes a reference but leaves the idle block in the free queue."""
    return Step(pre=z3.BoolVal(True), post=replace(s, ref=z3.Store(s.ref, b, s.ref[b] + 1)))


def _free_null_into_queue(s: SymState, b: Expr) -> Step:
    """Freeing the null block puts it in the free queue (later handed out)."""
    r = s.ref[b] - 1
    return Step(pre=z3.Or(b == NULL, s.ref[b] > 0),
                post=replace(s, ref=z3.Store(s.ref, b, r),
                             free=z3.Store(s.free, b, z3.Or(s.free[b], r <= 0))))


def _cache_full_hashes_null(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> Step:
    """cache_full_blocks indexes the null block (no skip for NULL)."""
    st = t.cache_full(s, b, k, n, c)
    return Step(pre=_without(st.pre, b != NULL), post=st.post)


def _unpin_null(s: SymState, b: Expr) -> Step:
    """unpin_blocks accepts the null block and registers a watcher on it."""
    st = t.unpin(s, b)
    return Step(pre=z3.Or(b == NULL, s.ref[b] > 0), post=st.post)


def _free_hashed_not_queued(s: SymState, b: Expr) -> Step:
    """A hashed block reaching count 0 is parked outside the queue: never evictable."""
    r = s.ref[b] - 1
    return Step(pre=z3.Or(b == NULL, s.ref[b] > 0),
                post=replace(s, ref=z3.Store(s.ref, b, r),
                             free=z3.Store(s.free, b, z3.Or(
                                 s.free[b], z3.And(b != NULL, r == 0, z3.Not(s.prim[b]))))))


def _partial_kept_after_promotion(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> Step:
    """Promoting a partial entry to a full hash keeps the stale partial entry."""
    st = t.cache_full(s, b, k, n, c)
    wrote = replace(s, holds=z3.Store(s.holds, b, t.written(s.holds[b], c)))
    return Step(pre=st.pre, post=t.add_key(wrote, k, b, n, c))


def _partial_not_whole_chunks(
    s: SymState, b: Expr, k: Expr, n: Expr, c: Expr, rep: Expr,
) -> Step:
    """cache_partial_block accepts a token count that is not a multiple of hbs."""
    st = t.cache_partial(s, b, k, n, c, rep)
    return Step(pre=_without(st.pre, n % s.hbs == 0), post=st.post)


def _cache_without_caching(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> Step:
    """cache_full_blocks on a pool built without prefix caching indexes anyway."""
    st = t.cache_full(s, b, k, n, c)
    return Step(pre=_without(st.pre, s.caching), post=st.post)


def _reset_requeues_everything(s: SymState) -> Step:
    """Reset with no in-use guard that rebuilds the free queue from every real block."""
    x = z3.Const("lam.x", s.free.domain())
    st = t.reset(s)
    return Step(pre=z3.BoolVal(True), post=replace(st.post, free=z3.Lambda([x], x != NULL)))


def _alloc_keeps_old_hash(s: SymState, b: Expr) -> Step:
    """Allocation without lazy eviction: the new owner's block stays indexed (stale hit)."""
    return Step(pre=z3.And(b != NULL, s.free[b]), post=replace(
        s, ref=z3.Store(s.ref, b, 1), free=z3.Store(s.free, b, False),
        watched=z3.Store(s.watched, b, False), holds=z3.Store(s.holds, b, EMPTY)))


def _alloc_forgets_primary_only(s: SymState, b: Expr) -> Step:
    """Allocation resets the block's hash field but not the index: writable yet reachable."""
    st = _alloc_keeps_old_hash(s, b)
    return Step(pre=st.pre, post=replace(st.post, prim=z3.Store(s.prim, b, False),
                                         sec=t.drop_hashes(s, b).sec))


def _move_onto_null(s: SymState, src: Expr, dst: Expr) -> Step:
    """move_block_hashes onto the null block (no NullBlockError)."""
    st = t.move(s, src, dst)
    return Step(pre=_without(st.pre, z3.Implies(s.prim[src], dst != NULL)), post=st.post)


def _spec(step: str, fn: t.StepFn) -> StepSpec:
    return StepSpec(fn, t.STEPS[step].args)


BUGS: dict[str, Bug] = {
    "free_without_refcount_check": Bug(
        _spec("release", _free_without_refcount_check), "release",
        "double free: vLLM's free_blocks decrements without checking, the count goes negative"),
    "free_same_block_twice": Bug(
        _spec("release", _free_same_block_twice), "release",
        "the same block listed twice in one free_blocks call: the check counts it once"),
    "evict_forgets_index": Bug(
        _spec("evict", _evict_forgets_index), "evict",
        "eviction resets the block's hash but not cached_block_hash_to_block"),
    "evict_keeps_secondaries": Bug(
        _spec("evict", _evict_keeps_secondaries), "evict",
        "partial-prefix entries not removed with the primary hash"),
    "touch_leaves_block_free": Bug(
        _spec("touch", _touch_leaves_block_free), "touch",
        "a prefix-cache hit does not remove the block from the free queue"),
    "free_null_into_queue": Bug(
        _spec("release", _free_null_into_queue), "release",
        "the null block freed into the queue, then handed out as a real block"),
    "cache_full_hashes_null": Bug(
        _spec("cache_full", _cache_full_hashes_null), "cache_full",
        "the null block (sliding-window placeholder) gets hashed"),
    "unpin_null": Bug(
        _spec("unpin", _unpin_null), "unpin", "a reuse watcher registered on the null block"),
    "free_hashed_not_queued": Bug(
        _spec("release", _free_hashed_not_queued), "release",
        "idle cached blocks leak: never returned to the free queue, never evicted"),
    "partial_kept_after_promotion": Bug(
        _spec("cache_full", _partial_kept_after_promotion), "cache_full",
        "a partial entry kept after its block is promoted to a full hash"),
    "partial_not_whole_chunks": Bug(
        _spec("cache_partial", _partial_not_whole_chunks), "cache_partial",
        "a partial entry at a boundary that is not a hash-chunk multiple"),
    "cache_without_caching": Bug(
        _spec("cache_full", _cache_without_caching), "cache_full",
        "blocks indexed in a pool built with enable_caching=False"),
    "reset_requeues_everything": Bug(
        _spec("reset", _reset_requeues_everything), "reset",
        "reset while blocks are in use, rebuilding the free queue as at start"),
    "alloc_keeps_old_hash": Bug(
        _spec("alloc", _alloc_keeps_old_hash), "alloc",
        "allocation without lazy eviction: the old hash still serves the new owner's block"),
    "alloc_forgets_primary_only": Bug(
        _spec("alloc", _alloc_forgets_primary_only), "alloc",
        "allocation clears block_hash but leaves the index pointing at the block"),
    "move_onto_null": Bug(
        _spec("move", _move_onto_null), "move", "hashes moved onto the null block"),
}
"""Every seeded bug, by name.

"A counter updated before a refused check" has no z3 form here: a step is a
precondition and a post-state, and a refused call is the identity by
construction, so there is no refused outcome whose state could differ.  It is
a seeded bug of the bounded model checker instead (:data:`.bmc.BUGS`,
``counter_before_check``), which checks that refusals change nothing.
"""


def refutations(bug: str, scope: int = SCOPE, timeout_ms: int = TIMEOUT_MS) -> dict[str, Result]:
    """A counterexample search for each encoded invariant against the broken step."""
    spec = BUGS[bug].step
    return {name: find_counterexample(spec, name, scope, timeout_ms) for name in SYM_INVARIANTS}


def refuted_by(results: dict[str, Result]) -> list[str]:
    """The invariants that found a counterexample."""
    return [name for name, r in results.items() if r.status == COUNTEREXAMPLE]


@functools.cache
def refuted(bug: str) -> tuple[str, ...]:
    """The invariants refuting ``bug`` with the default scope and timeout (cached: tests share it)."""
    return tuple(refuted_by(refutations(bug)))
