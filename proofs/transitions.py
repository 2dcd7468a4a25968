"""Each model action as a z3 transition: a precondition and the next state.

A step is a function ``(s, *args) -> Step(pre, post, removed, stored)``:
``pre`` is when the model neither refuses the call nor finds a caller
contract broken (:mod:`kvpool.model.contracts`; each contract conjunct below
names its contract), ``post`` is the next :class:`SymState` as terms over
``s``, and ``removed``/``stored`` are the index entries whose removal and
announcement the step's events publish.

Batch operations are proven through their PER-BLOCK step: how each
operation splits into steps is declared with the operation
(:mod:`kvpool.model.split`, listed per operation in :data:`COVERS`).  The
model's whole-batch checks pass exactly when every per-step precondition
passes in the intermediate state.  The events
of ``cache_full_blocks`` come in another order per block (each block's
removals, then its announcement) than in the model (all removals, then one
``BlockStored``); with ``cached_once_per_call`` no block's removal names an
entry announced by the same call, so the two orders rebuild the same
index.  Induction on
the length of the batch, with ``Inv`` itself as the loop invariant: Inv holds
before the first step; each step maps an Inv-state satisfying its
precondition to an Inv-state (the proven matrix); so Inv holds after the
last step, for every n and every list.

Calls that change nothing the abstraction sees are the ``identity`` step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import z3  # type: ignore[import-untyped]

from kvpool.model import OPERATIONS

from .symbolic import EMPTY, NULL, Block, Content, Expr, KeySort, SymState, ite, prefix

_x = z3.Const("lam.x", Block)
_k = z3.Const("lam.k", KeySort)

NO_ENTRIES = z3.Lambda([_k, _x], z3.BoolVal(False))
"""The empty set of index entries (``Key x Block -> Bool``)."""


@dataclass(frozen=True)
class SymStep:
    """A transition instance: when it is enabled, what it yields, what its events say.

    ``removed``/``stored`` are sets of entries (``Key x Block -> Bool``): the
    entries the step's ``BlockRemoved`` events name and the entries its
    ``BlockStored`` announces (removals first).  A step built without them
    publishes nothing.
    """

    pre: Expr
    post: SymState
    removed: Expr = NO_ENTRIES
    stored: Expr = NO_ENTRIES


# --------------------------------------------------------------------------
# Building blocks shared by the steps (mirroring the model's helpers).


def entries_of(s: SymState, b: Expr) -> Expr:
    """The index entries of ``b``: its primary and secondary keys."""
    return z3.Lambda([_k, _x], z3.And(_x == b, s.has_key(b, _k)))


def published(s: SymState, post: SymState, removed: Expr, stored: Expr) -> SymStep:
    """``post`` with the live announcements the events leave (removals first), as a step.

    Only a pool with events on publishes; the precondition is filled in by the caller.
    """
    live = z3.Lambda([_k, _x], z3.Or(z3.And(s.live[_k, _x], z3.Not(removed[_k, _x])),
                                     stored[_k, _x]))
    return SymStep(z3.BoolVal(True), replace(post, live=z3.If(s.events, live, s.live)), removed, stored)


def with_pre(pre: Expr, st: SymStep) -> SymStep:
    """``st`` enabled when ``pre`` holds."""
    return replace(st, pre=pre)


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


def entry(k: Expr, b: Expr) -> Expr:
    """The one entry ``(k, b)`` as a set."""
    return z3.Lambda([_k, _x], z3.And(_k == k, _x == b))


def writable(s: SymState, b: Expr) -> Expr:
    """Model ``is_block_writable``: a real block its sole owner holds and no hash names."""
    return z3.And(b != NULL, s.ref[b] == 1, z3.Not(s.prim[b]))


def hashes_name_one_prefix(s: SymState, k: Expr, c: Expr) -> Expr:
    """Contract ``hashes_name_one_prefix``: a key in use already names ``c``."""
    return z3.Or(s.names[k] == c, z3.ForAll([_x], z3.Not(s.idx[k, _x])))


def writes_extend_unless_writable(s: SymState, b: Expr, c: Expr) -> Expr:
    """Contract ``writes_extend_unless_writable``: ``c`` and what ``b`` holds agree, or ``b`` is writable."""
    return z3.Or(prefix(c, s.holds[b]), prefix(s.holds[b], c), writable(s, b))


# --------------------------------------------------------------------------
# The per-block steps.


def hand(s: SymState, b: Expr, delta: int) -> Expr:
    """Ghost ``holders`` after the caller gains (``+1``) or gives back (``-1``) a reference to ``b``."""
    return z3.Store(s.holders, b, z3.If(b == NULL, s.holders[b], s.holders[b] + delta))


def alloc(s: SymState, b: Expr) -> SymStep:
    """``get_new_blocks``, one block: hand out a free real block, lazily evicting its keys."""
    d = ite(s.caching, drop_hashes(s, b), s)
    post = replace(
        d,
        ref=z3.Store(s.ref, b, 1),
        free=z3.Store(s.free, b, False),
        watched=z3.Store(s.watched, b, False),
        holds=z3.Store(s.holds, b, EMPTY),
        holders=hand(s, b, +1),
    )
    gone = z3.If(s.caching, entries_of(s, b), NO_ENTRIES)
    return with_pre(z3.And(b != NULL, s.free[b]), published(s, post, gone, NO_ENTRIES))


def release(s: SymState, b: Expr) -> SymStep:
    """``free_blocks``, one listing: drop a reference; a real block reaching 0 is queued."""
    r = s.ref[b] - 1
    return SymStep(
        pre=z3.Or(b == NULL, s.ref[b] > 0),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, r),
            free=z3.Store(s.free, b, z3.Or(s.free[b], z3.And(b != NULL, r == 0))),
            holders=hand(s, b, -1),
        ),
    )


def touch(s: SymState, b: Expr) -> SymStep:
    """``touch``, one block: take a reference; an idle real block leaves the queue."""
    leaves = z3.And(b != NULL, s.ref[b] == 0)
    return SymStep(
        pre=z3.BoolVal(True),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, s.ref[b] + 1),
            free=z3.Store(s.free, b, z3.And(s.free[b], z3.Not(leaves))),
            holders=hand(s, b, +1),
        ),
    )


def unpin(s: SymState, b: Expr) -> SymStep:
    """``unpin_blocks``, one listing: drop a reference, register a watcher; 0 is queued."""
    r = s.ref[b] - 1
    return SymStep(
        pre=z3.And(b != NULL, s.ref[b] > 0),
        post=replace(
            s,
            ref=z3.Store(s.ref, b, r),
            free=z3.Store(s.free, b, z3.Or(s.free[b], r == 0)),
            watched=z3.Store(s.watched, b, True),
            holders=hand(s, b, -1),
        ),
    )


def evict(s: SymState, b: Expr) -> SymStep:
    """``evict_blocks``, one block: remove its keys; count and queue place stay."""
    return published(s, drop_hashes(s, b), entries_of(s, b), NO_ENTRIES)


def reset(s: SymState) -> SymStep:
    """``reset_prefix_cache`` when it succeeds: every real block is free; forget all hashes.

    One ``AllBlocksCleared`` forgets every announcement (no per-entry removal).
    """
    return SymStep(
        pre=z3.ForAll([_x], z3.Implies(_x != NULL, s.free[_x])),
        post=replace(
            s,
            prim=z3.K(Block, z3.BoolVal(False)),
            sec=z3.Lambda([_x, _k], z3.BoolVal(False)),
            idx=z3.Lambda([_k, _x], z3.BoolVal(False)),
            watched=z3.K(Block, z3.BoolVal(False)),
            live=z3.If(s.events, NO_ENTRIES, s.live),
        ),
    )


def cache_full(s: SymState, b: Expr, k: Expr, t: Expr, c: Expr) -> SymStep:
    """``cache_full_blocks``, one chosen block: index ``b`` under ``k`` covering ``t`` tokens.

    ``c`` is the request's prefix of ``t`` tokens.  ``b`` must be unhashed or
    hashed at a shorter prefix (a partial entry being promoted: all its old
    entries go first).  ``t = (i+1) * block_size`` with block_size a positive
    multiple of hbs, hence ``t > 0`` and a multiple of hbs.
    """
    promoted = ite(s.prim[b], drop_hashes(s, b), s)
    wrote = replace(promoted, holds=z3.Store(s.holds, b, written(s.holds[b], c)))
    gone = z3.If(s.prim[b], entries_of(s, b), NO_ENTRIES)
    st = published(s, add_key(wrote, k, b, t, c), gone, entry(k, b))
    return with_pre(z3.And(
        s.caching, b != NULL, t > 0, t % s.hbs == 0,
        z3.Or(z3.Not(s.prim[b]), s.ptok[b] < t),
        hashes_name_one_prefix(s, k, c),
        writes_extend_unless_writable(s, b, c),
    ), st)


def cache_partial(s: SymState, b: Expr, k: Expr, t: Expr, c: Expr, rep: Expr) -> SymStep:
    """``cache_partial_block`` of a real block: add ``k`` (prefix ``c`` of ``t`` tokens).

    With ``rep`` every old entry goes and the block holds exactly ``c``; only
    its sole owner may do that.  Otherwise old entries go only if the primary
    covers fewer tokens, and ``c`` must agree with what the block holds unless
    the block is writable.
    """
    already = z3.Or(z3.And(s.prim[b], s.pkey[b] == k), s.idx[k, b])
    dropping = z3.Or(rep, z3.And(z3.Not(already), s.prim[b], s.ptok[b] < t))
    d = ite(dropping, drop_hashes(s, b), s)
    wrote = replace(d, holds=z3.Store(s.holds, b, z3.If(rep, c, written(s.holds[b], c))))
    gone = z3.If(dropping, entries_of(s, b), NO_ENTRIES)
    st = published(s, add_key(wrote, k, b, t, c), gone,
                   z3.If(z3.Or(rep, z3.Not(already)), entry(k, b), NO_ENTRIES))
    return with_pre(z3.And(
        s.caching, b != NULL, t > 0, t % s.hbs == 0,
        hashes_name_one_prefix(s, k, c),
        z3.If(rep, s.ref[b] == 1,  # replaced_by_its_sole_owner
              writes_extend_unless_writable(s, b, c)),
    ), st)


def insert(s: SymState, b: Expr, k: Expr, t: Expr, c: Expr) -> SymStep:
    """``_insert_block_hash``: a holder copied prefix ``c`` into ``b`` and indexes it under ``k``.

    ``k`` becomes the primary key (covering ``t`` tokens) if ``b`` has none,
    else a secondary one; nothing is dropped.  The pool publishes nothing: the
    caller announces the new entry itself.
    """
    already = z3.Or(z3.And(s.prim[b], s.pkey[b] == k), s.idx[k, b])
    wrote = replace(s, holds=z3.Store(s.holds, b, written(s.holds[b], c)))
    st = published(s, add_key(wrote, k, b, t, c), NO_ENTRIES, z3.If(already, NO_ENTRIES, entry(k, b)))
    return with_pre(z3.And(
        s.caching, b != NULL, z3.Or(s.prim[b], z3.And(t > 0, t % s.hbs == 0)),
        hashes_name_one_prefix(s, k, c),
        s.ref[b] >= 1,  # writes_extend_unless_writable: a holder copies into it
        writes_extend_unless_writable(s, b, c),
    ), st)


def move(s: SymState, src: Expr, dst: Expr) -> SymStep:
    """``move_block_hashes``: re-point ``src``'s entries at ``dst``, the caller's unhashed copy.

    No events: each live announcement of a moved entry now names ``dst``.
    """
    d = drop_hashes(s, src)
    moved = replace(
        d,
        prim=z3.Store(d.prim, dst, True),
        pkey=z3.Store(s.pkey, dst, s.pkey[src]),
        ptok=z3.Store(s.ptok, dst, s.ptok[src]),
        sec=z3.Lambda([_x, _k], z3.If(_x == dst, s.sec[src, _k], d.sec[_x, _k])),
        idx=z3.Lambda([_k, _x], z3.If(_x == dst, s.has_key(src, _k), d.idx[_k, _x])),
        holds=z3.Store(s.holds, dst, s.holds[src]),
        live=z3.Lambda([_k, _x], z3.If(
            _x == src, z3.And(s.live[_k, src], z3.Not(s.has_key(src, _k))),
            z3.Or(s.live[_k, _x], z3.And(_x == dst, s.has_key(src, _k), s.live[_k, src])))),
    )
    return SymStep(
        pre=z3.And(
            z3.Not(s.prim[dst]), z3.ForAll([_k], z3.Not(s.sec[dst, _k])),
            z3.Implies(s.prim[src], dst != NULL),
            z3.Implies(s.prim[src], s.ref[dst] == 1),  # moves_onto_the_callers_copy
        ),
        post=ite(s.prim[src], moved, s),
    )


def write(s: SymState, b: Expr, c: Expr) -> SymStep:
    """The caller's ``write_block``: a holder writes prefix ``c`` into ``b`` (ghost only)."""
    return SymStep(
        pre=z3.And(b != NULL, s.ref[b] >= 1, writes_extend_unless_writable(s, b, c)),
        post=replace(s, holds=z3.Store(s.holds, b, written(s.holds[b], c))),
    )


