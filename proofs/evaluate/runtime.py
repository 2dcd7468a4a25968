"""What compiled code calls at run time: decisions that refuse to read an undefined cell.

A cell the model leaves undefined is ``None``; an equality, an index, arithmetic or
``prefix`` that reads one raises :class:`Undetermined` (z3 leaves such a cell free, so the
value would depend on it); ``and``/``or`` and the quantifiers decide in Kleene's logic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any


class Undetermined(Exception):
    """The value depends on a cell the concrete state leaves undefined (z3 leaves it free)."""


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


def defined(a: Any) -> Any:
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


NAMESPACE: dict[str, Any] = {
    "_eq": _eq, "_d": defined, "_mod": _mod, "_store1": _store1, "_store2": _store2, "_kleene": _kleene,
    "_kleene_q": _kleene_q, "frozenset": frozenset, "tuple": tuple, "all": all, "any": any, "len": len,
    "_U": _UNSET}
"""The names compiled code reads besides a domain's carriers (:func:`.compiled.namespace`)."""
