"""The encoding's z3 terms evaluated on a finite concrete interpretation, fast.

:mod:`.concrete` asks z3 whether a step computes what the model computes: one
solver call per state.  Checking every call the BMC makes (millions) that way
would take days.  Here each z3 term is compiled ONCE, per finite
:class:`Carriers`, into plain Python; evaluating it on a concrete state is then a
function call.  The compiler is small and follows z3's semantics term by term:

* a ``Block`` is an int (``NULL`` is 0), a ``Key`` or a ``Content`` an index
  into :attr:`Carriers.keys` / :attr:`Carriers.contents` (``EMPTY`` is ``()``),
  ``prefix`` the real prefix relation on them;
* an array over ``Block`` or ``Key`` is a tuple; a two-place Boolean array (a
  relation such as ``idx``) is the frozenset of the index pairs where it is
  true;
* ``Select`` of ``Store``/``Lambda``/``K``/``If`` is reduced while compiling
  (no intermediate array is built), ``ForAll``/``Exists`` run over the finite
  carrier, ``And``/``Or``/``Implies``/``If`` short-circuit.

Cells the model leaves undefined (``pkey``/``ptok`` of an unhashed block,
``names`` of a key never named) are ``None``.  z3 leaves them free, so a
result that DEPENDS on one is not determined by the model state: every
decision that reads one (an equality, arithmetic, a comparison, ``prefix``, an
index) raises :class:`Undetermined` instead of guessing.  A result computed
without raising is therefore the same under every value of the free cells,
which is what :func:`kvpool.proofs.concrete.compare` asks z3 (``tests/
test_agreement.py`` checks the two agree on a sample).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import z3  # type: ignore[import-untyped]

from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import Content as ModelContent
from kvpool.model.request import extends
from kvpool.model.state import Key as ModelKey
from kvpool.model.state import PoolState

from .concrete import Universe, _sat, encode, mentioned
from .finite import ground
from .order import QState
from .symbolic import EMPTY, FIELDS, NULL, Block, Content, Expr, KeySort, SymState
from .transitions import StepSpec, SymStep

UNDEFINED_CELLS = ("pkey", "ptok", "names", "pos")
"""Fields whose cells the model leaves undefined somewhere (``None`` in an interpretation)."""


class Undetermined(Exception):
    """The value depends on a cell the concrete state leaves undefined (z3 leaves it free)."""


@dataclass(frozen=True)
class Carriers:
    """The finite carriers: blocks ``0 .. num_blocks-1``, the keys and contents, by index."""

    num_blocks: int
    keys: tuple[ModelKey, ...]
    contents: tuple[ModelContent, ...]
    key_id: Mapping[ModelKey, int] = field(repr=False, compare=False)
    content_id: Mapping[ModelContent, int] = field(repr=False, compare=False)

    @classmethod
    def of(cls, num_blocks: int, keys: Iterable[ModelKey],
           contents: Iterable[ModelContent]) -> Carriers:
        """Every key and content given (the empty prefix always among the contents), in a fixed order."""
        ks = tuple(sorted(set(keys)))
        cs = tuple(sorted({EMPTY_PREFIX, *contents}, key=repr))
        return cls(num_blocks, ks, cs, {k: i for i, k in enumerate(ks)},
                   {c: i for i, c in enumerate(cs)})

    @classmethod
    def covering(cls, states: Sequence[PoolState], keys: Iterable[ModelKey] = (),
                 contents: Iterable[ModelContent] = ()) -> Carriers:
        """Every key and content the states (and the extra values) mention."""
        all_keys, all_contents = mentioned(states, keys, contents)
        return cls.of(states[0].num_blocks, all_keys, all_contents)

    def prefix_table(self) -> tuple[tuple[bool, ...], ...]:
        """``prefix(a, b)`` for every pair of contents: ``a`` is a prefix of ``b``."""
        return tuple(tuple(extends(b, a) for b in self.contents) for a in self.contents)


class Interp(NamedTuple):
    """A concrete :class:`~kvpool.proofs.symbolic.SymState`: one value per field, same names."""

    ref: tuple[int, ...]
    free: tuple[bool, ...]
    prim: tuple[bool, ...]
    pkey: tuple[int | None, ...]
    ptok: tuple[int | None, ...]
    sec: frozenset[tuple[int, int]]
    """(block, key) pairs."""
    idx: frozenset[tuple[int, int]]
    """(key, block) pairs."""
    watched: tuple[bool, ...]
    holds: tuple[int, ...]
    names: tuple[int | None, ...]
    holders: tuple[int, ...]
    live: frozenset[tuple[int, int]]
    """(key, block) pairs."""
    events: bool
    caching: bool
    hbs: int


assert Interp._fields == FIELDS, "Interp must list SymState's fields in order"


def abstract(d: Carriers, s: PoolState) -> Interp:
    """The model state as the encoding sees it (:func:`kvpool.proofs.concrete.encode`'s facts).

    The free queue becomes a set, the index and the secondary keys relations:
    order and duplicates are gone, as in the encoding.  Undefined cells are ``None``.
    """
    kid, cid = d.key_id, d.content_id
    free = set(s.free)
    n = s.num_blocks
    names: list[int | None] = [None] * len(d.keys)
    for k, c in s.names.items():
        names[kid[k]] = cid[c]
    return Interp(
        ref=tuple(s.ref),
        free=tuple(b in free for b in range(n)),
        prim=tuple(p is not None for p in s.primary),
        pkey=tuple(None if p is None else kid[p.key] for p in s.primary),
        ptok=tuple(None if p is None else p.num_tokens for p in s.primary),
        sec=frozenset((b, kid[k]) for b in range(n) for k in s.secondary[b]),
        idx=frozenset((kid[k], b) for k, bs in s.index.items() for b in bs),
        watched=tuple(b in s.watchers for b in range(n)),
        holds=tuple(cid[c] for c in s.holds),
        names=tuple(names),
        holders=tuple(s.holders),
        live=frozenset((kid[k], b) for k, b in s.announced),
        events=s.events_on,
        caching=s.caching,
        hbs=s.hash_block_size,
    )


# --------------------------------------------------------------------------
# Runtime helpers of the compiled code.


_UNSET = object()
"""A closed subterm not computed yet in this call."""


def _eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        raise Undetermined("an equality reads an undefined cell")
    return bool(a == b)


def _kleene(conj: bool, *parts: Callable[[], Any]) -> bool:
    """``and`` (``conj``) or ``or`` of operands that may be undecided, in Kleene's logic."""
    undecided = False
    for part in parts:
        try:
            v = bool(part())
        except (Undetermined, TypeError):
            undecided = True
            continue
        if v != conj:
            return v
    if undecided:
        raise Undetermined("no operand decides the connective")
    return conj


def _kleene_q(forall: bool, body: Callable[..., Any], *carriers: range) -> bool:
    """``ForAll`` (``forall``) or ``Exists`` whose body may be undecided on some elements."""
    return _kleene(forall, *(lambda vs=vs: body(*vs) for vs in itertools.product(*carriers)))


def _d(a: Any) -> Any:
    if a is None:
        raise Undetermined("an index reads an undefined cell")
    return a


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise Undetermined("x mod 0 is left free by z3")
    return a % abs(b)  # z3's mod: Euclidean, never negative


def _store1(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1:])


