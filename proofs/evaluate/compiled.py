"""Compiled predicates, steps, step-property claims and queue steps: Python functions over an
:class:`~.interp.Interp` (or a :class:`~.interp.QInterp`), each compiled once per domain.

Each term is compiled twice, plain and in Kleene's logic; the plain form runs first and
the Kleene form decides where it meets an undefined cell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3  # type: ignore[import-untyped]

from ..order import QState
from ..symbolic import FIELDS, Block, Expr, KeySort, SymState
from ..transitions import StepSpec, SymStep
from .compiler import Compiler
from .interp import Carriers, Interp, QInterp
from .runtime import NAMESPACE, Undetermined

Predicate = Callable[[Interp], bool]


def namespace(d: Carriers) -> dict[str, Any]:
    """What compiled code over ``d`` reads: the runtime's names and the domain's carriers."""
    return {**NAMESPACE, "_B": range(d.num_blocks), "_KS": range(len(d.keys)), "_CS": range(len(d.contents)),
            "_PREFIX": d.prefix_table()}


def _state_names(s: SymState) -> dict[str, str]:
    return {getattr(s, f).decl().name(): f for f in FIELDS}


def _guarded(plain: Callable[..., Any], kleene: Callable[..., Any], what: str) -> Callable[..., Any]:
    """Run the plain form; if it meets an undefined cell, the Kleene form decides (or raises)."""
    def run(*args: Any) -> Any:
        try:
            return plain(*args)
        except (Undetermined, TypeError):  # TypeError: None in arithmetic or a comparison
            pass
        try:
            return kleene(*args)
        except TypeError as exc:
            raise Undetermined(f"{what}: {exc}") from None
    run.__name__ = plain.__name__
    return run


def _scalar(term: Expr) -> Callable[[Compiler], str]:
    """The body that computes ``term``'s value."""
    return lambda c: c.scalar(term, []).text


def _bind(names: dict[str, str], args: Sequence[Expr], params: Sequence[str]) -> None:
    """Name each argument constant by its parameter."""
    names.update({a.decl().name(): p for a, p in zip(args, params, strict=True)})


@dataclass(frozen=True)
class Compiled:
    """A step compiled for one domain: its precondition and its result, as Python functions.

    ``pre(state, *args)`` is the step's ``pre``; ``post(state, *args)`` is
    ``(post-state, removed, stored)``.  Arguments are concrete: a block id,
    a key or content index (:class:`Carriers`), an int, a bool.
    """

    name: str
    pre: Callable[..., bool]
    post: Callable[..., tuple[Interp, frozenset[tuple[int, int]], frozenset[tuple[int, int]]]]
    source: str = field(repr=False)


def compile_terms(d: Carriers, names: Mapping[str, str], params: Sequence[str],
                  bodies: Mapping[str, Callable[[Compiler], str]], label: str,
                  extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Callable[..., Any]], str]:
    """Each body (Python source made by a compiler over ``names``) as a function of ``params``,
    compiled plain and in Kleene's logic (:func:`_guarded`)."""
    sig = ", ".join(params)
    lines = []
    for fn, body in bodies.items():
        for mode in ("plain", "kleene"):
            comp = Compiler(names, d, kleene=mode == "kleene")
            text = body(comp)
            lines += [f"def {fn}_{mode}({sig}):", *comp.generated(text), f"    return {text}", ""]
    src = "\n".join(lines)
    ns = {**namespace(d), **(extra or {})}
    exec(compile(src, f"<{label}>", "exec"), ns)
    return {fn: _guarded(ns[f"{fn}_plain"], ns[f"{fn}_kleene"], f"{label} {fn}") for fn in bodies}, src


def compile_predicate(d: Carriers, pred: Callable[[SymState], Expr], name: str = "") -> Predicate:
    """A state predicate (an invariant of :mod:`.invariants`) as a Python function of an :class:`Interp`."""
    s = SymState.fresh("eval")
    term = pred(s)
    fns, src = compile_terms(d, _state_names(s), FIELDS, {"pred": _scalar(term)},
                             f"predicate {name or pred.__name__}")
    guarded = fns["pred"]

    def on(st: Interp) -> bool:
        return bool(guarded(*st))
    on.source = src  # type: ignore[attr-defined]
    return on


def _built(comp: Compiler, term: Expr) -> str:
    """An array term built, or a scalar's value."""
    return (comp.array(term, []).build() if term.sort().kind() == z3.Z3_ARRAY_SORT
            else comp.scalar(term, []).text)


