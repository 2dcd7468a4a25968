"""The tables of ``docs/operations.md``, made from the model: refusals in precedence order, versions.

An engine author implements a pool from ``docs/operations.md``; its tables
are made here from the specification's code, so that the page cannot drift
from it: ``tests/test_operations_page.py`` fails when they differ, and
``python -m kvpool.operations_page --write docs/operations.md`` rewrites them.
Each operation's refusals are read off its guard (``model/guards.py``); what
each ``reference`` changes, off ``model.REFERENCES`` and the docstrings of
the settings it sets (``model/state.py``).

A guard is a sequence of checks, the first that fails deciding the call:
``if COND: raise Refusal(KIND, MESSAGE)`` (refused), ``if COND: return Noop()``
(accepted, nothing changes), a ``check_*`` helper (its checks, its arguments
put in for its parameters), a ``for`` loop over such checks (refused for the
first element that fails).  A table row is one such check: its outcome,
its condition as the guard writes it, and its rule in words (the helper's
docstring, or the refusal's message).  A guard the reader does not recognise
is an error here, not a silent gap in the page.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.model import OPERATIONS, REFERENCES, guards, state
from kvpool.model.refusals import RefusalKind
from kvpool.oracle.core.abstraction import REFUSAL_NAMES

NOOP = "accepted, changes nothing"
"""The outcome of a check that finds the call changes nothing (the guard's ``Noop``)."""
INLINE = 40
"""A local value this short is written into the conditions; a longer one is named below the table."""
BEGIN = "<!-- {op}: made from the model by `python -m kvpool.operations_page --write` -->"
END = "<!-- end of {op} -->"
VERSIONS = "references"
"""The marker name of the table of what each ``reference`` sets."""


@dataclass(frozen=True)
class Row:
    """One check of a guard."""

    outcome: str
    """The error class a pool refuses with (``UnknownBlockError``), or :data:`NOOP`."""
    when: str
    """The condition under which it applies, as Python over the state ``s`` and the arguments."""
    rule: str
    """The rule in words."""


@dataclass
class _Scope:
    names: dict[str, ast.expr]
    """Parameters and short locals, by the expression written in their place."""
    where: dict[str, str]
    """Longer locals: named in the conditions, defined below the table."""
    loop: str = ""


class _Put(ast.NodeTransformer):
    def __init__(self, names: dict[str, ast.expr]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.names.get(node.id, node)


def _put(node: ast.expr, scope: _Scope) -> ast.expr:
    """A copy of ``node`` with the scope's names put in."""
    put: ast.expr = _Put(scope.names).visit(ast.parse(ast.unparse(node), mode="eval").body)
    return put


def _code(node: ast.expr, scope: _Scope) -> str:
    return ast.unparse(_put(node, scope))


def _negated(test: ast.expr, scope: _Scope) -> str:
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        return _code(ast.Compare(test.left, [ast.NotEq()], test.comparators), scope)
    return "not " + _code(test, scope)


def _code_stmt(node: ast.stmt, scope: _Scope) -> str:
    put = _Put(scope.names).visit(ast.parse(ast.unparse(node)).body[0])
    return ast.unparse(put)


def _function(fn: Callable[..., Any]) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"{fn.__name__}: not a function")
    return node


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def _message(node: ast.expr, scope: _Scope) -> str:
    """A refusal's message, its placeholders written as the values they show."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                out.append("{" + _code(part.value, scope) + "}")
        return "".join(out)
    return _code(node, scope)


def _refusal(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """``raise Refusal(RefusalKind.K, message)``: the error class of K and the message."""
    if not (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)
            and isinstance(stmt.exc.func, ast.Name) and stmt.exc.func.id == "Refusal"):
        return None
    kind, message = stmt.exc.args
    if not (isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name)
            and kind.value.id == "RefusalKind"):
        raise ValueError(f"a refusal of an unnamed kind: {ast.unparse(stmt)}")
    return REFUSAL_NAMES[RefusalKind[kind.attr]], message


def _noop(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "Noop")


def _rows(body: list[ast.stmt], scope: _Scope, rule: str, where: str) -> Iterator[Row]:
    for stmt in body:
        if isinstance(stmt, ast.If) and len(stmt.body) == 1 and not stmt.orelse:
            when = scope.loop + _code(stmt.test, scope)
            refused = _refusal(stmt.body[0])
            if refused is not None:
                yield Row(refused[0], when, rule or _message(refused[1], scope))
                continue
            if _noop(stmt.body[0]):
                yield Row(NOOP, when, "")
                continue
            if isinstance(stmt.body[0], ast.Continue):  # the rest of the loop skips these
                scope.loop = f"{scope.loop[:-2]} if {_negated(stmt.test, scope)}: "
                continue
            raise ValueError(f"{where}: a check this reader does not know: {ast.unparse(stmt)}")
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            yield from _helper(stmt.value, scope, where)
        elif isinstance(stmt, ast.For):
            inner = _Scope(dict(scope.names), scope.where)
            for bound in ast.walk(stmt.target):
                if isinstance(bound, ast.Name):
                    inner.names.pop(bound.id, None)
            items, target = _put(stmt.iter, scope), stmt.target
            if isinstance(items, ast.List) and len(items.elts) == 1 and isinstance(target, ast.Name):
                inner.names[target.id] = items.elts[0]  # one element: no loop to speak of
            else:
                inner.loop = f"{scope.loop}for some {ast.unparse(target)} in {ast.unparse(items)}: "
            yield from _rows(stmt.body, inner, rule, where)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and stmt.value is not None:
                name, value = targets[0].id, _put(stmt.value, scope)
                text = ast.unparse(value)
                if len(text) <= INLINE and not isinstance(value, ast.Dict | ast.List | ast.Set):
                    scope.names[name] = ast.parse(f"({text})", mode="eval").body
                else:
                    scope.where[name] = f"`{text}`"
            elif len(targets) == 1 and isinstance(targets[0], ast.Subscript) and isinstance(
                    targets[0].value, ast.Name) and targets[0].value.id in scope.where:
                each = scope.loop.replace("for some", "for each")
                scope.where[targets[0].value.id] += f", then `{each}{_code_stmt(stmt, scope)}`"
        elif isinstance(stmt, ast.Return) and (stmt.value is None or (
                isinstance(stmt.value, ast.Constant) and stmt.value.value is None)):
            return
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        elif not isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
            raise ValueError(f"{where}: a statement this reader does not know: {ast.unparse(stmt)}")


def _helper(call: ast.Call, scope: _Scope, where: str) -> Iterator[Row]:
    """A ``check_*`` helper's rows, its parameters standing for the call's arguments."""
    if not (isinstance(call.func, ast.Name) and call.func.id.startswith("check_")):
        raise ValueError(f"{where}: a call this reader does not know: {ast.unparse(call)}")
    fn = getattr(guards, call.func.id)
    node = _function(fn)
    params = [a.arg for a in node.args.args]
    names = {p: _put(arg, scope) for p, arg in zip(params, call.args, strict=False)}
    inner = _Scope(names, scope.where, scope.loop)
    rule = _first_line(fn.__doc__)
    for key, value in names.items():  # the rule's parameters, as the call's arguments
        rule = rule.replace(f"``{key}``", f"`{ast.unparse(value)}`")
    named = names.get("name")
    if isinstance(named, ast.Constant) and isinstance(named.value, str):  # the argument it checks
        rule = f"{named.value}: {rule[0].lower()}{rule[1:]}"
    yield from _once(_rows(node.body, inner, rule.replace("``", "`"), f"{where} > {call.func.id}"))


def _once(rows: Iterable[Row]) -> list[Row]:
    """The rows in order, a check made again (by a helper) left out: it never decides."""
    first: dict[tuple[str, str], Row] = {}
    for row in rows:
        first.setdefault((row.outcome, row.when), row)
    return list(first.values())


def rows(op: str) -> tuple[list[Row], dict[str, str]]:
    """The checks of ``op``'s guard in order, and the long locals its conditions name."""
    decl = OPERATIONS[op]
    node = _function(decl.guard)
    scope = _Scope({}, {})
    out = _once(_rows(node.body, scope, "", decl.guard.__name__))
    said = " ".join([r.when for r in out] + list(scope.where.values()))
    for name, value in vars(guards).items():  # the module's constants and helpers the rows name
        if not re.search(rf"\b{re.escape(name)}\b", said) or name.startswith("_"):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            scope.where[name] = f"`{value}`"
        elif inspect.isfunction(value) and not name.startswith("check_"):
            scope.where[f"{name}(...)"] = _first_line(value.__doc__).replace("``", "`")
    return out, scope.where


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(op: str) -> str:
    """``op``'s refusal precedence as a Markdown table (and the locals it names), between the
    page's markers."""
    found, where = rows(op)
    lines = [BEGIN.format(op=op), ""]
    if not found:
        lines.append(f"`{op}` refuses nothing: every call is accepted.")
    else:
        lines += ["| # | outcome | when | the rule |", "|---|---|---|---|"]
        for i, row in enumerate(found, 1):
            outcome = f"`{row.outcome}`" if row.outcome != NOOP else NOOP
            lines.append(f"| {i} | {outcome} | `{_cell(row.when)}` | {_cell(row.rule)} |")
        if where:
            lines += ["", "where " + "; ".join(
                f"`{k}`: {_cell(v)}" if k.endswith("(...)") else f"`{k}` = {_cell(v)}"
                for k, v in where.items())]
    lines += ["", END.format(op=op)]
    return "\n".join(lines)


def settings_docs() -> dict[str, str]:
    """The docstring of each setting of ``PoolState`` (an attribute's, as written below it)."""
    tree = ast.parse(inspect.getsource(state))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PoolState")
    out = {}
    for stmt, after in zip(cls.body, cls.body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
            out[stmt.target.id] = " ".join(str(after.value.value).split())
    return out


def references() -> str:
    """What each ``reference`` a header may name sets, as a Markdown table."""
    docs = settings_docs()
    names = sorted({k for settings in REFERENCES.values() for k in settings})
    lines = [BEGIN.format(op=VERSIONS), "",
             "| setting | what it decides | " + " | ".join(f'`"{v}"`' for v in REFERENCES) + " |",
             "|---|---|" + "---|" * len(REFERENCES)]
    for name in names:
        values = " | ".join(str(dict(settings)[name]).lower() for settings in REFERENCES.values())
        lines.append(f"| `{name}` | {_cell(docs[name].replace('``', '`'))} | {values} |")
    lines += ["", END.format(op=VERSIONS)]
    return "\n".join(lines)


def tables() -> dict[str, str]:
    """Every pool operation's table, by its name, and the references' table."""
    out = {op: table(op) for op, decl in OPERATIONS.items() if decl.role != "caller"}
    out[VERSIONS] = references()
    return out


def rewrite(page: str) -> tuple[str, list[str]]:
    """The page with each operation's table made again; and the operations it has no place for."""
    missing = []
    for op, text in tables().items():
        begin, end = BEGIN.format(op=op), END.format(op=op)
        at = page.find(begin)
        stop = page.find(end, at)
        if at < 0 or stop < 0:
            missing.append(op)
            continue
        page = page[:at] + text + page[stop + len(end):]
    return page, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.operations_page",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("page", nargs="?", help="a page with the tables' markers (without --write: "
                        "exit 1 if its tables differ from the model)")
    parser.add_argument("--write", action="store_true", help="rewrite the page's tables")
    args = parser.parse_args(argv)
    if args.page is None:
        print("\n\n".join(tables().values()))
        return 0
    path = Path(args.page)
    page = path.read_text()
    new, missing = rewrite(page)
    for op in missing:
        print(f"{path}: no place for the table of {op} ({BEGIN.format(op=op)})", file=sys.stderr)
    if args.write:
        path.write_text(new)
    elif new != page:
        print(f"{path}: its tables differ from the model (rewrite them with --write)", file=sys.stderr)
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
