"""The evaluator against z3 itself: the compiled form and z3 must agree on a concrete state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import z3  # type: ignore[import-untyped]

from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.state import PoolState

from ..concrete import Universe, _sat, encode
from ..finite import ground
from ..symbolic import EMPTY, Block, Content, Expr, KeySort, SymState
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

    u = Universe(
        blocks=Universe.of([s]).blocks,
        keys={k: z3.Const(f"key{i}", KeySort) for i, k in enumerate(d.keys)},
        contents={c: (EMPTY if c is EMPTY_PREFIX else z3.Const(f"cnt{i}", Content))
                  for i, c in enumerate(d.contents)})
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
    zargs = []
    for (_n, sort), v in zip(spec.args, args, strict=True):
        if sort.eq(Block):
            zargs.append(u.blocks[v])
        elif sort.eq(KeySort):
            zargs.append(list(u.keys.values())[v])
        elif sort.eq(Content):
            zargs.append(list(u.contents.values())[v])
        elif sort.eq(z3.IntSort()):
            zargs.append(z3.IntVal(v))
        else:
            zargs.append(z3.BoolVal(v))
    st = spec.fn(sym, *zargs)
    pre = ground(st.pre, dom, memo)
    want_pre = _z3_value(facts, pre)
    got_pre = ours(lambda: compiled.pre(interp, *args))
    if want_pre is not got_pre:
        out.append(f"{spec.name} pre: z3 {want_pre}, compiled {got_pre}")
    if not (want_pre and got_pre):
        return out
    post, removed, stored = compiled.post(interp, *args)
    blocks, keys = u.blocks, list(u.keys.values())
    cells = list(u.contents.values())
    expect = []
    for f in ("ref", "free", "prim", "pkey", "ptok", "watched", "holds", "holders"):
        for i, b in enumerate(blocks):
            v = getattr(post, f)[i]
            if v is None:
                continue
            z = getattr(st.post, f)[b]
            expect.append(z == (keys[v] if f == "pkey" else cells[v] if f == "holds" else v))
    for i, k in enumerate(keys):
        named = post.names[i]
        if named is not None:
            expect.append(st.post.names[k] == cells[named])
    for f, rel in (("sec", post.sec), ("idx", post.idx), ("live", post.live),
                   ("removed", removed), ("stored", stored)):
        arr = getattr(st.post, f) if f in ("sec", "idx", "live") else getattr(st, f)
        for i, k in enumerate(keys):
            for j, b in enumerate(blocks):
                pair = (j, i) if f == "sec" else (i, j)
                z = arr[b, k] if f == "sec" else arr[k, b]
                expect.append(z == (pair in rel))
    for f in ("events", "caching", "hbs"):
        expect.append(getattr(st.post, f) == getattr(post, f))

    if _sat([*facts, pre, z3.Not(ground(z3.And(*expect), dom, memo))]):
        out.append(f"{spec.name} post: z3 does not give the compiled result")
    return out
