"""The abstract pool state for z3, over an UNBOUNDED set of blocks.

``Block``, ``Key`` and ``Content`` are uninterpreted sorts: z3 may give them any
(finite or infinite) carrier, so a proof over :class:`SymState` holds for every
pool size at once.  Block ``NULL`` is a distinguished constant.

What the abstraction keeps from :class:`kvpool.model.state.PoolState`, and what
it drops (the invariants do not depend on what is dropped):

* ``free`` is the free queue as a *set* (``Block -> Bool``).  Order decides
  which block is handed out next, not whether a state is good, so a step may
  pick *any* free block: that over-approximates the model's "take the head".
* ``primary`` becomes ``prim``/``pkey``/``ptok``; ``secondary`` and ``index``
  become relations ``sec(b, k)`` and ``idx(k, b)``.  Order and duplicates are
  gone (the model's "no duplicates" halves of two invariants are thus not
  encoded; see :data:`kvpool.proofs.invariants.NOT_ENCODED`).
* ``watchers`` becomes ``watched: Block -> Bool`` (the callbacks are opaque).
* ghosts ``holds`` and ``names`` map into ``Content``, ordered by ``prefix``,
  an uninterpreted partial order: token values never matter, only which
  prefix extends which.
* ghost ``holders`` is kept as is (``Block -> Int``).
* the event log becomes what a consumer rebuilds from it: ghost
  ``live(k, b)``, the index entries whose announcement is live (the model's
  ``announced``); a key's count of live announcements is the number of its
  entries there.  Each step names the entries its events remove and
  announce (:class:`~kvpool.proofs.transitions.SymStep`).
* the pending events themselves, ``fired``, ``medium`` and ``num_blocks``
  are not represented.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import z3  # type: ignore[import-untyped]

Expr = Any
"""A z3 expression (z3 ships no type stubs)."""

# Names of bound variables ("bound.*", "lam.*") never coincide with the names
# of fresh step arguments: z3 identifies constants by name and sort, and a
# ForAll over a constant named like a step argument would capture it.

Block = z3.DeclareSort("Block")
KeySort = z3.DeclareSort("KeySort")
Content = z3.DeclareSort("Content")

NULL = z3.Const("NULL", Block)
"""The null block (block 0 in the model)."""
EMPTY = z3.Const("EMPTY", Content)
"""The empty prefix: what a freshly handed-out block holds."""

prefix = z3.Function("prefix", Content, Content, z3.BoolSort())
"""``prefix(a, b)``: content ``a`` is a prefix of content ``b``."""


def prefix_axioms() -> list[Expr]:
    """``prefix`` is a partial order with ``EMPTY`` least: the only facts proofs may use."""
    a, b, c = z3.Consts("bound.c1 bound.c2 bound.c3", Content)
    return [
        z3.ForAll([a], prefix(a, a)),
        z3.ForAll([a, b], z3.Implies(z3.And(prefix(a, b), prefix(b, a)), a == b),
                  patterns=[z3.MultiPattern(prefix(a, b), prefix(b, a))]),
        z3.ForAll([a, b, c], z3.Implies(z3.And(prefix(a, b), prefix(b, c)), prefix(a, c)),
                  patterns=[z3.MultiPattern(prefix(a, b), prefix(b, c))]),
        z3.ForAll([a], prefix(EMPTY, a)),
    ]


@dataclass(frozen=True)
class SymState:
    """One symbolic pool state; every field is a z3 term (often an array)."""

    ref: Expr
    """Block -> Int: reference count."""
    free: Expr
    """Block -> Bool: membership in the free queue."""
    prim: Expr
    """Block -> Bool: the block has a primary key."""
    pkey: Expr
    """Block -> Key: the primary key (meaningful only where ``prim``)."""
    ptok: Expr
    """Block -> Int: tokens the primary key covers (meaningful only where ``prim``)."""
    sec: Expr
    """Block x Key -> Bool: secondary (partial-prefix) keys."""
    idx: Expr
    """Key x Block -> Bool: the prefix-cache index as a relation."""
    watched: Expr
    """Block -> Bool: a reuse watcher is registered."""
    holds: Expr
    """Block -> Content (ghost): the prefix the block's KV holds."""
    names: Expr
    """Key -> Content (ghost): the prefix a key stands for."""
    holders: Expr
    """Block -> Int (ghost): references the callers hold."""
    live: Expr
    """Key x Block -> Bool (ghost): entries whose announcement is live."""
    events: Expr
    """Bool: the pool emits KV events (constant)."""
    caching: Expr
    """Bool: the pool was built with prefix caching (constant)."""
    hbs: Expr
    """Int: the hash block size (constant, positive)."""

    @classmethod
    def fresh(cls, name: str) -> SymState:
        """A state whose every variable is a new, unconstrained z3 constant."""
        return cls(
            ref=z3.Array(f"{name}.ref", Block, z3.IntSort()),
            free=z3.Array(f"{name}.free", Block, z3.BoolSort()),
            prim=z3.Array(f"{name}.prim", Block, z3.BoolSort()),
            pkey=z3.Array(f"{name}.pkey", Block, KeySort),
            ptok=z3.Array(f"{name}.ptok", Block, z3.IntSort()),
            sec=z3.Array(f"{name}.sec", Block, KeySort, z3.BoolSort()),
            idx=z3.Array(f"{name}.idx", KeySort, Block, z3.BoolSort()),
            watched=z3.Array(f"{name}.watched", Block, z3.BoolSort()),
            holds=z3.Array(f"{name}.holds", Block, Content),
            names=z3.Array(f"{name}.names", KeySort, Content),
            holders=z3.Array(f"{name}.holders", Block, z3.IntSort()),
            live=z3.Array(f"{name}.live", KeySort, Block, z3.BoolSort()),
            events=z3.Bool(f"{name}.events"),
            caching=z3.Bool(f"{name}.caching"),
            hbs=z3.Int(f"{name}.hbs"),
        )

    def has_key(self, b: Expr, k: Expr) -> Expr:
        """``k`` is ``b``'s primary or one of its secondary keys."""
        return z3.Or(z3.And(self.prim[b], self.pkey[b] == k), self.sec[b, k])


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SymState))


