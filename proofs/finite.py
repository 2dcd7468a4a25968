"""Counterexample search in a finite scope, by grounding every quantifier.

Refuting a broken step means finding a model of ``Inv(s) ∧ Pre ∧ ¬inv(s')``.
Over unbounded uninterpreted sorts z3's model-based quantifier instantiation
often times out on such queries (``prefix`` transitivity, arithmetic under
quantifiers).  Here each sort gets at most ``n`` elements: every ``ForAll`` /
``Exists`` becomes a finite conjunction / disjunction over them, and only the
closure axioms ("every Block is one of these") stay quantified, which z3
decides at once.  A model found this way is a real pool with at most ``n``
blocks, keys and contents, so it is a genuine counterexample; "unsat in scope"
proves nothing and is never reported as a proof.
"""

from __future__ import annotations

import itertools

import z3  # type: ignore[import-untyped]

from .symbolic import EMPTY, NULL, Block, Content, Expr, KeySort, SymState


def domain(n: int) -> dict[str, list[Expr]]:
    """``n`` fresh elements per finite sort, by sort name."""
    return {str(s): [z3.Const(f"scope.{s}.{i}", s) for i in range(n)] for s in (Block, KeySort, Content)}


def closure(dom: dict[str, list[Expr]], s: SymState, terms: list[Expr]) -> list[Expr]:
    """The ground terms that name elements all lie in ``dom``.

    ``terms`` (the step's arguments), ``NULL``, ``EMPTY`` and every value of
    ``s``'s arrays with a finite range at a ``dom`` element: then ``dom`` is
    closed under every function of the state, so it is itself a finite pool
    state in which each grounded quantifier means exactly what it says.
    This keeps the query quantifier-free (a closure axiom "every Block is one
    of these" would bring MBQI, and its ``unknown``, back).
    """
    blocks, keys = dom[str(Block)], dom[str(KeySort)]
    named = [NULL, EMPTY, *terms]
    named += [s.pkey[b] for b in blocks] + [s.holds[b] for b in blocks]
    named += [s.names[k] for k in keys]
    return [z3.Or(*[t == e for e in dom[str(t.sort())]]) for t in named if str(t.sort()) in dom]


def ground(e: Expr, dom: dict[str, list[Expr]], memo: dict[int, tuple[Expr, Expr]] | None = None) -> Expr:
    """``e`` with every ForAll/Exists over a finite sort expanded over ``dom``.

    Lambdas are left alone: in this package they are closed array terms.
    ``memo`` maps an AST id to (input, result); holding the input keeps it
    alive, so z3 cannot recycle its id for another term.
    """
    memo = {} if memo is None else memo
    key = e.get_id()
    if key in memo:
        return memo[key][1]
    out = e
    if z3.is_quantifier(e) and not e.is_lambda():
        sorts = [str(e.var_sort(i)) for i in range(e.num_vars())]
        insts = [ground(z3.substitute_vars(e.body(), *reversed(vals)), dom, memo)
                 for vals in itertools.product(*[dom[s] for s in sorts])]
        out = z3.And(*insts) if e.is_forall() else z3.Or(*insts)
    elif z3.is_app(e) and e.num_args() > 0:
        kids = [ground(c, dom, memo) for c in e.children()]
        if any(not k.eq(c) for k, c in zip(kids, e.children(), strict=True)):
            out = e.decl()(*kids)
    memo[key] = (e, out)
    return out


def scoped(assertions: list[Expr], n: int, s: SymState, terms: list[Expr]) -> list[Expr]:
    """``assertions`` grounded over ``n`` elements per sort, closed as in :func:`closure`."""
    dom = domain(n)
    memo: dict[int, tuple[Expr, Expr]] = {}
    return [*closure(dom, s, terms), *[ground(a, dom, memo) for a in assertions]]
