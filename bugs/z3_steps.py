"""Seeded bugs as broken z3 steps: the inductive proofs must refute each.

A step is a precondition and a post-state over the symbolic pool
(:mod:`kvpool.proofs.transitions`, :mod:`kvpool.proofs.order`); each function
here is a correct step with one classic mistake.  The catalogue
(:mod:`.catalogue`) names them, tells their stories and pairs them with the
same mistake at the other layers.
"""

from __future__ import annotations

from dataclasses import replace

import z3  # type: ignore[import-untyped]

from kvpool.proofs import transitions as t
from kvpool.proofs.order import QSTEPS, QSpec, QState, QStep, alloc, release, touch, unpin
from kvpool.proofs.symbolic import EMPTY, NULL, Block, Expr, KeySort, SymState, ite
from kvpool.proofs.transitions import StepSpec, SymStep

_qx = z3.Const("bound.qx", Block)
_qk = z3.Const("bound.qk", KeySort)


def _without(pre: Expr, *dropped: Expr) -> Expr:
    """``pre`` (a conjunction) minus the conjuncts ``dropped``: a forgotten check."""
    kept = [c for c in pre.children() if not any(c.eq(d) for d in dropped)]
    assert len(kept) == len(pre.children()) - len(dropped), "a dropped check is not a conjunct"
    return z3.And(*kept)


def free_without_refcount_check(s: SymState, b: Expr) -> SymStep:
    """Release with no ``ref > 0`` check: a double free drives the count to -1."""
    return SymStep(pre=z3.BoolVal(True), post=t.release(s, b).post)


def free_same_block_twice(s: SymState, b: Expr) -> SymStep:
    """``free_blocks([b, b])`` checked once per distinct block against the state before the call.

    The loop invariant of a batch checks each listing against the running
    state; this variant checks ``ref > 0`` once, before both releases.
    """
    return SymStep(pre=z3.Or(b == NULL, s.ref[b] > 0), post=t.release(t.release(s, b).post, b).post)


def evict_forgets_index(s: SymState, b: Expr) -> SymStep:
    """Eviction clears the block's hash fields but leaves its index entries behind."""
    d = t.drop_hashes(s, b)
    return SymStep(pre=z3.BoolVal(True), post=replace(d, idx=s.idx))


def evict_keeps_secondaries(s: SymState, b: Expr) -> SymStep:
    """Eviction removes only the primary key; partial entries outlive it."""
    k = s.pkey[b]
    return SymStep(pre=z3.BoolVal(True), post=replace(
        s, prim=z3.Store(s.prim, b, False),
        idx=z3.If(s.prim[b], z3.Store(s.idx, k, b, False), s.idx)))


def touch_leaves_block_free(s: SymState, b: Expr) -> SymStep:
    """A prefix hit takes a reference but leaves the idle block in the free queue."""
    return SymStep(pre=z3.BoolVal(True), post=replace(s, ref=z3.Store(s.ref, b, s.ref[b] + 1)))


def free_null_into_queue(s: SymState, b: Expr) -> SymStep:
    """Freeing the null block puts it in the free queue (later handed out)."""
    r = s.ref[b] - 1
    return SymStep(pre=z3.Or(b == NULL, s.ref[b] > 0),
                post=replace(s, ref=z3.Store(s.ref, b, r),
                             free=z3.Store(s.free, b, z3.Or(s.free[b], r <= 0))))


