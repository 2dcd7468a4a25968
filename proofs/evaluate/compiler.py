"""The compiler: a z3 term -> a Python expression (source text) over a finite interpretation.

It follows z3's semantics term by term: ``Select`` of ``Store``/``Lambda``/``K``/``If``
is reduced while compiling (no intermediate array is built), ``ForAll``/``Exists`` run over
the finite carrier or, in plain mode, over the solutions of their body
(:mod:`.solutions`), ``And``/``Or``/``Implies``/``If`` short-circuit, and a closed
subterm is computed at most once per call.  A decision that reads a cell that may be
undefined is marked *risky*: it may raise :class:`.runtime.Undetermined`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import z3  # type: ignore[import-untyped]

from kvpool.model.request import EMPTY as EMPTY_PREFIX

from ..symbolic import EMPTY, NULL, Block, Content, Expr, KeySort
from .interp import UNDEFINED_CELLS, Carriers
from .solutions import plan
from .source import Arr, Src, Unsupported


class Compiler:
    def __init__(self, names: Mapping[str, str], domain: Carriers, kleene: bool = False) -> None:
        self.names = names
        """z3 constant name -> Python parameter name."""
        self.domain = domain
        self.kleene = kleene
        """Evaluate undecided operands in Kleene's logic (slower); else plain short-circuits."""
        self.fresh = itertools.count()
        self.fv: dict[int, tuple[Expr, frozenset[int]]] = {}
        self.thunks: list[tuple[str, str]] = []
        """Closed subterms, each computed at most once per call: (local name, source)."""
        self.hoisted: dict[int, tuple[Expr, Src]] = {}

    def atomic(self, e: Expr) -> bool:
        """Cheap enough to recompute: a constant, or a field read at constant indices."""
        if not z3.is_app(e) or e.num_args() == 0:
            return True
        if e.decl().kind() != z3.Z3_OP_SELECT:
            return False
        arr, *ix = e.children()
        return (z3.is_const(arr) and arr.decl().kind() == z3.Z3_OP_UNINTERPRETED
                and all(z3.is_const(i) or z3.is_var(i) for i in ix))

    def generated(self, body: str) -> list[str]:
        """The thunks' definitions, to put at the head of a generated function."""
        if not self.thunks:
            return []
        out = [f"    {' = '.join(n for n, _ in self.thunks)} = _U"]
        for n, text in self.thunks:
            out += [f"    def _{n}():", f"        nonlocal {n}", f"        {n} = {text}",
                    f"        return {n}"]
        return out

    # ---- carriers

    def carrier(self, sort: z3.SortRef) -> str:
        for carried, name in ((Block, "_B"), (KeySort, "_KS"), (Content, "_CS")):
            if sort.eq(carried):
                return name
        raise Unsupported(f"no finite carrier for sort {sort}")

    def var(self) -> str:
        return f"_v{next(self.fresh)}"

    # ---- arrays

    def array(self, e: Expr, env: list[Src]) -> Arr:
        sort = e.sort()
        arity = int(z3.Z3_get_array_arity(sort.ctx_ref(), sort.ast))
        if arity not in (1, 2):
            raise Unsupported(f"array of arity {arity}: {e}")
        relation = arity == 2
        if relation and not sort.range().eq(z3.BoolSort()):
            raise Unsupported(f"two-place array with range {sort.range()}: {e}")
        doms = [sort.domain_n(i) for i in range(arity)] if relation else [sort.domain()]

        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            name = self.names.get(e.decl().name())
            if name is None:
                raise Unsupported(f"free array {e} is not a field of the state")
            definite = name not in UNDEFINED_CELLS
            if relation:
                def sel_rel(ix: list[Src]) -> Src:
                    return Src(f"(({self.strict(ix[0])}, {self.strict(ix[1])}) in {name})", True,
                                any(self.risky_index(i) for i in ix))
                return Arr(sel_rel, lambda: name)

            def sel(ix: list[Src]) -> Src:
                return Src(f"{name}[{self.strict(ix[0])}]", definite, self.risky_index(ix[0]))
            return Arr(sel, lambda: name)

        if z3.is_quantifier(e) and e.is_lambda():
            n = e.num_vars()
            sorts = [e.var_sort(i) for i in range(n)]

            def sel_lam(ix: list[Src]) -> Src:
                return self.scalar(e.body(), env + ix)

            def build_lam() -> str:
                vs = [self.var() for _ in range(n)]
                if relation and not self.kleene:
                    plans = plan(self, e.body(), vs, sorts, env)
                    if plans is not None:
                        sets = [f"frozenset(({vs[0]}, {vs[1]}) {p})" for p in plans]
                        return " | ".join(sets) if sets else "frozenset()"
                body = self.scalar(e.body(), env + [Src(v, True) for v in vs]).text
                loops = " ".join(f"for {v} in {self.carrier(s)}" for v, s in zip(vs, sorts, strict=True))
                if relation:
                    return f"frozenset(({vs[0]}, {vs[1]}) {loops} if {body})"
                return f"tuple({body} {loops})"
            return Arr(sel_lam, build_lam)

        if not z3.is_app(e):
            raise Unsupported(f"array term {e}")
        kind = e.decl().kind()
        if kind == z3.Z3_OP_STORE:
            base = self.array(e.arg(0), env)
            at = [self.scalar(e.arg(1 + i), env) for i in range(arity)]
            val = self.scalar(e.arg(1 + arity), env)

            def sel_store(ix: list[Src]) -> Src:
                hits = [self.eq(i, j, s) for i, j, s in zip(ix, at, doms, strict=True)]
                rest = base.select(ix)
                return Src(f"({val.text} if {' and '.join(h.text for h in hits)} else {rest.text})",
                            val.definite and rest.definite,
                            any(h.risky for h in hits) or val.risky or rest.risky)

            def build_store() -> str:
                if relation:
                    return (f"_store2({base.build()}, ({self.strict(at[0])}, {self.strict(at[1])}), "
                            f"{val.text})")
                return f"_store1({base.build()}, {self.strict(at[0])}, {val.text})"
            return Arr(sel_store, build_store)
        if kind == z3.Z3_OP_CONST_ARRAY:
            if relation:
                raise Unsupported(f"constant two-place array {e}")
            val = self.scalar(e.arg(0), env)
            return Arr(lambda ix: val, lambda: f"(({val.text},) * len({self.carrier(doms[0])}))")
        if kind == z3.Z3_OP_ITE:
            c = self.scalar(e.arg(0), env)
            a, b = self.array(e.arg(1), env), self.array(e.arg(2), env)

            def sel_ite(ix: list[Src]) -> Src:
                x, y = a.select(ix), b.select(ix)
                return Src(f"({x.text} if {c.text} else {y.text})", x.definite and y.definite,
                            c.risky or x.risky or y.risky)
            return Arr(sel_ite, lambda: f"({a.build()} if {c.text} else {b.build()})")
        raise Unsupported(f"array operation {e.decl()} in {e}")

    def free_vars(self, e: Expr) -> frozenset[int]:
        """The de Bruijn indices free in ``e``."""
        key = e.get_id()
        if key in self.fv:
            return self.fv[key][1]
        if z3.is_var(e):
            out = frozenset({z3.get_var_index(e)})
        elif z3.is_quantifier(e):
            n = e.num_vars()
            out = frozenset(i - n for i in self.free_vars(e.body()) if i >= n)
        elif z3.is_app(e):
            out = frozenset().union(*(self.free_vars(c) for c in e.children()))
        else:
            out = frozenset()
        self.fv[key] = (e, out)
        return out

    # ---- scalars

    def strict(self, s: Src) -> str:
        return s.text if s.definite else f"_d({s.text})"

    @staticmethod
    def risky_index(i: Src) -> bool:
        return i.risky or not i.definite

    def eq(self, a: Src, b: Src, sort: z3.SortRef) -> Src:
        if sort.eq(z3.BoolSort()) or (a.definite and b.definite):
            return Src(f"({a.text} == {b.text})", True, a.risky or b.risky)
        return Src(f"_eq({a.text}, {b.text})", True, True)

    def junction(self, op: str, parts: list[Src]) -> Src:
        """``and``/``or`` in Kleene's logic: an operand that cannot be decided does not
        hide one that decides (z3's ``Or(free == c, True)`` is true).  Safe operands go
        first; two or more that may raise go through :func:`.runtime._kleene`."""
        if not parts:
            return Src("True" if op == "and" else "False", True)
        safe = [p.text for p in parts if not p.risky]
        risky = [p.text for p in parts if p.risky]
        if len(risky) > 1 and self.kleene:
            risky = [f"_kleene({op == 'and'}, " + ", ".join(f"lambda: {r}" for r in risky) + ")"]
        return Src("(" + f" {op} ".join(safe + risky) + ")", True, bool(risky))

    def scalar(self, e: Expr, env: list[Src]) -> Src:
        if z3.is_var(e):
            found: Src = env[len(env) - 1 - z3.get_var_index(e)]  # z3's index is untyped
            return found
        if self.atomic(e) or self.free_vars(e):  # cheap, or reads an enclosing binder
            return self.scalar_here(e, env)
        # A closed subterm means the same wherever it occurs: compute it once per
        # call, when first needed (so short-circuits still skip it).
        key = e.get_id()
        if key not in self.hoisted:
            inner = self.scalar_here(e, [])
            name = f"t{len(self.thunks)}"
            self.thunks.append((name, inner.text))
            self.hoisted[key] = (e, Src(f"({name} if {name} is not _U else _{name}())",
                                         inner.definite, inner.risky))
        return self.hoisted[key][1]

    def scalar_here(self, e: Expr, env: list[Src]) -> Src:
        if z3.is_quantifier(e):
            if e.is_lambda():
                raise Unsupported(f"lambda used as a value: {e}")
            n = e.num_vars()
            vs = [self.var() for _ in range(n)]
            sorts = [e.var_sort(i) for i in range(n)]
            if not self.kleene and n > 1:
                # ForAll: no solution of the negated body; Exists: some solution of the body
                plans = plan(self, e.body(), vs, sorts, env, negate=e.is_forall())
                if plans is not None:
                    found = [f"any(True {p})" for p in plans]
                    if e.is_forall():
                        return Src("(" + " and ".join(f"not {f}" for f in found) + ")"
                                    if found else "True", True, True)
                    return Src("(" + " or ".join(found) + ")" if found else "False", True, True)
            body = self.scalar(e.body(), env + [Src(v, True) for v in vs])
            carriers = [self.carrier(e.var_sort(i)) for i in range(n)]
            if body.risky and self.kleene:  # an undecided instance must not hide a deciding one
                return Src(f"_kleene_q({e.is_forall()}, lambda {', '.join(vs)}: {body.text}, "
                            f"{', '.join(carriers)})", True, True)
            loops = " ".join(f"for {v} in {c}" for v, c in zip(vs, carriers, strict=True))
            return Src(f"{'all' if e.is_forall() else 'any'}({body.text} {loops})", True, body.risky)
        if z3.is_int_value(e):
            return Src(str(e.as_long()), True)
        if z3.is_true(e) or z3.is_false(e):
            return Src(str(z3.is_true(e)), True)
        if not z3.is_app(e):
            raise Unsupported(f"term {e}")
        kind = e.decl().kind()
        args = e.children()
        if kind == z3.Z3_OP_UNINTERPRETED:
            if e.eq(NULL):
                return Src("0", True)
            if e.eq(EMPTY):
                return Src(str(self.domain.content_id[EMPTY_PREFIX]), True)
            name = e.decl().name()
            if not args:
                if name not in self.names:
                    raise Unsupported(f"free constant {e}")
                return Src(self.names[name], True)  # the scalar fields are always defined; step arguments too
            if name == "prefix" and len(args) == 2:
                a, b = (self.scalar(x, env) for x in args)
                return Src(f"_PREFIX[{self.strict(a)}][{self.strict(b)}]", True,
                            self.risky_index(a) or self.risky_index(b))
            raise Unsupported(f"function {name}")
        if kind == z3.Z3_OP_SELECT:
            arr = self.array(args[0], env)
            return arr.select([self.scalar(x, env) for x in args[1:]])
        if kind == z3.Z3_OP_ITE:
            c = self.scalar(args[0], env)
            a, b = self.scalar(args[1], env), self.scalar(args[2], env)
            return Src(f"({a.text} if {c.text} else {b.text})", a.definite and b.definite,
                        c.risky or a.risky or b.risky)
        sub = [self.scalar(x, env) for x in args]
        t = [x.text for x in sub]
        risky = any(x.risky for x in sub)
        if kind == z3.Z3_OP_AND:
            return self.junction("and", sub)
        if kind == z3.Z3_OP_OR:
            return self.junction("or", sub)
        if kind == z3.Z3_OP_NOT:
            return Src(f"(not {t[0]})", True, risky)
        if kind == z3.Z3_OP_IMPLIES:
            return self.junction("or", [Src(f"(not {t[0]})", True, sub[0].risky), sub[1]])
        if kind in (z3.Z3_OP_EQ, z3.Z3_OP_IFF):
            return self.eq(sub[0], sub[1], args[0].sort())
        if kind == z3.Z3_OP_DISTINCT:
            pairs = [self.eq(sub[i], sub[j], args[0].sort())
                     for i in range(len(sub)) for j in range(i + 1, len(sub))]
            return self.junction("and", [Src(f"(not {p.text})", True, p.risky) for p in pairs])
        # None in arithmetic or an order comparison raises TypeError: Undetermined
        loose = risky or not all(x.definite for x in sub)
        arith = {z3.Z3_OP_ADD: "+", z3.Z3_OP_SUB: "-", z3.Z3_OP_MUL: "*"}
        if kind in arith:
            return Src("(" + f" {arith[kind]} ".join(t) + ")", True, loose)
        if kind == z3.Z3_OP_UMINUS:
            return Src(f"(-{t[0]})", True, loose)
        if kind == z3.Z3_OP_MOD:
            return Src(f"_mod({t[0]}, {t[1]})", True, loose)
        compare = {z3.Z3_OP_LT: "<", z3.Z3_OP_LE: "<=", z3.Z3_OP_GT: ">", z3.Z3_OP_GE: ">="}
        if kind in compare:
            return Src(f"({t[0]} {compare[kind]} {t[1]})", True, loose)
        raise Unsupported(f"operation {e.decl()} in {e}")
