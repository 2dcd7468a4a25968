"""A z3 term compiled: Python source text, scalar or array."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class Unsupported(Exception):
    """A term outside the small language the encoding uses."""


@dataclass(frozen=True)
class Src:
    """A compiled scalar: Python source, whether its value is never ``None``, whether it may raise."""

    text: str
    definite: bool
    risky: bool = False
    """Evaluating it may raise :class:`Undetermined` (it decides on a cell that may be undefined)."""


class Arr:
    """A compiled array term: read it at an index without building it, or build it."""

    def __init__(self, select: Callable[[list[Src]], Src], build: Callable[[], str]) -> None:
        self.select = select
        self.build = build
