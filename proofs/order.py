"""The free queue's ORDER, i.e. the eviction order, proven for a pool of any size.

The main abstraction (:mod:`.symbolic`) keeps the free queue as a set: order
decides which block is handed out next, not whether a state is good.  Here
the queue gets places: ``pos: Block -> Int`` for the blocks in it, read in
increasing order (head first), between ``lo`` (inclusive) and ``hi``
(exclusive).  Pushing at the tail takes place ``hi`` (and bumps it); a
``free_blocks`` call first reserves ``m`` places before the head (``lo`` moves
down by ``m``, the number of listings) and hands its unhashed arrivals the
reserved places left to right (``head`` up to ``gap``), so a batch lands at the
head *in the order given*, as in the model (a sequence of per-block head pushes
would reverse it).  The places themselves mean nothing; only their order does.

What is proven, for every step below, by induction with :func:`well_formed`:

* ``queue_well_formed`` — a real block is queued exactly when its count is 0,
  the null block never, places lie in ``[lo, hi)`` outside the reserved gap,
  and no two queued blocks share a place: the queue is a sequence in which
  each block appears once (the "once" that :mod:`.invariants` leaves out);
* ``queue_keeps_relative_order`` — blocks queued before and after a step keep
  their relative order: no operation reorders the queue;
* ``queue_follows_eviction_policy`` — a block that joins the queue joins where the
  policy says: ``free_blocks`` puts an unhashed block before every block that
  was queued before the call and after the earlier arrivals of the same call
  (head, in the order given: reused first), a cached block after every queued
  block (tail: evicted last, so the least recently freed is evicted first);
  ``unpin_blocks`` appends; no other step adds a block.

* ``allocation_takes_queue_head`` — a block leaves the queue only from its head
  (a touched one excepted): stated on the places, not taken from ``alloc``'s
  precondition, so an allocation that may take any free block is refuted.

``tests/test_proofs.py`` checks that every step here computes what the model
computes (queue order included) on random states; the BMC checks the same
properties on the executable model itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import z3  # type: ignore[import-untyped]

from kvpool.model.state import PoolState

from .concrete import _sat
from .finite import ground
from .inductive import TIMEOUT_MS, Result, in_scope, refuted, run_solver, witnessed
from .symbolic import NULL, Block, Expr

_x = z3.Const("bound.qx", Block)
_y = z3.Const("bound.qy", Block)


@dataclass(frozen=True)
class QState:
    """The queue-relevant part of a pool state, with places."""

    ref: Expr
    """Block -> Int: reference count."""
    free: Expr
    """Block -> Bool: in the free queue."""
    cached: Expr
    """Block -> Bool: caching is on and the block has a primary key (freed to the tail)."""
    pos: Expr
    """Block -> Int: the place of a queued block (meaningless for the others)."""
    lo: Expr
    """Int: no queued block before this place."""
    hi: Expr
    """Int: the next tail place."""
    head: Expr
    """Int: the next reserved head place of the current free_blocks call."""
    gap: Expr
    """Int: the end of the reserved head places (the head before the call)."""

    @classmethod
    def fresh(cls, name: str) -> QState:
        arrays = {"ref": z3.IntSort(), "free": z3.BoolSort(), "cached": z3.BoolSort(), "pos": z3.IntSort()}
        return cls(**{f: z3.Array(f"{name}.{f}", Block, sort) for f, sort in arrays.items()},
                   **{f: z3.Int(f"{name}.{f}") for f in ("lo", "hi", "head", "gap")})


def well_formed(s: QState) -> Expr:
    """The inductive invariant of the queue (see the module docstring)."""
    x, y = _x, _y
    return z3.And(
        z3.Not(s.free[NULL]),
        z3.ForAll([x], z3.Implies(x != NULL, z3.And(s.ref[x] >= 0, s.free[x] == (s.ref[x] == 0)))),
        s.lo <= s.head, s.head <= s.gap, s.gap <= s.hi,
        z3.ForAll([x], z3.Implies(s.free[x], z3.And(
            s.lo <= s.pos[x], s.pos[x] < s.hi, z3.Or(s.pos[x] < s.head, s.pos[x] >= s.gap)))),
        z3.ForAll([x, y], z3.Implies(z3.And(s.free[x], s.free[y], s.pos[x] == s.pos[y]), x == y)),
    )


def initial(name: str = "qinit") -> QState:
    """``initial_state`` of any size: every real block queued, in some order, once."""
    base = QState.fresh(name)
    return replace(base, ref=z3.K(Block, z3.IntVal(0)), free=z3.Lambda([_x], _x != NULL),
                   cached=z3.K(Block, z3.BoolVal(False)))


def initial_facts(s: QState) -> Expr:
    """What the initial places are: distinct, in ``[lo, hi)``, no reservation pending."""
    x, y = _x, _y
    return z3.And(
        s.head == s.lo, s.gap == s.lo, s.lo <= s.hi,
        z3.ForAll([x], z3.Implies(x != NULL, z3.And(s.lo <= s.pos[x], s.pos[x] < s.hi))),
        z3.ForAll([x, y], z3.Implies(z3.And(x != NULL, y != NULL, s.pos[x] == s.pos[y]), x == y)),
    )


# --------------------------------------------------------------------------
# The steps: (pre, post), as in :mod:`.transitions`.


@dataclass(frozen=True)
class QStep:
    pre: Expr
    post: QState


def alloc(s: QState, b: Expr) -> QStep:
    """``get_new_blocks``, one block: hand out the HEAD of the queue."""
    return QStep(
        pre=z3.And(b != NULL, s.free[b],
                   z3.ForAll([_x], z3.Implies(s.free[_x], s.pos[b] <= s.pos[_x]))),
        post=replace(s, ref=z3.Store(s.ref, b, 1), free=z3.Store(s.free, b, False),
                     cached=z3.Store(s.cached, b, False)),
    )


def open_batch(s: QState, m: Expr) -> QStep:
    """The start of a ``free_blocks`` call listing ``m`` blocks: reserve ``m`` head places."""
    return QStep(pre=m >= 0, post=replace(s, lo=s.lo - m, head=s.lo - m, gap=s.lo))


def release(s: QState, b: Expr) -> QStep:
    """``free_blocks``, one listing: a real block reaching 0 joins the head (next reserved
    place) if unhashed, the tail if cached."""
    r = s.ref[b] - 1
    arrives = z3.And(b != NULL, r == 0)
    to_head = z3.And(arrives, z3.Not(s.cached[b]))
    to_tail = z3.And(arrives, s.cached[b])
    return QStep(
        pre=z3.And(z3.Or(b == NULL, s.ref[b] > 0), z3.Implies(to_head, s.head < s.gap)),
        post=replace(
            s, ref=z3.Store(s.ref, b, r), free=z3.Store(s.free, b, z3.Or(s.free[b], arrives)),
            pos=z3.Store(s.pos, b, z3.If(to_head, s.head, z3.If(to_tail, s.hi, s.pos[b]))),
            head=z3.If(to_head, s.head + 1, s.head), hi=z3.If(to_tail, s.hi + 1, s.hi)),
    )


def unpin(s: QState, b: Expr) -> QStep:
    """``unpin_blocks``, one listing: a block reaching 0 joins the tail."""
    r = s.ref[b] - 1
    arrives = r == 0
    return QStep(
        pre=z3.And(b != NULL, s.ref[b] > 0),
        post=replace(s, ref=z3.Store(s.ref, b, r), free=z3.Store(s.free, b, z3.Or(s.free[b], arrives)),
                     pos=z3.Store(s.pos, b, z3.If(arrives, s.hi, s.pos[b])),
                     hi=z3.If(arrives, s.hi + 1, s.hi)),
    )


def touch(s: QState, b: Expr) -> QStep:
    """``touch``, one block: an idle real block leaves the queue; the rest stay in place."""
    leaves = z3.And(b != NULL, s.ref[b] == 0)
    return QStep(pre=z3.BoolVal(True), post=replace(
        s, ref=z3.Store(s.ref, b, s.ref[b] + 1), free=z3.Store(s.free, b, z3.And(s.free[b], z3.Not(leaves)))))


def recache(s: QState, b: Expr, c: Expr) -> QStep:
    """Any step that changes only whether ``b`` is cached (evict, cache_*, move)."""
    return QStep(pre=z3.BoolVal(True), post=replace(s, cached=z3.Store(s.cached, b, c)))


def uncache_all(s: QState) -> QStep:
    """``reset_prefix_cache``: every hash goes, the queue stays (only when nothing is in use)."""
    return QStep(pre=z3.ForAll([_x], z3.Implies(_x != NULL, s.free[_x])),
                 post=replace(s, cached=z3.K(Block, z3.BoolVal(False))))


def identity(s: QState) -> QStep:
    return QStep(pre=z3.BoolVal(True), post=s)


QStepFn = Callable[..., QStep]

QSTEPS: dict[str, tuple[QStepFn, tuple[tuple[str, z3.SortRef], ...]]] = {
    "alloc": (alloc, (("b", Block),)),
    "open_batch": (open_batch, (("m", z3.IntSort()),)),
    "release": (release, (("b", Block),)),
    "unpin": (unpin, (("b", Block),)),
    "touch": (touch, (("b", Block),)),
    "recache": (recache, (("b", Block), ("c", z3.BoolSort()))),
    "uncache_all": (uncache_all, ()),
    "identity": (identity, ()),
}
"""Every queue step: its function and argument sorts.

