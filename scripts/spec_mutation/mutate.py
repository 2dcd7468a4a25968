"""Mutants of the specification, generated from its syntax tree: every site, every operator.

A mutant is one small edit of one file of the specification (the model's actions, guards,
contracts, properties, invariants, domains and split; the z3 steps, invariants, step
properties and queue order).  The operators are those of mutation testing (mutmut's, and
the z3 forms of them): a comparison turned around, ``and``/``or`` swapped or one operand
dropped (one conjunct of a ``z3.And``/``z3.Or`` too), a ``not`` dropped, a number moved by
one, ``True``/``False`` swapped, an arithmetic operator swapped, ``min``/``max`` swapped,
an update forgotten (a call or ``raise`` statement, an assignment to a field or an item, a
``z3.Store``, a field of ``replace(...)``), one value of a literal a loop or a membership
test reads dropped, ``break``/``continue`` swapped, the branches of a ``z3.If`` swapped, a
``z3.Implies`` without its premise, ``ForAll``/``Exists`` swapped.

Not mutated: strings (messages, labels and names: the formal side reads none of them),
docstrings, type annotations, decorators (a dataclass's flags, the names a property is
registered under), imports, ``__all__`` and ``assert`` statements.  A mutant
whose code equals the original's is not made.

Sites are numbered in a fixed walk of the tree, so ``(file, number)`` names a mutant as long
as the file is unchanged; each carries the digest of its file, and a mutant of a file that
changed since is refused rather than applied to other code.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FILES: tuple[str, ...] = (
    "model/pool.py", "model/guards.py", "model/contracts.py", "model/properties.py",
    "model/invariants.py", "model/domains.py", "model/split.py",
    "proofs/transitions.py", "proofs/invariants.py", "proofs/step_properties.py", "proofs/order.py",
)

STEP = "__spec_step__"
"""The name of the step counter the judge puts in a mutated module (:func:`instrumented`)."""


def module_of(path: str) -> str:
    """The import name of a file of the specification (``model/pool.py`` -> ``kvpool.model.pool``)."""
    return "kvpool." + path.removesuffix(".py").replace("/", ".")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Mutant:
    """One edit of one file: where, which operator, and the code before and after."""

    file: str
    number: int
    """Its place among the file's mutants, in the walk's order."""
    line: int
    operator: str
    before: str
    after: str
    file_digest: str
    place: str = ""
    """Where and what, without the number: the function, the statement's first line, the operator,
    the code before and after (and ``|k`` for the k-th such edit), stable under edits elsewhere."""

    @property
    def id(self) -> str:
        return f"{self.file}#{self.number}"

    def describe(self) -> str:
        return f"{self.id} (line {self.line}, {self.operator}): {self.before}  ->  {self.after}"


# --------------------------------------------------------------------------
# The operators.  Each yields, for one node, (operator name, edit); an edit changes the node
# (or its parent's list of statements) in place and returns the node that now stands there.

Edit = Callable[[ast.AST], ast.AST]

CMP_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
BIN_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv,
}
AUG_SWAP: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}
Z3_SWAP = {"And": "Or", "Or": "And", "ForAll": "Exists", "Exists": "ForAll"}


def _z3_call(node: ast.AST, *names: str) -> bool:
    """``node`` is ``z3.NAME(...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "z3"
            and node.func.attr in names)