def _store2(r: frozenset[tuple[int, int]], i: tuple[int, int], v: bool) -> frozenset[tuple[int, int]]:
    return r | {i} if v else r - {i}


# --------------------------------------------------------------------------
# The compiler: a z3 term -> a Python expression (source text).


class Unsupported(Exception):
    """A term outside the small language the encoding uses."""


@dataclass(frozen=True)
class _Src:
    """A compiled scalar: Python source, whether its value is never ``None``, whether it may raise."""

    text: str
    definite: bool
    risky: bool = False
    """Evaluating it may raise :class:`Undetermined` (it decides on a cell that may be undefined)."""


class _Arr:
    """A compiled array term: read it at an index without building it, or build it."""

    def __init__(self, select: Callable[[list[_Src]], _Src], build: Callable[[], str]) -> None:
        self.select = select
        self.build = build


class _Compiler:
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
        self.hoisted: dict[int, tuple[Expr, _Src]] = {}
        self.reach: dict[int, tuple[Expr, int]] = {}

    def binders_needed(self, e: Expr) -> int:
        """How many enclosing binders ``e``'s free variables reach (0: ``e`` is closed)."""
        key = e.get_id()
        if key in self.reach:
            return self.reach[key][1]
        if z3.is_var(e):
            out = z3.get_var_index(e) + 1
        elif z3.is_quantifier(e):
            out = max(0, self.binders_needed(e.body()) - e.num_vars())
        elif z3.is_app(e):
            out = max((self.binders_needed(c) for c in e.children()), default=0)
        else:
            out = 0
        self.reach[key] = (e, out)  # holding e keeps its id from being recycled
        return int(out)

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
        if sort.eq(Block):
            return "_B"
        if sort.eq(KeySort):
            return "_KS"
        if sort.eq(Content):
            return "_CS"
        raise Unsupported(f"no finite carrier for sort {sort}")

    def var(self) -> str:
        return f"_v{next(self.fresh)}"

    # ---- arrays

    def array(self, e: Expr, env: list[_Src]) -> _Arr:
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
                def sel_rel(ix: list[_Src]) -> _Src:
                    return _Src(f"(({self.strict(ix[0])}, {self.strict(ix[1])}) in {name})", True,
                                any(self.risky_index(i) for i in ix))
                return _Arr(sel_rel, lambda: name)

            def sel(ix: list[_Src]) -> _Src:
                return _Src(f"{name}[{self.strict(ix[0])}]", definite, self.risky_index(ix[0]))
            return _Arr(sel, lambda: name)

        if z3.is_quantifier(e) and e.is_lambda():
            n = e.num_vars()
            sorts = [e.var_sort(i) for i in range(n)]

            def sel_lam(ix: list[_Src]) -> _Src:
                return self.scalar(e.body(), env + ix)

            def build_lam() -> str:
                vs = [self.var() for _ in range(n)]
                if relation and not self.kleene:
                    plans = self.plan(e.body(), vs, sorts, env)
                    if plans is not None:
                        sets = [f"frozenset(({vs[0]}, {vs[1]}) {p})" for p in plans]
                        return " | ".join(sets) if sets else "frozenset()"
                body = self.scalar(e.body(), env + [_Src(v, True) for v in vs]).text
                loops = " ".join(f"for {v} in {self.carrier(s)}" for v, s in zip(vs, sorts, strict=True))
                if relation:
                    return f"frozenset(({vs[0]}, {vs[1]}) {loops} if {body})"
                return f"tuple({body} {loops})"
            return _Arr(sel_lam, build_lam)

        if not z3.is_app(e):
            raise Unsupported(f"array term {e}")
        kind = e.decl().kind()
        if kind == z3.Z3_OP_STORE:
            base = self.array(e.arg(0), env)
            at = [self.scalar(e.arg(1 + i), env) for i in range(arity)]
            val = self.scalar(e.arg(1 + arity), env)

            def sel_store(ix: list[_Src]) -> _Src:
                hits = [self.eq(i, j, s) for i, j, s in zip(ix, at, doms, strict=True)]
                rest = base.select(ix)
                return _Src(f"({val.text} if {' and '.join(h.text for h in hits)} else {rest.text})",
                            val.definite and rest.definite,
                            any(h.risky for h in hits) or val.risky or rest.risky)

            def build_store() -> str:
                if relation:
                    return (f"_store2({base.build()}, ({self.strict(at[0])}, {self.strict(at[1])}), "
                            f"{val.text})")
                return f"_store1({base.build()}, {self.strict(at[0])}, {val.text})"
            return _Arr(sel_store, build_store)
        if kind == z3.Z3_OP_CONST_ARRAY:
            if relation:
                raise Unsupported(f"constant two-place array {e}")
            val = self.scalar(e.arg(0), env)
            return _Arr(lambda ix: val, lambda: f"(({val.text},) * len({self.carrier(doms[0])}))")
        if kind == z3.Z3_OP_ITE:
            c = self.scalar(e.arg(0), env)
            a, b = self.array(e.arg(1), env), self.array(e.arg(2), env)

            def sel_ite(ix: list[_Src]) -> _Src:
                x, y = a.select(ix), b.select(ix)
                return _Src(f"({x.text} if {c.text} else {y.text})", x.definite and y.definite,
                            c.risky or x.risky or y.risky)
            return _Arr(sel_ite, lambda: f"({a.build()} if {c.text} else {b.build()})")
        raise Unsupported(f"array operation {e.decl()} in {e}")

    # ---- solutions of a Boolean body over a binder's variables (plain mode only)

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

    @staticmethod
    def nnf(e: Expr, positive: bool = True) -> Expr:
        """``e`` (or its negation) with ``Not`` pushed down to atoms."""
        if z3.is_app(e) and not z3.is_quantifier(e):
            kind = e.decl().kind()
            kids = e.children()
            if kind == z3.Z3_OP_NOT:
                return _Compiler.nnf(kids[0], not positive)
            if kind in (z3.Z3_OP_AND, z3.Z3_OP_OR):
                parts = [_Compiler.nnf(k, positive) for k in kids]
                conj = (kind == z3.Z3_OP_AND) == positive
                return (z3.And if conj else z3.Or)(*parts) if parts else z3.BoolVal(conj)
            if kind == z3.Z3_OP_IMPLIES:
                return _Compiler.nnf(z3.Or(z3.Not(kids[0]), kids[1]), positive)
            if kind in (z3.Z3_OP_EQ, z3.Z3_OP_IFF) and z3.is_bool(kids[0]):
                a, b = kids
                same = z3.Or(z3.And(a, b), z3.And(z3.Not(a), z3.Not(b)))
                differ = z3.Or(z3.And(a, z3.Not(b)), z3.And(z3.Not(a), b))
                return _Compiler.nnf(same if positive else differ)
            if kind == z3.Z3_OP_ITE and z3.is_bool(e):
                c, a, b = kids
                return _Compiler.nnf(z3.Or(z3.And(c, a), z3.And(z3.Not(c), b)), positive)
            if z3.is_true(e) or z3.is_false(e):
                return z3.BoolVal(z3.is_true(e) == positive)
        return e if positive else z3.Not(e)

    @staticmethod
    def dnf(e: Expr, limit: int = 16) -> list[list[Expr]] | None:
        """An NNF formula as a disjunction of conjunctions of literals (``None``: too big)."""
        if z3.is_false(e):
            return []
        if z3.is_true(e):
            return [[]]
        if z3.is_and(e):
            out: list[list[Expr]] = [[]]
            for k in e.children():
                sub = _Compiler.dnf(k, limit)
                if sub is None or len(out) * len(sub) > limit:
                    return None
                out = [a + b for a in out for b in sub]
            return out
        if z3.is_or(e):
            acc: list[list[Expr]] = []
            for k in e.children():
                sub = _Compiler.dnf(k, limit)
                if sub is None or len(acc) + len(sub) > limit:
                    return None
                acc += sub
            return acc
        return [[e]]

    def plan(self, body: Expr, vs: list[str], sorts: list[z3.SortRef], env: list[_Src],
             negate: bool = False) -> list[str] | None:
        """Generator clauses (``for ... in ... if ...``), one per disjunct, that bind ``vs`` to
        exactly the solutions of ``body`` (of ``Not(body)`` with ``negate``); ``None``: no plan.

        A positive literal reading a relation at the variables loops over the relation;
        an equality of a variable with a term of bound ones binds it; any other variable
        loops over its carrier.  The other literals filter, in their order, as soon as
        their variables are bound.
        """
        n = len(vs)
        disjuncts = self.dnf(self.nnf(body, not negate))
        if disjuncts is None:
            return None
        inner = env + [_Src(v, True) for v in vs]

        def ours(e: Expr) -> set[int]:
            """Positions (declaration order) of the binder's variables ``e`` reads."""
            return {n - 1 - i for i in self.free_vars(e) if i < n}

        out = []
        for conj in disjuncts:
            if any(z3.is_false(c) for c in conj):
                continue
            conj = [c for c in conj if not z3.is_true(c)]
            if any(self.free_vars(c) and max(self.free_vars(c)) >= n + len(env) for c in conj):
                return None
            bound: set[int] = set()
            pending = list(conj)
            clauses: list[str] = []
            while len(bound) < n:
                step = self.generator(pending, n, bound, vs, inner, ours)
                if step is None:
                    pos = self.next_loop(pending, n, bound, sorts, ours)
                    step = (f"for {vs[pos]} in {self.carrier(sorts[pos])}", {pos}, None)
                text, newly, used = step
                clauses.append(text)
                bound |= newly
                if used is not None:
                    pending.remove(used)
                ready = [c for c in pending if ours(c) <= bound]
                for c in ready:
                    pending.remove(c)
                    clauses.append(f"if {self.scalar(c, inner).text}")
            clauses += [f"if {self.scalar(c, inner).text}" for c in pending]
            out.append(" ".join(clauses))
        return out

    def next_loop(self, pending: list[Expr], n: int, bound: set[int], sorts: list[z3.SortRef],
                  ours: Callable[[Expr], set[int]]) -> int:
        """The variable to loop over: one whose value then pins another, else a block."""
        free = sorted(set(range(n)) - bound, key=lambda p: (not sorts[p].eq(Block), p))
        for p in free:
            for c in pending:
                if not z3.is_eq(c) or z3.is_bool(c.arg(0)):
                    continue
                for x, t in ((c.arg(0), c.arg(1)), (c.arg(1), c.arg(0))):
                    if (z3.is_var(x) and z3.get_var_index(x) < n
                            and n - 1 - z3.get_var_index(x) not in bound | {p}
                            and ours(t) <= bound | {p}):
                        return p
        return free[0]

    def generator(self, pending: list[Expr], n: int, bound: set[int], vs: list[str],
                  inner: list[_Src], ours: Callable[[Expr], set[int]]
                  ) -> tuple[str, set[int], Expr | None] | None:
        """The best way to bind more variables: loop over a relation, or pin by an equality."""
        for c in pending:  # a relation read at unbound variables: loop over its pairs
            if not (z3.is_select(c) and c.num_args() == 3):
                continue
            arr, *ix = c.children()
            if self.free_vars(arr):
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
                    tmp = self.var()
                    targets.append(tmp)
                    checks.append(f"if {tmp} == {self.strict(self.scalar(i, inner))}")
            text = f"for ({', '.join(targets)}) in {self.array(arr, inner[:len(inner) - n]).build()}"
            return " ".join([text, *checks]), newly, c
        for c in pending:  # x == t with t over bound variables: x is t
            if not z3.is_eq(c) or z3.is_bool(c.arg(0)):
                continue
            for x, t in ((c.arg(0), c.arg(1)), (c.arg(1), c.arg(0))):
                if z3.is_var(x) and z3.get_var_index(x) < n:
                    p = n - 1 - z3.get_var_index(x)
                    if p not in bound and ours(t) <= bound:
                        return f"for {vs[p]} in ({self.strict(self.scalar(t, inner))},)", {p}, c
        return None

    # ---- scalars

    def strict(self, s: _Src) -> str:
        return s.text if s.definite else f"_d({s.text})"

    @staticmethod
    def risky_index(i: _Src) -> bool:
        return i.risky or not i.definite

    def eq(self, a: _Src, b: _Src, sort: z3.SortRef) -> _Src:
        if sort.eq(z3.BoolSort()) or (a.definite and b.definite):
            return _Src(f"({a.text} == {b.text})", True, a.risky or b.risky)
        return _Src(f"_eq({a.text}, {b.text})", True, True)

    def junction(self, op: str, parts: list[_Src]) -> _Src:
        """``and``/``or`` in Kleene's logic: an operand that cannot be decided does not
        hide one that decides (z3's ``Or(free == c, True)`` is true).  Safe operands go
        first; two or more that may raise go through :func:`_kleene`."""
        if not parts:
            return _Src("True" if op == "and" else "False", True)
        safe = [p.text for p in parts if not p.risky]
        risky = [p.text for p in parts if p.risky]
        if len(risky) > 1 and self.kleene:
            risky = [f"_kleene({op == 'and'}, " + ", ".join(f"lambda: {r}" for r in risky) + ")"]
        return _Src("(" + f" {op} ".join(safe + risky) + ")", True, bool(risky))

    def scalar(self, e: Expr, env: list[_Src]) -> _Src:
        if z3.is_var(e):
            found: _Src = env[len(env) - 1 - z3.get_var_index(e)]
            return found
        if self.atomic(e) or self.binders_needed(e) > 0:
            return self.scalar_here(e, env)
        # A closed subterm means the same wherever it occurs: compute it once per
        # call, when first needed (so short-circuits still skip it).
        key = e.get_id()
        if key not in self.hoisted:
            inner = self.scalar_here(e, [])
            name = f"t{len(self.thunks)}"
            self.thunks.append((name, inner.text))
            self.hoisted[key] = (e, _Src(f"({name} if {name} is not _U else _{name}())",
                                         inner.definite, inner.risky))
        return self.hoisted[key][1]

    def scalar_here(self, e: Expr, env: list[_Src]) -> _Src:
        if z3.is_quantifier(e):
            if e.is_lambda():
                raise Unsupported(f"lambda used as a value: {e}")
            n = e.num_vars()
            vs = [self.var() for _ in range(n)]
            sorts = [e.var_sort(i) for i in range(n)]
            if not self.kleene and n > 1:
                # ForAll: no solution of the negated body; Exists: some solution of the body
                plans = self.plan(e.body(), vs, sorts, env, negate=e.is_forall())
                if plans is not None:
                    found = [f"any(True {p})" for p in plans]
                    if e.is_forall():
                        return _Src("(" + " and ".join(f"not {f}" for f in found) + ")"
                                    if found else "True", True, True)
                    return _Src("(" + " or ".join(found) + ")" if found else "False", True, True)
            body = self.scalar(e.body(), env + [_Src(v, True) for v in vs])
            carriers = [self.carrier(e.var_sort(i)) for i in range(n)]
            if body.risky and self.kleene:  # an undecided instance must not hide a deciding one
                return _Src(f"_kleene_q({e.is_forall()}, lambda {', '.join(vs)}: {body.text}, "
                            f"{', '.join(carriers)})", True, True)
            loops = " ".join(f"for {v} in {c}" for v, c in zip(vs, carriers, strict=True))
            return _Src(f"{'all' if e.is_forall() else 'any'}({body.text} {loops})", True, body.risky)
        if z3.is_int_value(e):
            return _Src(str(e.as_long()), True)
        if z3.is_true(e):
            return _Src("True", True)
        if z3.is_false(e):
            return _Src("False", True)
        if not z3.is_app(e):
            raise Unsupported(f"term {e}")
        kind = e.decl().kind()
        args = e.children()
        if kind == z3.Z3_OP_UNINTERPRETED:
            if e.eq(NULL):
                return _Src("0", True)
            if e.eq(EMPTY):
                return _Src(str(self.domain.content_id[EMPTY_PREFIX]), True)
            name = e.decl().name()
            if not args:
                if name not in self.names:
                    raise Unsupported(f"free constant {e}")
                p = self.names[name]
                # the scalar fields are always defined; step arguments too
                return _Src(p, True)
            if name == "prefix" and len(args) == 2:
                a, b = (self.scalar(x, env) for x in args)
                return _Src(f"_PREFIX[{self.strict(a)}][{self.strict(b)}]", True,
                            self.risky_index(a) or self.risky_index(b))
            raise Unsupported(f"function {name}")
        if kind == z3.Z3_OP_SELECT:
            arr = self.array(args[0], env)
            return arr.select([self.scalar(x, env) for x in args[1:]])
        if kind == z3.Z3_OP_ITE:
            c = self.scalar(args[0], env)
            a, b = self.scalar(args[1], env), self.scalar(args[2], env)
            return _Src(f"({a.text} if {c.text} else {b.text})", a.definite and b.definite,
                        c.risky or a.risky or b.risky)
        sub = [self.scalar(x, env) for x in args]
        t = [x.text for x in sub]
        risky = any(x.risky for x in sub)
        if kind == z3.Z3_OP_AND:
            return self.junction("and", sub)
        if kind == z3.Z3_OP_OR:
            return self.junction("or", sub)
        if kind == z3.Z3_OP_NOT:
            return _Src(f"(not {t[0]})", True, risky)
        if kind == z3.Z3_OP_IMPLIES:
            return self.junction("or", [_Src(f"(not {t[0]})", True, sub[0].risky), sub[1]])
        if kind in (z3.Z3_OP_EQ, z3.Z3_OP_IFF):
            return self.eq(sub[0], sub[1], args[0].sort())
        if kind == z3.Z3_OP_DISTINCT:
            pairs = [self.eq(sub[i], sub[j], args[0].sort())
                     for i in range(len(sub)) for j in range(i + 1, len(sub))]
            return self.junction("and", [_Src(f"(not {p.text})", True, p.risky) for p in pairs])
        # None in arithmetic or an order comparison raises TypeError: Undetermined
        loose = risky or not all(x.definite for x in sub)
        arith = {z3.Z3_OP_ADD: "+", z3.Z3_OP_SUB: "-", z3.Z3_OP_MUL: "*"}
        if kind in arith:
            return _Src("(" + f" {arith[kind]} ".join(t) + ")", True, loose)
        if kind == z3.Z3_OP_UMINUS:
            return _Src(f"(-{t[0]})", True, loose)
        if kind == z3.Z3_OP_MOD:
            return _Src(f"_mod({t[0]}, {t[1]})", True, loose)
        compare = {z3.Z3_OP_LT: "<", z3.Z3_OP_LE: "<=", z3.Z3_OP_GT: ">", z3.Z3_OP_GE: ">="}
        if kind in compare:
            return _Src(f"({t[0]} {compare[kind]} {t[1]})", True, loose)
        raise Unsupported(f"operation {e.decl()} in {e}")