``free_blocks(l)`` is ``open_batch(len(l))`` then ``release`` per listing;
``get_new_blocks(n)`` is ``alloc`` n times; ``touch``/``unpin_blocks`` one step
per listing; ``evict_blocks``, ``cache_*`` and ``move_block_hashes`` are
``recache`` of the blocks whose hash they change; ``reset_prefix_cache`` is
``uncache_all``; the rest ``identity``."""


# --------------------------------------------------------------------------
# The properties.


def queue_well_formed(name: str, s: QState, post: QState, args: list[Expr]) -> Expr:
    return well_formed(post)


def queue_keeps_relative_order(name: str, s: QState, post: QState, args: list[Expr]) -> Expr:
    x, y = _x, _y
    stay = z3.And(s.free[x], s.free[y], post.free[x], post.free[y])
    return z3.ForAll([x, y], z3.Implies(stay, (s.pos[x] < s.pos[y]) == (post.pos[x] < post.pos[y])))


def queue_follows_eviction_policy(name: str, s: QState, post: QState, args: list[Expr]) -> Expr:
    x, y = _x, _y
    new = z3.And(post.free[x], z3.Not(s.free[x]))
    after_all = z3.ForAll([y], z3.Implies(s.free[y], s.pos[y] < post.pos[x]))
    head_in_order = z3.ForAll([y], z3.Implies(s.free[y], z3.And(
        z3.Implies(s.pos[y] >= s.gap, post.pos[x] < s.pos[y]),
        z3.Implies(s.pos[y] < s.head, s.pos[y] < post.pos[x]))))
    if name == "release":
        where = z3.If(s.cached[x], after_all, head_in_order)
    elif name == "unpin":
        where = after_all
    else:
        where = z3.BoolVal(False)
    return z3.ForAll([x], z3.Implies(new, where))


def allocation_takes_queue_head(name: str, s: QState, post: QState, args: list[Expr]) -> Expr:
    """A block leaves the queue only from its head, unless it is touched (a hit takes any block).

    Stated on the places before and after the step, not on the step's precondition, so an
    ``alloc`` that may take any free block is refuted; ``get_new_blocks(n)`` is ``n`` alloc
    steps, so it hands out the first ``n`` blocks in queue order."""
    if name == "touch":
        return z3.BoolVal(True)
    x, y = _x, _y
    head = z3.ForAll([y], z3.Implies(s.free[y], s.pos[x] <= s.pos[y]))
    return z3.ForAll([x], z3.Implies(z3.And(s.free[x], z3.Not(post.free[x])), head))


QProperty = Callable[[str, QState, QState, list[Expr]], Expr]

ORDER_PROPERTIES: dict[str, QProperty] = {
    f.__name__: f for f in (queue_well_formed, queue_keeps_relative_order, queue_follows_eviction_policy,
                            allocation_takes_queue_head)
}
"""The order properties, by name (each checked for every step).