def _named_call(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _setting(attr: str, change: Callable[[Any], Any]) -> Edit:
    """An edit that replaces the node's ``attr`` by ``change`` of it."""
    def edit(n: ast.AST) -> ast.AST:
        setattr(n, attr, change(getattr(n, attr)))
        return n
    return edit


def _without(i: int) -> Callable[[list[Any]], list[Any]]:
    return lambda items: [v for j, v in enumerate(items) if j != i]


def _renamed(n: ast.AST) -> ast.AST:
    """``min``/``max`` or a ``z3`` call swapped for its dual (:data:`Z3_SWAP`)."""
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
        n.func.id = "max" if n.func.id == "min" else "min"
    elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
        n.func.attr = Z3_SWAP[n.func.attr]
    return n


def _expression_ops(node: ast.AST) -> Iterator[tuple[str, Edit]]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if (swap := CMP_SWAP.get(type(op))) is not None:  # operator i turned around
                yield "comparison", _setting("ops", lambda ops, i=i, swap=swap: [
                    swap() if j == i else o for j, o in enumerate(ops)])
    elif isinstance(node, ast.BoolOp):
        yield "and/or", _setting("op", lambda op: ast.Or() if isinstance(op, ast.And) else ast.And())
        yield from _drop_operands("operand dropped", len(node.values), "values")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not dropped", lambda n: n.operand  # type: ignore[attr-defined,no-any-return]
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "true/false", _setting("value", lambda v: not v)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "number", _setting("value", lambda v: v + 1)
    elif isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAP:
        yield "arithmetic", _setting("op", lambda op: BIN_SWAP[type(op)]())
    elif _named_call(node, "min", "max"):
        yield "min/max", _renamed
    elif _z3_call(node, "And", "Or"):
        assert isinstance(node, ast.Call)
        yield "z3 and/or", _renamed
        if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
            yield from _drop_operands("z3 operand dropped", len(node.args), "args")
    elif _z3_call(node, "ForAll", "Exists"):
        yield "forall/exists", _renamed
    elif _z3_call(node, "Not"):
        yield "z3 not dropped", lambda n: n.args[0]  # type: ignore[attr-defined,no-any-return]
    elif _z3_call(node, "Implies"):
        yield "z3 premise dropped", lambda n: n.args[1]  # type: ignore[attr-defined,no-any-return]
    elif _z3_call(node, "If"):
        yield "z3 if branches", _setting("args", lambda a: [a[0], a[2], a[1], *a[3:]])
    elif _z3_call(node, "Store"):
        yield "z3 store forgotten", lambda n: n.args[0]  # type: ignore[attr-defined,no-any-return]
    if _named_call(node, "replace") and isinstance(node, ast.Call):
        for i in range(len(node.keywords)):
            yield f"field {node.keywords[i].arg} not replaced", _setting("keywords", _without(i))


def _drop_operands(name: str, count: int, attr: str) -> Iterator[tuple[str, Edit]]:
    for i in range(count):
        def drop(n: ast.AST, i: int = i) -> ast.AST:
            rest = _without(i)(getattr(n, attr))
            if len(rest) == 1 and isinstance(n, ast.BoolOp):
                return rest[0]  # type: ignore[no-any-return]
            setattr(n, attr, rest)
            return n
        yield name, drop


def _statement_ops(stmt: ast.stmt) -> Iterator[tuple[str, Edit]]:
    forgotten: Edit = lambda n: ast.copy_location(ast.Pass(), n)  # noqa: E731
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call | ast.Yield | ast.YieldFrom):
        yield "statement dropped", forgotten
    elif isinstance(stmt, ast.Raise):
        yield "raise dropped", forgotten
    elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Attribute | ast.Subscript | ast.Tuple)
                                              for t in stmt.targets) and not _binds_names(stmt):
        yield "update dropped", forgotten
    elif isinstance(stmt, ast.AugAssign):
        if type(stmt.op) in AUG_SWAP:
            yield "augmented assignment", _setting("op", lambda op: AUG_SWAP[type(op)]())
        if isinstance(stmt.target, ast.Attribute | ast.Subscript):
            yield "update dropped", forgotten
    elif isinstance(stmt, ast.Break):
        yield "break/continue", lambda n: ast.copy_location(ast.Continue(), n)
    elif isinstance(stmt, ast.Continue):
        yield "break/continue", lambda n: ast.copy_location(ast.Break(), n)


def _binds_names(stmt: ast.Assign) -> bool:
    """An assignment that (also) binds a plain name: dropping it only makes a ``NameError``."""
    return any(isinstance(e, ast.Name) for t in stmt.targets for e in ast.walk(t)
               if isinstance(t, ast.Tuple))


# --------------------------------------------------------------------------
# The walk.


def _skipped(node: ast.AST) -> bool:
    """Subtrees never mutated: imports, ``__all__``, asserts, ``TYPE_CHECKING`` blocks."""
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Assert):
        return True
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """The children a mutation may reach: not annotations, not docstrings."""
    for name, value in ast.iter_fields(node):
        if name in ("annotation", "returns", "type_comment", "decorator_list") or (
                isinstance(node, ast.AnnAssign) and name == "target"):
            continue
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, ast.AST):
                continue
            if name == "body" and i == 0 and _docstring(item):
                continue
            yield item