# --------------------------------------------------------------------------
# Compiled predicates and steps.

Predicate = Callable[[Interp], bool]


def _namespace(d: Carriers) -> dict[str, Any]:
    return {"_B": range(d.num_blocks), "_KS": range(len(d.keys)), "_CS": range(len(d.contents)),
            "_PREFIX": d.prefix_table(), "_eq": _eq, "_d": _d, "_mod": _mod,
            "_store1": _store1, "_store2": _store2, "_kleene": _kleene, "_kleene_q": _kleene_q,
            "frozenset": frozenset, "tuple": tuple,
            "all": all, "any": any, "len": len, "_U": _UNSET}


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


def _function(name: str, params: str, comp: _Compiler, body: str) -> list[str]:
    return [f"def {name}({params}):", *comp.generated(body), f"    return {body}", ""]


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
                  bodies: Mapping[str, Callable[[_Compiler], str]], label: str,
                  extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Callable[..., Any]], str]:
    """Each body (Python source made by a compiler over ``names``) as a function of ``params``.

    Each is compiled twice, plain and in Kleene's logic; the plain form runs first and the
    Kleene form decides where it meets an undefined cell (:func:`_guarded`).
    """
    sig = ", ".join(params)
    lines = []
    for fn, body in bodies.items():
        for mode in ("plain", "kleene"):
            comp = _Compiler(names, d, kleene=mode == "kleene")
            lines += _function(f"{fn}_{mode}", sig, comp, body(comp))
    src = "\n".join(lines)
    ns = {**_namespace(d), **(extra or {})}
    exec(compile(src, f"<{label}>", "exec"), ns)
    return {fn: _guarded(ns[f"{fn}_plain"], ns[f"{fn}_kleene"], f"{label} {fn}") for fn in bodies}, src


