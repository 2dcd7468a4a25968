"""Each model action as a z3 transition: a precondition and the next state.

A step is a function ``(s, *args) -> Step(pre, post)``: ``pre`` is when the
model does NOT raise (plus, where stated, the caller's contract) and ``post``
is the next :class:`SymState` as terms over ``s``.  The relation form
``Step(s, args, s')`` is :func:`relation`: ``pre and s' == post``.

Batch operations are proven through their PER-BLOCK step.  ``free_blocks(l)``
is ``release(b)`` for each listing in order, ``touch(l)`` is ``touch(b)`` for
each, ``unpin_blocks(l)`` is ``unpin(b)``, ``evict_blocks(l)`` is ``evict(b)``,
``get_new_blocks(n)`` is ``alloc(b)`` for n distinct free blocks (they touch
disjoint blocks, so the model's "pop all, then update each" equals the
sequence), and ``cache_full_blocks`` is ``cache_full(b, k, t, c)`` for each
chosen block (its conflict check on the running ``covered`` map is the per-step
precondition ``ptok < t``).  The model's whole-batch checks pass exactly when
every per-step precondition passes in the intermediate state.  Induction on
the length of the batch, with ``Inv`` itself as the loop invariant: Inv holds
before the first step; each step maps an Inv-state satisfying its
precondition to an Inv-state (the proven matrix); so Inv holds after the
last step, for every n and every list.

Calls that change nothing (``cache_partial_block`` of NULL, ``cache_full_blocks``
with an empty range, a refused ``reset_prefix_cache``, ``move_block_hashes``
of an unhashed source) and the event-only actions are the ``identity`` step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import z3  # type: ignore[import-untyped]

from .symbolic import EMPTY, NULL, Block, Content, Expr, Key, SymState, ite, prefix, same


@dataclass(frozen=True)
class Step:
    """A transition instance: when it is enabled and what it yields."""

    pre: Expr
    post: SymState


_x = z3.Const("lam.x", Block)
_k = z3.Const("lam.k", Key)


# --------------------------------------------------------------------------
# Building blocks shared by the steps (mirroring the model's helpers).


def drop_hashes(s: SymState, b: Expr) -> SymState:
    """Model ``_drop_hashes``: ``b`` loses its primary, secondaries and index entries."""
    return replace(
        s,
        prim=z3.Store(s.prim, b, False),
        sec=z3.Lambda([_x, _k], z3.And(_x != b, s.sec[_x, _k])),
        idx=z3.Lambda([_k, _x], z3.And(_x != b, s.idx[_k, _x])),
    )


def add_key(s: SymState, k: Expr, b: Expr, t: Expr, c: Expr) -> SymState:
    """Model ``_add_key``: index ``b`` under ``k``, as primary if it has none.

    Nothing changes (not even ``names``) when ``b`` already has ``k``.
    """
    already = z3.Or(z3.And(s.prim[b], s.pkey[b] == k), s.idx[k, b])
    as_primary = z3.Not(s.prim[b])
    added = replace(
        s,
        prim=z3.Store(s.prim, b, True),
        pkey=z3.If(as_primary, z3.Store(s.pkey, b, k), s.pkey),
        ptok=z3.If(as_primary, z3.Store(s.ptok, b, t), s.ptok),
        sec=z3.If(as_primary, s.sec, z3.Store(s.sec, b, k, True)),
        idx=z3.Store(s.idx, k, b, True),
        names=z3.Store(s.names, k, c),
    )
    return ite(already, s, added)


def written(held: Expr, c: Expr) -> Expr:
    """Model ``_write``: the block keeps what it held if ``c`` is a prefix of it."""
    return z3.If(prefix(c, held), held, c)


def key_names(s: SymState, k: Expr, c: Expr) -> Expr:
    """Caller contract (collision-free hashes): a key in use already names ``c``."""
    return z3.Or(s.names[k] == c, z3.ForAll([_x], z3.Not(s.idx[k, _x])))


# --------------------------------------------------------------------------
# The per-block steps.


def alloc(s: SymState, b: Expr) -> Step:
    """``get_new_blocks``, one block: hand out a free real block, lazily evicting its keys."""
    d = ite(s.caching, drop_hashes(s, b), s)
    return Step(
        pre=z3.And(b != NULL, s.free[b]),
        post=replace(
            d,
            ref=z3.Store(s.ref, b, 1),
            free=z3.Store(s.free, b, False),
            watched=z3.Store(s.watched, b, False),
            holds=z3.Store(s.holds, b, EMPTY),
        ),
    )


def release(s: SymState, b: Expr) -> Step:
    """``free_blocks``, one listing: drop a reference; a real block reaching 0 is queued."""
    r = s.ref[b] - 1
    return Step(
        pre=z3.Or(b == NULL, s.ref[b] > 0),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, r),
            free=z3.Store(s.free, b, z3.Or(s.free[b], z3.And(b != NULL, r == 0))),
        ),
    )


def touch(s: SymState, b: Expr) -> Step:
    """``touch``, one block: take a reference; an idle real block leaves the queue."""
    leaves = z3.And(b != NULL, s.ref[b] == 0)
    return Step(
        pre=z3.BoolVal(True),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, s.ref[b] + 1),
            free=z3.Store(s.free, b, z3.And(s.free[b], z3.Not(leaves))),
        ),
    )


def unpin(s: SymState, b: Expr) -> Step:
    """``unpin_blocks``, one listing: drop a reference, register a watcher; 0 is queued."""
    r = s.ref[b] - 1
    return Step(
        pre=z3.And(b != NULL, s.ref[b] > 0),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, r),
            free=z3.Store(s.free, b, z3.Or(s.free[b], r == 0)),
            watched=z3.Store(s.watched, b, True),
        ),
    )


def evict(s: SymState, b: Expr) -> Step:
    """``evict_blocks``, one block: remove its keys; count and queue place stay."""
    return Step(pre=z3.BoolVal(True), post=drop_hashes(s, b))


def reset(s: SymState) -> Step:
    """``reset_prefix_cache`` when it succeeds: every real block is free; forget all hashes."""
    return Step(
        pre=z3.ForAll([_x], z3.Implies(_x != NULL, s.free[_x])),
        post=replace(
            s,
            prim=z3.K(Block, z3.BoolVal(False)),
            sec=z3.Lambda([_x, _k], z3.BoolVal(False)),
            idx=z3.Lambda([_k, _x], z3.BoolVal(False)),
            watched=z3.K(Block, z3.BoolVal(False)),
        ),
    )


def cache_full(s: SymState, b: Expr, k: Expr, t: Expr, c: Expr) -> Step:
    """``cache_full_blocks``, one chosen block: index ``b`` under ``k`` covering ``t`` tokens.

    ``c`` is the request's prefix of ``t`` tokens.  ``b`` must be unhashed or
    hashed at a shorter prefix (a partial entry being promoted: all its old
    entries go first).  ``t = (i+1) * block_size`` with block_size a positive
    multiple of hbs, hence ``t > 0`` and a multiple of hbs.
    """
    promoted = ite(s.prim[b], drop_hashes(s, b), s)
    wrote = replace(promoted, holds=z3.Store(s.holds, b, written(s.holds[b], c)))
    return Step(
        pre=z3.And(
            s.caching, b != NULL, t > 0, t % s.hbs == 0,
            z3.Or(z3.Not(s.prim[b]), s.ptok[b] < t),
            key_names(s, k, c),
        ),
        post=add_key(wrote, k, b, t, c),
    )


def cache_partial(s: SymState, b: Expr, k: Expr, t: Expr, c: Expr, rep: Expr) -> Step:
    """``cache_partial_block`` of a real block: add ``k`` (prefix ``c`` of ``t`` tokens).

    With ``rep`` every old entry goes and the block holds exactly ``c``.
    Otherwise old entries go only if the primary covers fewer tokens; if any
    are KEPT, the caller contract is that ``c`` agrees with what the block
    holds (``prefix(c, holds(b))``): the model itself does not check this and
    overwrites ``holds`` while keeping the entries (see the report).
    """
    already = z3.Or(z3.And(s.prim[b], s.pkey[b] == k), s.idx[k, b])
    dropping = z3.Or(rep, z3.And(z3.Not(already), s.prim[b], s.ptok[b] < t))
    d = ite(dropping, drop_hashes(s, b), s)
    wrote = replace(d, holds=z3.Store(s.holds, b, z3.If(rep, c, written(s.holds[b], c))))
    return Step(
        pre=z3.And(
            s.caching, b != NULL, t > 0, t % s.hbs == 0,
            key_names(s, k, c),
            z3.Or(dropping, z3.Not(s.prim[b]), prefix(c, s.holds[b])),
        ),
        post=add_key(wrote, k, b, t, c),
    )


def move(s: SymState, src: Expr, dst: Expr) -> Step:
    """``move_block_hashes``: re-point ``src``'s entries at the unhashed ``dst``, a copy."""
    d = drop_hashes(s, src)
    moved = replace(
        d,
        prim=z3.Store(d.prim, dst, True),
        pkey=z3.Store(s.pkey, dst, s.pkey[src]),
        ptok=z3.Store(s.ptok, dst, s.ptok[src]),
        sec=z3.Lambda([_x, _k], z3.If(_x == dst, s.sec[src, _k], d.sec[_x, _k])),
        idx=z3.Lambda([_k, _x], z3.If(_x == dst, s.has_key(src, _k), d.idx[_k, _x])),
        holds=z3.Store(s.holds, dst, s.holds[src]),
    )
    return Step(
        pre=z3.And(
            z3.Not(s.prim[dst]), z3.ForAll([_k], z3.Not(s.sec[dst, _k])),
            z3.Implies(s.prim[src], dst != NULL),
        ),
        post=ite(s.prim[src], moved, s),
    )


