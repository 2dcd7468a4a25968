"""The evaluator against z3 itself: the compiled form and z3 must agree on a concrete state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import z3  # type: ignore[import-untyped]

from kvpool.model.state import PoolState

from ..concrete import Universe, _sat, encode
from ..finite import ground
from ..symbolic import Block, Content, Expr, KeySort, SymState
from ..transitions import StepSpec
from .compiled import Compiled, Predicate
from .interp import Carriers, abstract
from .runtime import Undetermined


def _z3_value(facts: list[Expr], formula: Expr) -> bool | None:
    """What z3 makes of ``formula`` given ``facts``: True, False, or ``None`` (not determined)."""
    if not _sat([*facts, z3.Not(formula)]):
        return True
    if not _sat([*facts, formula]):
        return False
    return None


def cross_check(d: Carriers, s: PoolState, spec: StepSpec | None = None, args: Sequence[Any] = (),
                compiled: Compiled | None = None,
                pred: Callable[[SymState], Expr] | None = None,
                compiled_pred: Predicate | None = None) -> list[str]:
    """Where the compiled form and z3 disagree on ``s`` (empty: nowhere).

    With ``spec``: the step's precondition (true, false or undetermined) and,
    when it holds, every defined cell of its result and its removed/stored
    sets.  With ``pred``: the predicate's value.  z3 sees ``s`` through
    :func:`kvpool.proofs.concrete.encode` (grounded over the domain), the
    compiled form through :func:`abstract`: the two encodings are checked too.
    """
    u = Universe.of([s], d.keys, d.contents)  # the same keys and contents, in the same order
    dom = u.domain()
    memo: dict[int, tuple[Expr, Expr]] = {}
    sym = SymState.fresh("x")
    facts = [*u.axioms(), *encode(u, s, sym)]
    interp = abstract(d, s)
    out: list[str] = []

    def ours(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Undetermined:
            return None

    if pred is not None and compiled_pred is not None:
        want = _z3_value(facts, ground(pred(sym), dom, memo))
        got = ours(lambda: compiled_pred(interp))
        if want is not got:
            out.append(f"predicate: z3 {want}, compiled {got}")
    if spec is None or compiled is None:
        return out
    blocks, keys, cells = u.blocks, list(u.keys.values()), list(u.contents.values())
    carrier = {str(Block): blocks, str(KeySort): keys, str(Content): cells}
    st = spec.fn(sym, *[carrier[str(sort)][v] if str(sort) in carrier
                        else z3.IntVal(v) if sort.eq(z3.IntSort()) else z3.BoolVal(v)
                        for (_n, sort), v in zip(spec.args, args, strict=True)])
    pre = ground(st.pre, dom, memo)
    want_pre = _z3_value(facts, pre)
    got_pre = ours(lambda: compiled.pre(interp, *args))
    if want_pre is not got_pre:
        out.append(f"{spec.name} pre: z3 {want_pre}, compiled {got_pre}")
    if not (want_pre and got_pre):
        return out
    post, removed, stored = compiled.post(interp, *args)
    expect = []
    for f in ("ref", "free", "prim", "pkey", "ptok", "watched", "holds", "holders"):
        for i, b in enumerate(blocks):
            v = getattr(post, f)[i]
            if v is None:
                continue
            z = getattr(st.post, f)[b]
            expect.append(z == (keys[v] if f == "pkey" else cells[v] if f == "holds" else v))
    expect += [st.post.names[k] == cells[c] for k, c in zip(keys, post.names, strict=True) if c is not None]
    for f, rel in (("sec", post.sec), ("idx", post.idx), ("live", post.live),
                   ("removed", removed), ("stored", stored)):
        arr = getattr(st.post, f) if f in ("sec", "idx", "live") else getattr(st, f)
        for i, k in enumerate(keys):
            for j, b in enumerate(blocks):
                pair = (j, i) if f == "sec" else (i, j)
                z = arr[b, k] if f == "sec" else arr[k, b]
                expect.append(z == (pair in rel))
    expect += [getattr(st.post, f) == getattr(post, f) for f in ("events", "caching", "hbs")]
    if _sat([*facts, pre, z3.Not(ground(z3.And(*expect), dom, memo))]):
        out.append(f"{spec.name} post: z3 does not give the compiled result")
    return out