def compile_predicate(d: Carriers, pred: Callable[[SymState], Expr], name: str = "") -> Predicate:
    """A state predicate (an invariant of :mod:`.invariants`) as a Python function of an :class:`Interp`."""
    s = SymState.fresh("eval")
    term = pred(s)
    fns, src = compile_terms(d, _state_names(s), FIELDS, {"pred": lambda c: c.scalar(term, []).text},
                             f"predicate {name or pred.__name__}")
    guarded = fns["pred"]

    def on(st: Interp) -> bool:
        return bool(guarded(*st))
    on.source = src  # type: ignore[attr-defined]
    return on


def _built(comp: _Compiler, term: Expr) -> str:
    """An array term built, or a scalar's value."""
    return (comp.array(term, []).build() if term.sort().kind() == z3.Z3_ARRAY_SORT
            else comp.scalar(term, []).text)


def compile_step(d: Carriers, spec: StepSpec) -> Compiled:
    """``spec``'s step as Python functions over :class:`Interp` (compiled once per domain)."""
    s = SymState.fresh("eval")
    names = _state_names(s)
    args = spec.fresh_args("_eval")
    params = [f"a_{n}" for n, _sort in spec.args]
    for a, p in zip(args, params, strict=True):
        names[a.decl().name()] = p
    st = spec.fn(s, *args)

    def post(comp: _Compiler) -> str:
        fields = [_built(comp, getattr(st.post, f)) for f in FIELDS]
        return ("(_Interp(" + ",\n                    ".join(fields) + "),\n"
                f"            {_built(comp, st.removed)},\n            {_built(comp, st.stored)})")

    fns, src = compile_terms(d, names, [*FIELDS, *params],
                             {"pre": lambda c: c.scalar(st.pre, []).text, "post": post},
                             f"step {spec.name}", {"_Interp": Interp})
    pre_fn, post_fn = fns["pre"], fns["post"]

    def run_pre(state: Interp, *a: Any) -> bool:
        return bool(pre_fn(*state, *a))

    def run_post(state: Interp, *a: Any) -> tuple[Interp, frozenset[tuple[int, int]],
                                                  frozenset[tuple[int, int]]]:
        out: tuple[Interp, frozenset[tuple[int, int]], frozenset[tuple[int, int]]] = post_fn(*state, *a)
        return out
    return Compiled(spec.name, run_pre, run_post, src)


