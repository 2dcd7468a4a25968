"""A z3 counterexample drawn as two pictures of a pool: before and after the step.

An unbounded proof's counterexample is a model over uninterpreted sorts, which a
reviewer cannot read.  Here the same query is solved in a finite scope
(:mod:`kvpool.proofs.finite`: at most ``scope`` blocks, keys and contents), so
the model is a real little pool; each distinct block becomes a cell (the null
block first, as block 0) and each distinct key a label ``k0``, ``k1``, ...
The abstraction keeps the free queue as a set, so the pictures list free blocks
by id, not in eviction order.
"""

from __future__ import annotations

from typing import Any

import z3  # type: ignore[import-untyped]

from kvpool.pictures import Picture, picture_changes, trace_step
from kvpool.proofs import transitions
from kvpool.proofs.finite import domain, scoped
from kvpool.proofs.inductive import SCOPE, TIMEOUT_MS, broken
from kvpool.proofs.symbolic import (
    EMPTY,
    NULL,
    Block,
    Content,
    KeySort,
    SymState,
    prefix,
    prefix_axioms,
)
from kvpool.proofs.transitions import StepSpec


def _distinct(model: Any, elements: list[Any], first: Any = None) -> list[Any]:
    """One representative per value the model gives ``elements`` (``first`` leading)."""
    seen: dict[str, Any] = {}
    for e in ([first] if first is not None else []) + elements:
        seen.setdefault(str(model.eval(e, model_completion=True)), e)
    return list(seen.values())


def _picture(model: Any, s: SymState, blocks: list[Any], keys: list[Any]) -> Picture:
    """The pool state ``s`` under ``model``, blocks numbered in ``blocks`` order."""

    def val(e: Any) -> Any:
        return model.eval(e, model_completion=True)

    def true(e: Any) -> bool:
        return bool(z3.is_true(val(e)))

    def label(k: Any) -> str:
        return f"k{_index(model, k, keys)}"

    free = [i for i, b in enumerate(blocks) if true(s.free[b])]
    cells = []
    for i, b in enumerate(blocks):
        hashed = true(s.prim[b])
        cells.append({
            "id": i, "ref": val(s.ref[b]).as_long(),
            "free_pos": free.index(i) if i in free else None,
            "key": label(s.pkey[b]) if hashed else None,
            "tokens": val(s.ptok[b]).as_long() if hashed else None,
            "extra_keys": [label(k) for k in keys if true(s.sec[b, k])],
            "null": true(b == NULL), "watched": true(s.watched[b]),
        })
    index = [{"key": label(k), "blocks": [i for i, b in enumerate(blocks) if true(s.idx[k, b])]}
             for k in keys]
    return {"blocks": cells, "free": free, "index": [e for e in index if e["blocks"]],
            "num_free": len(free), "events": []}


def counterexample_steps(step: str | StepSpec, invariant: str, scope: int = SCOPE,
                         timeout_ms: int = TIMEOUT_MS) -> list[dict[str, Any]]:
    """The pool before and after ``step`` breaks ``invariant`` (an invariant or a step
    property), as TraceSteps; [] if no pool in scope has it."""
    spec = transitions.STEPS[step] if isinstance(step, str) else step  # read at call time
    s = SymState.fresh("s")
    args = spec.fresh_args()
    st = spec.fn(s, *args)
    facts = [*prefix_axioms(), *broken(spec, invariant, s, args)]
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*scoped(facts, scope, s, args))
    if solver.check() != z3.sat:
        return []
    model = solver.model()
    dom = domain(scope)
    blocks = _distinct(model, dom[str(Block)], NULL)
    keys = _distinct(model, dom[str(KeySort)])
    contents = _distinct(model, dom[str(Content)], EMPTY)
    before = _picture(model, s, blocks, keys)
    after = _picture(model, st.post, blocks, keys)
    ghost_before = _ghost(model, s, blocks, keys, contents)
    ghost_after = _ghost(model, st.post, blocks, keys, contents)

    def show(a: Any) -> str:
        if a.sort() == Block:
            return f"#{_index(model, a, blocks)}"
        if a.sort() == KeySort:
            return f"k{_index(model, a, keys)}"
        if a.sort() in (z3.IntSort(), z3.BoolSort()):
            return str(model.eval(a, model_completion=True))
        return "…"

    name = step if isinstance(step, str) else "step"
    call = f"{name}({', '.join(show(a) for a in args)})"
    return [
        trace_step(0, "(a state satisfying every invariant)", "",
                   [f"ghost: {line}" for line in ghost_before], before),
        trace_step(1, call, f"breaks {invariant}", picture_changes(before, after) + [
            f"ghost: {line}" for line in ghost_after if line not in ghost_before], after),
    ]


def _index(model: Any, e: Any, representatives: list[Any]) -> int:
    """The place of the representative ``e`` equals under ``model`` (keys are named ``k0``, ``k1``, ...)."""
    return next(i for i, other in enumerate(representatives)
                if z3.is_true(model.eval(e == other, model_completion=True)))



def _ghost(model: Any, s: SymState, blocks: list[Any], keys: list[Any], contents: list[Any]) -> list[str]:
    """What each block holds and each key names (contents ``ε``, ``c1``, ...; ``<`` = prefix of)."""

    def name(c: Any) -> str:
        i = _index(model, c, contents)
        return "ε" if i == 0 else f"c{i}"

    def val(e: Any) -> Any:
        return model.eval(e, model_completion=True)

    lines = [f"block {i} holds {name(s.holds[b])}, {val(s.holders[b])} holder(s)"
             for i, b in enumerate(blocks) if i > 0]
    lines += [f"k{_index(model, k, keys)} names {name(s.names[k])}" for k in keys]
    if z3.is_true(val(s.events)):
        lines += [f"announced k{_index(model, k, keys)} on block {i}"
                  for k in keys for i, b in enumerate(blocks) if z3.is_true(val(s.live[k, b]))]
    lines += [f"{name(a)} < {name(b)}" for a in contents[1:] for b in contents[1:]
              if a is not b and z3.is_true(model.eval(prefix(a, b), model_completion=True))]
    return lines


def counterexample_text(steps: list[dict[str, Any]]) -> list[str]:
    """The pictured counterexample as plain lines: each state's blocks, then what the step changed."""
    out = []
    for st in steps:
        pic = st["picture"]
        out.append(f"{st['index']}. {st['call']}" + (f"  -> {st['outcome']}" if st["outcome"] else ""))
        for cell in pic["blocks"]:
            where = "null" if cell["null"] else (
                f"free #{cell['free_pos']}" if cell["free_pos"] is not None else "in use")
            hashed = (f" key {cell['key']} ({cell['tokens']} tokens)" if cell["key"] else "")
            extra = f" extra {','.join(cell['extra_keys'])}" if cell["extra_keys"] else ""
            watched = " watched" if cell["watched"] else ""
            out.append(f"     block {cell['id']}: ref {cell['ref']}, {where}{hashed}{extra}{watched}")
        out += [f"     {line}" for line in st["changes"]]
    return out
