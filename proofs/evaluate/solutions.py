"""Solutions of a Boolean body over a binder's variables: a quantifier or a relation built by
looping over what can make its body true, not over every tuple of its carriers (plain mode only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import z3  # type: ignore[import-untyped]

from ..symbolic import Block, Expr
from .source import Src

if TYPE_CHECKING:
    from .compiler import Compiler


def nnf(e: Expr, positive: bool = True) -> Expr:
    """``e`` (or its negation) with ``Not`` pushed down to atoms."""
    if z3.is_app(e) and not z3.is_quantifier(e):
        kind = e.decl().kind()
        kids = e.children()
        if kind == z3.Z3_OP_NOT:
            return nnf(kids[0], not positive)
        if kind in (z3.Z3_OP_AND, z3.Z3_OP_OR):
            parts = [nnf(k, positive) for k in kids]
            conj = (kind == z3.Z3_OP_AND) == positive
            return (z3.And if conj else z3.Or)(*parts) if parts else z3.BoolVal(conj)
        if kind == z3.Z3_OP_IMPLIES:
            return nnf(z3.Or(z3.Not(kids[0]), kids[1]), positive)
        if kind in (z3.Z3_OP_EQ, z3.Z3_OP_IFF) and z3.is_bool(kids[0]):
            a, b = kids
            same = z3.Or(z3.And(a, b), z3.And(z3.Not(a), z3.Not(b)))
            differ = z3.Or(z3.And(a, z3.Not(b)), z3.And(z3.Not(a), b))
            return nnf(same if positive else differ)
        if kind == z3.Z3_OP_ITE and z3.is_bool(e):
            c, a, b = kids
            return nnf(z3.Or(z3.And(c, a), z3.And(z3.Not(c), b)), positive)
        if z3.is_true(e) or z3.is_false(e):
            return z3.BoolVal(z3.is_true(e) == positive)
    return e if positive else z3.Not(e)

def dnf(e: Expr, limit: int = 16) -> list[list[Expr]] | None:
    """An NNF formula as a disjunction of conjunctions of literals (``None``: too big)."""
    if z3.is_false(e):
        return []
    if z3.is_true(e):
        return [[]]
    if z3.is_and(e):
        out: list[list[Expr]] = [[]]
        for k in e.children():
            sub = dnf(k, limit)
            if sub is None or len(out) * len(sub) > limit:
                return None
            out = [a + b for a in out for b in sub]
        return out
    if z3.is_or(e):
        acc: list[list[Expr]] = []
        for k in e.children():
            sub = dnf(k, limit)
            if sub is None or len(acc) + len(sub) > limit:
                return None
            acc += sub
        return acc
    return [[e]]

def plan(comp: Compiler, body: Expr, vs: list[str], sorts: list[z3.SortRef], env: list[Src],
         negate: bool = False) -> list[str] | None:
    """Generator clauses (``for ... in ... if ...``), one per disjunct, that bind ``vs`` to
    exactly the solutions of ``body`` (of ``Not(body)`` with ``negate``); ``None``: no plan.

    A positive literal reading a relation at the variables loops over the relation;
    an equality of a variable with a term of bound ones binds it; any other variable
    loops over its carrier.  The other literals filter, in their order, as soon as
    their variables are bound.
    """
    n = len(vs)
    disjuncts = dnf(nnf(body, not negate))
    if disjuncts is None:
        return None
    inner = env + [Src(v, True) for v in vs]

    def ours(e: Expr) -> set[int]:
        """Positions (declaration order) of the binder's variables ``e`` reads."""
        return {n - 1 - i for i in comp.free_vars(e) if i < n}

    out = []
    for conj in disjuncts:
        if any(z3.is_false(c) for c in conj):
            continue
        conj = [c for c in conj if not z3.is_true(c)]
        if any(comp.free_vars(c) and max(comp.free_vars(c)) >= n + len(env) for c in conj):
            return None
        bound: set[int] = set()
        pending = list(conj)
        clauses: list[str] = []
        while len(bound) < n:
            step = generator(comp, pending, n, bound, vs, inner, ours)
            if step is None:
                pos = next_loop(comp, pending, n, bound, sorts, ours)
                step = (f"for {vs[pos]} in {comp.carrier(sorts[pos])}", {pos}, None)
            text, newly, used = step
            clauses.append(text)
            bound |= newly
            if used is not None:
                pending.remove(used)
            ready = [c for c in pending if ours(c) <= bound]
            for c in ready:
                pending.remove(c)
                clauses.append(f"if {comp.scalar(c, inner).text}")
        clauses += [f"if {comp.scalar(c, inner).text}" for c in pending]
        out.append(" ".join(clauses))
    return out

def _pins(pending: list[Expr], n: int) -> Iterator[tuple[Expr, int, Expr]]:
    """Each literal ``x == t`` of ``pending`` with ``x`` one of the binder's ``n`` variables, either
    way round: (the literal, ``x``'s position, ``t``)."""
    for c in pending:
        if z3.is_eq(c) and not z3.is_bool(c.arg(0)):
            for x, t in ((c.arg(0), c.arg(1)), (c.arg(1), c.arg(0))):
                if z3.is_var(x) and z3.get_var_index(x) < n:
                    yield c, n - 1 - z3.get_var_index(x), t


def next_loop(comp: Compiler, pending: list[Expr], n: int, bound: set[int], sorts: list[z3.SortRef],
              ours: Callable[[Expr], set[int]]) -> int:
    """The variable to loop over: one whose value then pins another, else a block."""
    free = sorted(set(range(n)) - bound, key=lambda p: (not sorts[p].eq(Block), p))
    for p in free:
        if any(x not in bound | {p} and ours(t) <= bound | {p} for _c, x, t in _pins(pending, n)):
            return p
    return free[0]


def generator(comp: Compiler, pending: list[Expr], n: int, bound: set[int], vs: list[str],
              inner: list[Src], ours: Callable[[Expr], set[int]]
              ) -> tuple[str, set[int], Expr | None] | None:
    """The best way to bind more variables: loop over a relation, or pin by an equality."""
    for c in pending:  # a relation read at unbound variables: loop over its pairs
        if not (z3.is_select(c) and c.num_args() == 3):
            continue
        arr, *ix = c.children()
        if comp.free_vars(arr):
            continue
        free_ix = [n - 1 - z3.get_var_index(i) if z3.is_var(i) and z3.get_var_index(i) < n
                   else None for i in ix]
        if not any(p is not None and p not in bound for p in free_ix):
            continue
        targets, checks, newly = [], [], set()
        for i, p in zip(ix, free_ix, strict=True):
            if p is not None and p not in bound and p not in newly:
                targets.append(vs[p])
                newly.add(p)
            else:
                tmp = comp.var()
                targets.append(tmp)
                checks.append(f"if {tmp} == {comp.strict(comp.scalar(i, inner))}")
        text = f"for ({', '.join(targets)}) in {comp.array(arr, inner[:len(inner) - n]).build()}"
        return " ".join([text, *checks]), newly, c
    for c, p, t in _pins(pending, n):  # x == t with t over bound variables: x is t
        if p not in bound and ours(t) <= bound:
            return f"for {vs[p]} in ({comp.strict(comp.scalar(t, inner))},)", {p}, c
    return None