def compile_claim(d: Carriers, spec: StepSpec, claim: Callable[..., Expr], label: str) -> Callable[..., bool]:
    """A step property's claim about ``spec``'s step as ``(state, post, *args, pre, removed, stored)``:
    the step's precondition, next state and event entries given as values (the model's), not
    computed by the step, so that the claim can be asked of a transition the step did not make."""
    s, p = SymState.fresh("eval"), SymState.fresh("eval.post")
    names = {**_state_names(s), **{getattr(p, f).decl().name(): f"p_{f}" for f in FIELDS}}
    args = spec.fresh_args("_evalc")
    params = [f"a_{n}" for n, _sort in spec.args]
    for a, q in zip(args, params, strict=True):
        names[a.decl().name()] = q
    entries = z3.ArraySort(KeySort, Block, z3.BoolSort())
    pre, removed, stored = (z3.Bool("eval.claim.pre"), z3.Const("eval.claim.removed", entries),
                            z3.Const("eval.claim.stored", entries))
    names.update({"eval.claim.pre": "c_pre", "eval.claim.removed": "c_removed",
                  "eval.claim.stored": "c_stored"})
    term = claim(s, args, SymStep(pre, p, removed, stored))
    fns, _ = compile_terms(d, names, [*FIELDS, *(f"p_{f}" for f in FIELDS), *params, "c_pre", "c_removed",
                                      "c_stored"], {"claim": lambda c: c.scalar(term, []).text}, label)
    fn = fns["claim"]

    def run(state: Interp, post: Interp, *a: Any) -> bool:
        return bool(fn(*state, *post, *a))
    return run