def cache_full_hashes_null(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> SymStep:
    """cache_full_blocks indexes the null block (no skip for NULL)."""
    st = t.cache_full(s, b, k, n, c)
    return SymStep(pre=_without(st.pre, b != NULL), post=st.post)


def unpin_null(s: SymState, b: Expr) -> SymStep:
    """unpin_blocks accepts the null block and registers a watcher on it."""
    st = t.unpin(s, b)
    return SymStep(pre=z3.Or(b == NULL, s.ref[b] > 0), post=st.post)


def free_hashed_not_queued(s: SymState, b: Expr) -> SymStep:
    """A hashed block reaching count 0 is parked outside the queue: never evictable."""
    r = s.ref[b] - 1
    return SymStep(pre=z3.Or(b == NULL, s.ref[b] > 0),
                post=replace(s, ref=z3.Store(s.ref, b, r),
                             free=z3.Store(s.free, b, z3.Or(
                                 s.free[b], z3.And(b != NULL, r == 0, z3.Not(s.prim[b]))))))


def partial_kept_after_promotion(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> SymStep:
    """Promoting a partial entry to a full hash keeps the stale partial entry."""
    st = t.cache_full(s, b, k, n, c)
    wrote = replace(s, holds=z3.Store(s.holds, b, t.written(s.holds[b], c)))
    return SymStep(pre=st.pre, post=t.add_key(wrote, k, b, n, c))


def partial_not_whole_chunks(
    s: SymState, b: Expr, k: Expr, n: Expr, c: Expr, rep: Expr,
) -> SymStep:
    """cache_partial_block accepts a token count that is not a multiple of hbs."""
    st = t.cache_partial(s, b, k, n, c, rep)
    return SymStep(pre=_without(st.pre, n % s.hbs == 0), post=st.post)


def cache_without_caching(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> SymStep:
    """cache_full_blocks on a pool built without prefix caching indexes anyway."""
    st = t.cache_full(s, b, k, n, c)
    return SymStep(pre=_without(st.pre, s.caching), post=st.post)


def reset_while_in_use(s: SymState) -> SymStep:
    """Reset with no in-use guard that rebuilds the free queue from every real block."""
    x = z3.Const("lam.x", s.free.domain())
    st = t.reset(s)
    return SymStep(pre=z3.BoolVal(True), post=replace(st.post, free=z3.Lambda([x], x != NULL)))


def alloc_keeps_old_hash(s: SymState, b: Expr) -> SymStep:
    """Allocation without lazy eviction: the new owner's block stays indexed (stale hit)."""
    return SymStep(pre=z3.And(b != NULL, s.free[b]), post=replace(
        s, ref=z3.Store(s.ref, b, 1), free=z3.Store(s.free, b, False),
        watched=z3.Store(s.watched, b, False), holds=z3.Store(s.holds, b, EMPTY)))


def alloc_forgets_primary_only(s: SymState, b: Expr) -> SymStep:
    """Allocation resets the block's hash field but not the index: writable yet reachable."""
    st = alloc_keeps_old_hash(s, b)
    return SymStep(pre=st.pre, post=replace(st.post, prim=z3.Store(s.prim, b, False),
                                         sec=t.drop_hashes(s, b).sec))


def move_onto_null(s: SymState, src: Expr, dst: Expr) -> SymStep:
    """move_block_hashes onto the null block (no NullBlockError)."""
    st = t.move(s, src, dst)
    return SymStep(pre=_without(st.pre, z3.Implies(s.prim[src], dst != NULL)), post=st.post)



def insert_indexes_null(s: SymState, b: Expr, k: Expr, tk: Expr, c: Expr) -> SymStep:
    """_insert_block_hash without the null-block check (as vLLM's own has none)."""
    st = t.insert(s, b, k, tk, c)
    return SymStep(pre=_without(st.pre, b != NULL), post=st.post, removed=st.removed, stored=st.stored)


def insert_overwrites_primary(s: SymState, b: Expr, k: Expr, tk: Expr, c: Expr) -> SymStep:
    """_insert_block_hash makes the key the block's primary even when it has one: the old
    primary stays in the index, naming a block that no longer owns it."""
    st = t.insert(s, b, k, tk, c)
    already = z3.Or(z3.And(s.prim[b], s.pkey[b] == k), s.idx[k, b])
    post = replace(st.post, pkey=z3.If(already, st.post.pkey, z3.Store(s.pkey, b, k)),
                   ptok=z3.If(already, st.post.ptok, z3.Store(s.ptok, b, tk)),
                   sec=z3.If(already, st.post.sec, s.sec))
    return SymStep(pre=st.pre, post=post, removed=st.removed, stored=st.stored)


def unpin_keeps_reference(s: SymState, b: Expr) -> SymStep:
    """unpin_blocks registers the watcher but keeps the reference: the block leaks."""
    st = t.unpin(s, b)
    return SymStep(pre=st.pre, post=replace(st.post, ref=s.ref, free=s.free))


def alloc_refuses_last_block(s: SymState, b: Expr) -> SymStep:
    """Allocation checks ``n >= free`` (off by one): the last free block is never handed out."""
    st = t.alloc(s, b)
    other = z3.Exists([_qx], z3.And(_qx != NULL, _qx != b, s.free[_qx]))
    return replace(st, pre=z3.And(st.pre, other))


def cache_full_without_conflict_check(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> SymStep:
    """cache_full_blocks re-caches a block already cached at a prefix as long."""
    st = t.cache_full(s, b, k, n, c)
    return replace(st, pre=_without(st.pre, z3.Or(z3.Not(s.prim[b]), s.ptok[b] < n)))


def reset_forgets_blocks_in_use(s: SymState) -> SymStep:
    """Reset with no in-use guard: hashes and watchers of blocks in use are forgotten."""
    return replace(t.reset(s), pre=z3.BoolVal(True))


def evict_without_events(s: SymState, b: Expr) -> SymStep:
    """Eviction publishes no BlockRemoved: a router keeps counting the evicted entries."""
    return SymStep(pre=z3.BoolVal(True), post=t.drop_hashes(s, b))


def evict_removes_stale_key(s: SymState, b: Expr) -> SymStep:
    """Eviction publishes a BlockRemoved for the key the block's stale hash field names, hashed or not."""
    st = t.evict(s, b)
    stale = z3.Lambda([_qk, _qx], z3.And(_qx == b, _qk == s.pkey[b]))
    return replace(t.published(s, st.post, z3.Lambda([_qk, _qx], z3.Or(
        st.removed[_qk, _qx], stale[_qk, _qx])), t.NO_ENTRIES), pre=st.pre)


def partial_write_over_hashed_block(
    s: SymState, b: Expr, k: Expr, n: Expr, c: Expr, rep: Expr,
) -> SymStep:
    """cache_partial_block takes another request's prefix into a hashed block and keeps its entries."""
    st = t.cache_partial(s, b, k, n, c, rep)
    kids = st.pre.children()
    return replace(st, pre=z3.And(*kids[:-1], z3.Implies(rep, s.ref[b] == 1)))


def owner_overwrites_hashed_block(s: SymState, b: Expr, c: Expr) -> SymStep:
    """The owner writes new KV into a block the index still names (it trusted its own count)."""
    st = t.write(s, b, c)
    return replace(st, pre=z3.And(b != NULL, s.ref[b] == 1))


def collisions_accepted(s: SymState, b: Expr, k: Expr, n: Expr, c: Expr) -> SymStep:
    """A key already naming one prefix is indexed for another: a hit serves the wrong KV."""
    st = t.cache_full(s, b, k, n, c)
    return replace(st, pre=_without(st.pre, t.hashes_name_one_prefix(s, k, c)))


def insert_into_unheld_block(s: SymState, b: Expr, k: Expr, tk: Expr, c: Expr) -> SymStep:
    """_insert_block_hash accepts a block nobody holds: the index names KV no caller copied."""
    st = t.insert(s, b, k, tk, c)
    return replace(st, pre=_without(st.pre, s.ref[b] >= 1))


def replace_by_a_sharer(s: SymState, b: Expr, k: Expr, tk: Expr, c: Expr, rep: Expr) -> SymStep:
    """cache_partial_block replaces a block's contents for any holder, not its sole owner."""
    st = t.cache_partial(s, b, k, tk, c, rep)
    kids = st.pre.children()
    return replace(st, pre=z3.And(*kids[:-1], z3.If(rep, s.ref[b] >= 1, kids[-1].children()[2])))


def move_onto_a_shared_block(s: SymState, src: Expr, dst: Expr) -> SymStep:
    """move_block_hashes copies onto a block others hold too: their KV is overwritten."""
    st = t.move(s, src, dst)
    return replace(st, pre=_without(st.pre, z3.Implies(s.prim[src], s.ref[dst] == 1)))


def evict_spares_blocks_in_use(s: SymState, b: Expr) -> SymStep:
    """evict_blocks skips a block someone holds: its entries outlive the eviction."""
    st = t.evict(s, b)
    return replace(st, post=ite(s.ref[b] > 0, s, st.post),
                   removed=z3.If(s.ref[b] > 0, t.NO_ENTRIES, st.removed))


# --------------------------------------------------------------------------
# The free queue with places (the eviction order).


def free_hashed_to_head(s: QState, b: Expr) -> QStep:
    """Freed cached blocks go to the head like unhashed ones: the freshest prefix is evicted first."""
    st = release(replace(s, cached=z3.K(Block, z3.BoolVal(False))), b)
    return QStep(pre=st.pre, post=replace(st.post, cached=s.cached))


def touch_swap_remove(s: QState, b: Expr, tail: Expr) -> QStep:
    """A hit block leaves an array-backed free list by swap-with-last: the tail block ``tail`` jumps
    into its place."""
    st = touch(s, b)
    leaves = z3.And(b != NULL, s.ref[b] == 0)
    is_tail = z3.And(s.free[tail], z3.ForAll([_qx], z3.Implies(s.free[_qx], s.pos[_qx] <= s.pos[tail])))
    return QStep(pre=z3.Implies(leaves, is_tail),
                 post=replace(st.post, pos=z3.If(leaves, z3.Store(s.pos, tail, s.pos[b]), s.pos)))


def unpin_reuses_tail_place(s: QState, b: Expr) -> QStep:
    """unpin_blocks appends at the last used place instead of a new one (off by one)."""
    st = unpin(s, b)
    return QStep(pre=st.pre, post=replace(st.post, pos=z3.Store(
        s.pos, b, z3.If(s.ref[b] == 1, s.hi - 1, s.pos[b]))))


def alloc_takes_any_free_block(s: QState, b: Expr) -> QStep:
    """get_new_blocks takes any free block, not the head: the eviction order means nothing."""
    st = alloc(s, b)
    return QStep(pre=z3.And(b != NULL, s.free[b]), post=st.post)


QUEUE_ARGS = {"touch_swap_remove": (("b", Block), ("t", Block))}
"""Queue forms that take other arguments than the step they break: the block hit and the tail."""


def step(name: str, fn: t.StepFn) -> StepSpec:
    """A broken form of the per-block step ``name`` (same argument sorts)."""
    return StepSpec(fn, t.STEPS[name].args, name)


def queue_step(name: str, fn: object, sorts: tuple[tuple[str, z3.SortRef], ...] | None = None) -> QSpec:
    """A broken form of the queue step ``name``; ``sorts`` when it takes other arguments."""
    return (name, fn, sorts if sorts is not None else QSTEPS[name][1])  # type: ignore[return-value]