def identity(s: SymState) -> Step:
    """Event-only actions and calls that change nothing the abstraction sees."""
    return Step(pre=z3.BoolVal(True), post=s)


# --------------------------------------------------------------------------
# Registry.

StepFn = Callable[..., Step]


@dataclass(frozen=True)
class StepSpec:
    """A step and the sorts of its arguments (so proofs can make fresh ones)."""

    fn: StepFn
    args: tuple[tuple[str, z3.SortRef], ...]

    def fresh_args(self, tag: str = "") -> list[Expr]:
        """New z3 constants for the arguments."""
        return [z3.Const(f"{name}{tag}", sort) for name, sort in self.args]


_B = z3.BoolSort()
_I = z3.IntSort()

STEPS: dict[str, StepSpec] = {
    "alloc": StepSpec(alloc, (("b", Block),)),
    "release": StepSpec(release, (("b", Block),)),
    "touch": StepSpec(touch, (("b", Block),)),
    "unpin": StepSpec(unpin, (("b", Block),)),
    "evict": StepSpec(evict, (("b", Block),)),
    "reset": StepSpec(reset, ()),
    "cache_full": StepSpec(cache_full, (("b", Block), ("key", Key), ("t", _I), ("c", Content))),
    "cache_partial": StepSpec(
        cache_partial, (("b", Block), ("key", Key), ("t", _I), ("c", Content), ("rep", _B))),
    "move": StepSpec(move, (("src", Block), ("dst", Block))),
    "identity": StepSpec(identity, ()),
}
"""Every per-block step, by name."""

COVERS: dict[str, tuple[str, ...]] = {
    "get_new_blocks": ("alloc",),
    "free_blocks": ("release",),
    "touch": ("touch",),
    "unpin_blocks": ("unpin",),
    "evict_blocks": ("evict",),
    "reset_prefix_cache": ("reset", "identity"),
    "cache_full_blocks": ("cache_full", "identity"),
    "cache_partial_block": ("cache_partial", "identity"),
    "move_block_hashes": ("move",),
    "emit_cached_block_events": ("identity",),
    "take_events": ("identity",),
}
"""Which steps make up each model action (by its name in ``kvpool.model.ACTIONS``)."""


def relation(s: SymState, args: list[Expr], s2: SymState, name: str) -> Expr:
    """``Step(s, args, s2)`` as a relation: enabled and ``s2`` is the next state."""
    st = STEPS[name].fn(s, *args)
    return z3.And(st.pre, same(s2, st.post))