# --------------------------------------------------------------------------
# The free queue with places (:mod:`.order`): its steps and claims, compiled the same way.


class QInterp(NamedTuple):
    """A concrete :class:`~kvpool.proofs.order.QState`: the queue as places, same field names."""

    ref: tuple[int, ...]
    free: tuple[bool, ...]
    cached: tuple[bool, ...]
    pos: tuple[int | None, ...]
    """The place of each queued block; ``None`` (undefined) for the others."""
    lo: int
    hi: int
    head: int
    gap: int


def queue_of(s: PoolState) -> QInterp:
    """The model's queue as places ``0 .. len - 1``, head first; no reservation pending."""
    place = {b: i for i, b in enumerate(s.free)}
    n = s.num_blocks
    return QInterp(tuple(s.ref), tuple(b in place for b in range(n)),
                   tuple(s.caching and s.primary[b] is not None for b in range(n)),
                   tuple(place.get(b) for b in range(n)), 0, len(place), 0, 0)


def queue_order(q: QInterp) -> tuple[int, ...]:
    """The queued blocks in the order of their places (head first)."""
    queued = [b for b, f in enumerate(q.free) if f]
    return tuple(sorted(queued, key=lambda b: _d(q.pos[b])))


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
    for a, q in zip(args, params, strict=True):
        names[a.decl().name()] = q
    st = fn(s, *args)
    mine = list(QInterp._fields)
    theirs = [f"p_{f}" for f in mine]

    def post(comp: _Compiler) -> str:
        return "_QInterp(" + ", ".join(_built(comp, getattr(st.post, f)) for f in mine) + ")"

    bodies: dict[str, Callable[[_Compiler], str]] = {
        "pre": lambda c: c.scalar(st.pre, []).text, "post": post}
    fns, _ = compile_terms(d, names, [*mine, *params], bodies, f"queue step {name}", {"_QInterp": QInterp})
    terms = {prop: claim(name, s, p, args) for prop, claim in properties.items()}
    def body(term: Expr) -> Callable[[_Compiler], str]:
        return lambda c: c.scalar(term, []).text

    claims, _ = compile_terms(d, names, [*mine, *theirs, *params],
                              {f"c{i}": body(t) for i, t in enumerate(terms.values())},
                              f"order claims of {name}")
    pre_fn, post_fn = fns["pre"], fns["post"]
    by_name = dict(zip(terms, claims.values(), strict=True))

    def run_claim(prop: str) -> Callable[..., bool]:
        c = by_name[prop]
        return lambda q, qp, *a: bool(c(*q, *qp, *a))

    return CompiledQueue(name, lambda q, *a: bool(pre_fn(*q, *a)), lambda q, *a: post_fn(*q, *a),
                         {prop: run_claim(prop) for prop in terms})


# --------------------------------------------------------------------------
# The evaluator against z3 itself.


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


__all__ = [
    "Carriers",
    "Compiled",
    "Interp",
    "Predicate",
    "Undetermined",
    "Unsupported",
    "abstract",
    "compile_predicate",
    "compile_step",
    "cross_check",
]