``queue_keeps_relative_order``, ``queue_follows_eviction_policy`` and
``allocation_takes_queue_head`` are the model's step properties of the same
names (:mod:`kvpool.model.properties`);
``queue_well_formed`` is a lemma of the proof (:data:`LEMMAS`)."""

LEMMAS: dict[str, str] = {
    "queue_well_formed": (
        "the inductive queue invariant with places: free_queue_holds_exactly_idle_blocks, "
        "its 'once' included, plus the bookkeeping of places"),
}
"""Order properties that are lemmas of the proof rather than properties of the model."""


# --------------------------------------------------------------------------
# Checks.


QSpec = tuple[str, QStepFn, tuple[tuple[str, z3.SortRef], ...]]
"""A step to check: the name of the queue step it stands for, its function, its argument sorts."""


def _negated_goal(step: str | QSpec, prop: str) -> tuple[list[Expr], list[Expr]]:
    name, fn, sorts = (step, *QSTEPS[step]) if isinstance(step, str) else step
    s = QState.fresh("q")
    args = [z3.Const(f"{a}.q", sort) for a, sort in sorts]
    st = fn(s, *args)
    return [well_formed(s), st.pre, z3.Not(ORDER_PROPERTIES[prop](name, s, st.post, args))], args


def check_order(step: str, prop: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """Well-formed queue ∧ Pre ∧ Step ⇒ property, for one step and one property."""
    return refuted(run_solver(_negated_goal(step, prop)[0], timeout_ms))


def check_order_initial(timeout_ms: int = TIMEOUT_MS) -> Result:
    """The initial queue, whatever its size and order, is well formed."""
    s = initial()
    return refuted(run_solver([initial_facts(s), z3.Not(well_formed(s))], timeout_ms))


def check_order_enabled(step: str, timeout_ms: int = TIMEOUT_MS) -> Result:
    """The step's precondition is satisfiable with a well-formed queue (no vacuous proof)."""
    fn, sorts = QSTEPS[step]
    s = QState.fresh("q")
    st = fn(s, *[z3.Const(f"{a}.q", sort) for a, sort in sorts])
    return witnessed(run_solver([well_formed(s), st.pre], timeout_ms))