def identity(s: SymState) -> SymStep:
    """Event-only actions and calls that change nothing the abstraction sees."""
    return SymStep(pre=z3.BoolVal(True), post=s)


# --------------------------------------------------------------------------
# Registry.

StepFn = Callable[..., SymStep]


@dataclass(frozen=True)
class StepSpec:
    """A step, the sorts of its arguments (so proofs can make fresh ones) and its name."""

    fn: StepFn
    args: tuple[tuple[str, z3.SortRef], ...]
    name: str = ""
    """The step's name in :data:`STEPS` (a broken form carries the name of the step it breaks)."""

    def fresh_args(self, tag: str = "") -> list[Expr]:
        """New z3 constants for the arguments."""
        return [z3.Const(f"{name}{tag}", sort) for name, sort in self.args]


_B = z3.BoolSort()
_I = z3.IntSort()

STEPS: dict[str, StepSpec] = {name: replace(spec, name=name) for name, spec in {
    "alloc": StepSpec(alloc, (("b", Block),)),
    "release": StepSpec(release, (("b", Block),)),
    "touch": StepSpec(touch, (("b", Block),)),
    "unpin": StepSpec(unpin, (("b", Block),)),
    "evict": StepSpec(evict, (("b", Block),)),
    "reset": StepSpec(reset, ()),
    "cache_full": StepSpec(cache_full, (("b", Block), ("key", KeySort), ("t", _I), ("c", Content))),
    "cache_partial": StepSpec(
        cache_partial, (("b", Block), ("key", KeySort), ("t", _I), ("c", Content), ("rep", _B))),
    "insert": StepSpec(insert, (("b", Block), ("key", KeySort), ("t", _I), ("c", Content))),
    "move": StepSpec(move, (("src", Block), ("dst", Block))),
    "write": StepSpec(write, (("b", Block), ("c", Content))),
    "identity": StepSpec(identity, ()),
}.items()}
"""Every per-block step, by name."""

COVERS: dict[str, tuple[str, ...]] = {name: op.steps for name, op in OPERATIONS.items() if op.role != "query"}
"""Which steps make up each model operation, as its declaration says (``kvpool.model.operations``)."""