def config_ok(s: SymState) -> Expr:
    """The configuration every pool has: a positive hash block size."""
    return s.hbs > 0


def ite(cond: Expr, then: SymState, other: SymState) -> SymState:
    """Field by field ``If(cond, then, other)``: a step with a no-op branch."""
    return SymState(**{f: z3.If(cond, getattr(then, f), getattr(other, f)) for f in FIELDS})


def initial(name: str = "init") -> SymState:
    """The model's ``initial_state`` for ANY number of blocks.

    Every block but ``NULL`` free with count 0 and no holder, nothing hashed,
    watched or announced, every block holding the empty prefix; ``caching``,
    ``events``, ``hbs`` and the names of keys are left free.
    """
    x = z3.Const("lam.x", Block)
    k = z3.Const("lam.k", KeySort)
    base = SymState.fresh(name)
    return SymState(
        ref=z3.K(Block, z3.IntVal(0)),
        free=z3.Lambda([x], x != NULL),
        prim=z3.K(Block, z3.BoolVal(False)),
        pkey=base.pkey,
        ptok=base.ptok,
        sec=z3.Lambda([x, k], z3.BoolVal(False)),
        idx=z3.Lambda([k, x], z3.BoolVal(False)),
        watched=z3.K(Block, z3.BoolVal(False)),
        holds=z3.K(Block, EMPTY),
        names=base.names,
        holders=z3.K(Block, z3.IntVal(0)),
        live=z3.Lambda([k, x], z3.BoolVal(False)),
        events=base.events,
        caching=base.caching,
        hbs=base.hbs,
    )