def _docstring(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _iterated_literals(tree: ast.AST) -> set[int]:
    """The ids of literals a ``for`` (or comprehension) iterates over or an ``in`` test reads."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.comprehension):
            out.add(id(node.iter))
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    out.add(id(right))
    return out


Site = tuple[ast.AST, str, Edit, ast.AST, str]
"""(node, operator, edit, enclosing statement, enclosing function's qualified name)."""


def _sites(tree: ast.AST) -> Iterator[Site]:
    """Every site of the tree, in a fixed order (depth first, fields in order)."""
    literals = _iterated_literals(tree)

    def walk(node: ast.AST, stmt: ast.AST, where: str = "") -> Iterator[Site]:
        if _skipped(node):
            return
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            where = f"{where}.{node.name}" if where else node.name
        if isinstance(node, ast.stmt):
            stmt = node
            for name, edit in _statement_ops(node):
                yield node, name, edit, stmt, where
        if isinstance(node, ast.expr):
            for name, edit in _expression_ops(node):
                yield node, name, edit, stmt, where
            if (id(node) in literals and isinstance(node, ast.Tuple | ast.List | ast.Set)
                    and len(node.elts) >= 2):  # one value of a literal a loop or a membership test reads
                for i in range(len(node.elts)):
                    yield node, "value dropped", _setting("elts", _without(i)), stmt, where
        for child in _children(node):
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                continue
            yield from walk(child, stmt, where)

    yield from walk(tree, tree)


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    if new is old:
        return
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise ValueError("node not found in its tree")


def _show(node: ast.AST) -> str:
    text = ast.unparse(node) if not isinstance(node, ast.Pass) else "pass"
    first = text.splitlines()[0] if text else text
    return first if len(first) <= 100 else first[:97] + "..."


def source(path: str, root: Path = ROOT) -> str:
    """A file of the specification, under ``root`` (the checkout, or a staged copy of the package)."""
    return (root / path).read_text(encoding="utf-8")


def mutants(path: str, root: Path = ROOT) -> list[Mutant]:
    """Every mutant of one file, numbered in the walk's order (edits that change no code left out)."""
    text = source(path, root)
    tree = ast.parse(text)
    out: list[Mutant] = []
    seen: dict[str, int] = {}
    for number, (node, operator, edit, stmt, where) in enumerate(_sites(tree)):
        changed = edit(copy.deepcopy(node))
        if ast.unparse(node) == ast.unparse(changed):
            continue
        before, after = _show(node), _show(changed)
        name = f"{where or '<module>'}|{_show(stmt)}|{operator}|{before}|{after}"
        seen[name] = seen.get(name, 0) + 1
        out.append(Mutant(path, number, getattr(node, "lineno", 0), operator, before, after, digest(text),
                          name + (f"|{seen[name]}" if seen[name] > 1 else "")))
    return out


def apply(m: Mutant, root: Path = ROOT) -> ast.Module:
    """The mutated module's tree (refused if the file changed since the mutant was made)."""
    text = source(m.file, root)
    if digest(text) != m.file_digest:
        raise ValueError(f"{m.file} changed since {m.id} was made: regenerate the mutants")
    tree = ast.parse(text)
    for i, (node, _operator, edit, _stmt, _where) in enumerate(_sites(tree)):
        if i == m.number:
            _replace(tree, node, edit(node))
            return ast.fix_missing_locations(tree)
    raise IndexError(f"no site {m.number}")


class _Counted(ast.NodeTransformer):
    """Every function body and loop body of a module first calls the step counter."""

    def _visit_body(self, node: ast.FunctionDef | ast.For | ast.While) -> ast.AST:
        self.generic_visit(node)
        call = ast.copy_location(ast.Expr(ast.Call(ast.Name(STEP, ast.Load()), [], [])), node.body[0])
        at = 1 if _docstring(node.body[0]) else 0
        node.body = [*node.body[:at], call, *node.body[at:]]
        return node

    visit_FunctionDef = visit_For = visit_While = _visit_body


def instrumented(tree: ast.Module) -> ast.Module:
    """``tree`` with a call of :data:`STEP` at the head of every function and loop body: the
    judge's step budget counts them (so that a mutant looping forever is cut by work, not time)."""
    out = _Counted().visit(copy.deepcopy(tree))
    assert isinstance(out, ast.Module)
    return ast.fix_missing_locations(out)


def population(root: Path = ROOT, files: tuple[str, ...] = FILES) -> dict[str, list[Mutant]]:
    """Every mutant of every file of the specification under ``root``."""
    return {f: mutants(f, root) for f in files}


__all__ = ["FILES", "STEP", "Mutant", "apply", "digest", "instrumented", "module_of", "mutants",
           "population", "source"]