def order_matrix(timeout_ms: int = TIMEOUT_MS) -> dict[str, dict[str, Result]]:
    """Every (queue step, order property) result."""
    return {step: {p: check_order(step, p, timeout_ms) for p in ORDER_PROPERTIES} for step in QSTEPS}


def find_order_counterexample(step: QSpec, prop: str, scope: int = 4, timeout_ms: int = TIMEOUT_MS) -> Result:
    """Search a pool of at most ``scope`` blocks for a broken (seeded) step."""
    facts, args = _negated_goal(step, prop)
    blocks = [z3.Const(f"qscope.{i}", Block) for i in range(scope)]
    dom = {str(Block): blocks}
    memo: dict[int, tuple[Expr, Expr]] = {}
    closed = [z3.Or(*[t == e for e in blocks]) for t in [NULL, *args] if t.sort() == Block]
    return in_scope(run_solver([*closed, *[ground(f, dom, memo) for f in facts]], timeout_ms))


# --------------------------------------------------------------------------
# Agreement with the executable model (used by tests/test_proofs.py).


def _queued(blocks: list[Expr], m: PoolState, s: QState) -> list[Expr]:
    """``s`` has ``m``'s counts, queue membership and cachedness."""
    queued = set(m.free)
    return [fact for i, b in enumerate(blocks)
            for fact in (s.ref[b] == m.ref[i], s.free[b] == (i in queued),
                         s.cached[b] == (m.caching and m.primary[i] is not None))]


def _encode(blocks: list[Expr], m: PoolState, s: QState) -> list[Expr]:
    """Pin ``s`` to the model state ``m``: place ``i`` for the i-th queued block."""
    return [s.lo == 0, s.hi == len(m.free), s.head == 0, s.gap == 0, *_queued(blocks, m, s),
            *(s.pos[blocks[b]] == i for i, b in enumerate(m.free))]


def _expected(blocks: list[Expr], m: PoolState, s: QState) -> list[Expr]:
    """``s`` is ``m`` as far as the queue goes: counts, membership, cachedness, ORDER."""
    return [*_queued(blocks, m, s),
            *(s.pos[blocks[a]] < s.pos[blocks[c]] for a, c in itertools.pairwise(m.free))]


def compare_queue(before: PoolState, after: PoolState | None,
                  calls: Sequence[tuple[str, Sequence[Any]]]) -> tuple[bool, bool]:
    """Run queue steps on the encoding of ``before``; compare with the model's ``after``.

    ``calls`` are (step, args) with block ids as ints.  Returns (enabled: every
    precondition holds in turn, agrees: then the result is ``after``'s queue,
    in order, with its counts and cachedness; ``after`` ``None`` = refused).
    """
    blocks = [NULL, *[z3.Const(f"qblk{i}", Block) for i in range(1, before.num_blocks)]]
    cur = s = QState.fresh("qc")
    pres = []
    for name, args in calls:
        fn, sorts = QSTEPS[name]
        zargs = [blocks[a] if sort == Block else (z3.BoolVal(a) if sort == z3.BoolSort() else z3.IntVal(a))
                 for (_n, sort), a in zip(sorts, args, strict=True)]
        st = fn(cur, *zargs)
        pres.append(st.pre)
        cur = st.post
    dom = {str(Block): blocks}
    memo: dict[int, tuple[Expr, Expr]] = {}
    base = [z3.Distinct(*blocks), *_encode(blocks, before, s), *[ground(p, dom, memo) for p in pres]]
    if not _sat(base):
        return False, True
    if after is None:
        return True, True
    want = z3.And(*[ground(f, dom, memo) for f in _expected(blocks, after, cur)])
    return True, not _sat([*base, z3.Not(want)])