def compile_step(d: Carriers, spec: StepSpec) -> Compiled:
    """``spec``'s step as Python functions over :class:`Interp` (compiled once per domain)."""
    s = SymState.fresh("eval")
    names = _state_names(s)
    args = spec.fresh_args("_eval")
    params = [f"a_{n}" for n, _sort in spec.args]
    _bind(names, args, params)
    st = spec.fn(s, *args)

    def post(comp: Compiler) -> str:
        fields = [_built(comp, getattr(st.post, f)) for f in FIELDS]
        return ("(_Interp(" + ",\n                    ".join(fields) + "),\n"
                f"            {_built(comp, st.removed)},\n            {_built(comp, st.stored)})")

    fns, src = compile_terms(d, names, [*FIELDS, *params], {"pre": _scalar(st.pre), "post": post},
                             f"step {spec.name}", {"_Interp": Interp})
    pre_fn, post_fn = fns["pre"], fns["post"]
    return Compiled(spec.name, lambda state, *a: bool(pre_fn(*state, *a)),
                    lambda state, *a: post_fn(*state, *a), src)


def compile_claim(d: Carriers, spec: StepSpec, claim: Callable[..., Expr], label: str) -> Callable[..., bool]:
    """A step property's claim about ``spec``'s step as ``(state, post, *args, pre, removed, stored)``:
    the step's precondition, next state and event entries given as values (the model's), not
    computed by the step, so that the claim can be asked of a transition the step did not make."""
    s, p = SymState.fresh("eval"), SymState.fresh("eval.post")
    names = {**_state_names(s), **{getattr(p, f).decl().name(): f"p_{f}" for f in FIELDS}}
    args = spec.fresh_args("_evalc")
    params = [f"a_{n}" for n, _sort in spec.args]
    _bind(names, args, params)
    entries = z3.ArraySort(KeySort, Block, z3.BoolSort())
    pre, removed, stored = (z3.Bool("eval.claim.pre"), z3.Const("eval.claim.removed", entries),
                            z3.Const("eval.claim.stored", entries))
    _bind(names, [pre, removed, stored], ["c_pre", "c_removed", "c_stored"])
    term = claim(s, args, SymStep(pre, p, removed, stored))
    fns, _ = compile_terms(d, names, [*FIELDS, *(f"p_{f}" for f in FIELDS), *params, "c_pre", "c_removed",
                                      "c_stored"], {"claim": _scalar(term)}, label)
    fn = fns["claim"]
    return lambda state, post, *a: bool(fn(*state, *post, *a))


def _queue_names(s: QState, prefix: str = "") -> dict[str, str]:
    return {getattr(s, f).decl().name(): prefix + f for f in QInterp._fields}


@dataclass(frozen=True)
class CompiledQueue:
    """A queue step compiled for one domain, and each order property of it as ``(s, post, *args)``."""

    name: str
    pre: Callable[..., bool]
    post: Callable[..., QInterp]
    claims: dict[str, Callable[..., bool]]


def compile_queue_step(d: Carriers, name: str, fn: Callable[..., Any],
                       sorts: Sequence[tuple[str, z3.SortRef]],
                       properties: Mapping[str, Callable[..., Expr]]) -> CompiledQueue:
    """The queue step ``fn`` and every order property of it as Python functions."""
    s, p = QState.fresh("eval.q"), QState.fresh("eval.qpost")
    names = {**_queue_names(s), **_queue_names(p, "p_")}
    args = [z3.Const(f"{a}_evalq", sort) for a, sort in sorts]
    params = [f"a_{a}" for a, _sort in sorts]
    _bind(names, args, params)
    st = fn(s, *args)
    mine = list(QInterp._fields)
    theirs = [f"p_{f}" for f in mine]

    def post(comp: Compiler) -> str:
        return "_QInterp(" + ", ".join(_built(comp, getattr(st.post, f)) for f in mine) + ")"

    fns, _ = compile_terms(d, names, [*mine, *params], {"pre": _scalar(st.pre), "post": post},
                           f"queue step {name}", {"_QInterp": QInterp})
    terms = [claim(name, s, p, args) for claim in properties.values()]
    claims, _ = compile_terms(d, names, [*mine, *theirs, *params],
                              {f"c{i}": _scalar(t) for i, t in enumerate(terms)}, f"order claims of {name}")
    pre_fn, post_fn = fns["pre"], fns["post"]

    def run_claim(c: Callable[..., Any]) -> Callable[..., bool]:
        return lambda q, qp, *a: bool(c(*q, *qp, *a))

    return CompiledQueue(name, lambda q, *a: bool(pre_fn(*q, *a)), lambda q, *a: post_fn(*q, *a),
                         {prop: run_claim(c) for prop, c in zip(properties, claims.values(), strict=True)})
