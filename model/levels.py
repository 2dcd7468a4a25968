"""The loop every small-pool search shares: breadth first, one level of calls at a time.

The bounded model checker, the agreement of the z3 encoding with the model and the bounded
refinement of a pool all explore the states of a small pool level by level, each doing its
own work on a state's calls.  Written once here (plain Python, so that the proofs and the
oracle, which may not import each other, both can): the levels, the frontier, a cut by a
budget (reported, never a verdict of its own) and an early stop when a search has found what
it looks for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

N = TypeVar("N")


class Stop(Exception):
    """Raised by a search's ``expand`` to end the whole search now (it found what it looks for)."""


@dataclass
class Levels:
    """How far a breadth-first search got."""

    depth: int = 0
    """Levels fully explored."""
    complete: bool = False
    """Every level to the depth asked for was explored (or the frontier ran out first)."""
    stopped: bool = False
    """``expand`` raised :class:`Stop`."""
    expanded: int = 0
    """The nodes of the level last explored whose calls were all made (when cut or stopped: how
    far into the next level the search got)."""
    frontier: int = 0
    """That level's nodes."""


@dataclass
class Stopwatch:
    """Wall-clock and processor seconds since it started (a shared machine makes the first say little)."""

    began: float = field(default_factory=time.perf_counter)
    cpu: float = field(default_factory=time.process_time)

    def seconds(self) -> float:
        return time.perf_counter() - self.began

    def cpu_seconds(self) -> float:
        return time.process_time() - self.cpu

    def past(self, seconds: float) -> Callable[[], bool]:
        """A budget test: more than ``seconds`` of wall clock have gone (a safety net, not a verdict)."""
        return lambda: self.seconds() > seconds


def breadth_first(roots: Sequence[N], depth: int, expand: Callable[[N, int], Iterable[N]], *,
                  over_budget: Callable[[], bool] = lambda: False,
                  select: Callable[[int, list[N]], list[N]] | None = None) -> Levels:
    """Expand ``roots`` level by level up to ``depth``: ``expand(node, level)`` makes a node's calls
    and returns the nodes new to the search (deduplicating is the caller's: it knows its keys).

    ``over_budget`` is asked before each node; when it says so the search ends, not complete.
    ``select(level, frontier)``, if given, picks which of a level's nodes are expanded (one part
    of a sharded search).
    """
    out = Levels()
    frontier = list(roots)
    for level in range(1, depth + 1):
        if select is not None:
            frontier = select(level - 1, frontier)
        nxt: list[N] = []
        for i, node in enumerate(frontier):
            out.expanded, out.frontier = i, len(frontier)
            if over_budget():
                return out
            try:
                nxt.extend(expand(node, level))
            except Stop:
                out.stopped = True
                return out
        out.depth, frontier = level, nxt
        if not frontier:
            break
    out.complete, out.expanded, out.frontier = True, 0, len(frontier)
    return out
