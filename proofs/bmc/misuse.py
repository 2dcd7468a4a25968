"""Calls whose arguments are wrong by their declared kind alone are refused by the guard.

The BMC, the agreement and the refinement's domain make well-formed calls; misuse is the
refinement's (the pool against the model).  The specification's own promise about misuse is
checked here, on the model alone: a call with one argument of the wrong shape for its
declared kind (a negative count, an id outside the pool, a block size or token count that is
no positive multiple of the hash block size, a group id that does not fit 32 bits, a watcher
that cannot be called) never reaches a contract or an update: its guard refuses it as an
unknown block or an invalid argument, or finds at once that the call changes nothing (a
partial entry offered for the null block is a no-op, whatever its size).  A guard that lost
a check lets the wrong value through to the update, and this fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import OPERATIONS, ContractBroken, Refusal, RefusalKind
from kvpool.model.state import PoolState

from .domains import Bounds, scope_of

ARGUMENT_SHAPE = (RefusalKind.INVALID_ARGUMENT, RefusalKind.UNKNOWN_BLOCK)
GROUP_IDS = 2**32
"""Group ids travel as four bytes (vLLM's index keys): stated here, not read from the guard judged."""


def _ill_formed(kind: str, s: PoolState, good: Any) -> Sequence[Any]:
    """Values of ``kind`` that are wrong whatever the other arguments (empty: none is); a list
    of ids is wrong in every place of the well-formed ``good`` (a call reads only some places)."""
    n, hbs = s.num_blocks, s.hash_block_size
    not_multiple = [hbs + 1] if hbs > 1 else []
    places = len(good) if isinstance(good, list) and good else 1
    table: dict[str, list[Any]] = {
        "count": [-1],
        "block": [-1, n],
        "blocks": [[-1] * places, [n] * places],
        "block_ids": [[-1] * places, [n] * places],
        "size": [0, -hbs, *not_multiple],
        "tokens": [0, -hbs, *not_multiple],
        "group": [-1, GROUP_IDS],
        "groups": [[-1], [0, GROUP_IDS]],
        "watcher": [None],
    }
    return table.get(kind, [])


def misuse(s: PoolState, cfg: Bounds) -> Iterator[tuple[str, tuple[Any, ...], str]]:
    """Each operation's first well-formed call from ``s`` with one argument made wrong:
    (operation, arguments, what was made wrong)."""
    scope = scope_of(cfg)
    for name, op in OPERATIONS.items():
        base = next(iter(op.domain(s, scope)), None)
        if base is None:  # a query: no domain; its arguments are built here
            base = tuple({"hash": cfg.requests()[0].block_hashes[0], "groups": [0], "block": 1}
                         .get(a.kind) for a in op.args)
        bound = op.bind(base)
        for i, a in enumerate(op.args):
            for bad in _ill_formed(a.kind, s, bound[i]):
                yield name, (*bound[:i], bad, *bound[i + 1:]), f"{a.name}={bad!r}"


@dataclass
class Misuse:
    calls: int = 0
    let_through: list[str] = field(default_factory=list)
    """Calls with a wrong argument that reached a contract or an update, as text."""

    @property
    def ok(self) -> bool:
        return self.calls > 0 and not self.let_through


def check_misuse(states: Sequence[PoolState], cfg: Bounds,
                 calls: Callable[[PoolState, Bounds], Iterator[tuple[str, tuple[Any, ...], str]]] = misuse
                 ) -> Misuse:
    """Every such call from each state is refused for its arguments, or a no-op the guard decides."""
    out = Misuse()
    for s in states:
        for name, args, what in calls(s, cfg):
            out.calls += 1
            op = OPERATIONS[name]
            try:
                noop = op.prepare(s.copy(), args)
            except Refusal as refusal:
                if refusal.kind in ARGUMENT_SHAPE:
                    continue
                verdict = f"refused {refusal.kind.name}, not for its arguments"
            except ContractBroken as broken:
                verdict = f"reached the contract {broken.contract}"
            except Exception as exc:  # the wrong value went on and broke something else
                verdict = f"raised {type(exc).__name__}: {exc}"
            else:
                if noop is not None:
                    continue
                verdict = "accepted: the update would run"
            held = [b for b in range(s.num_blocks) if s.ref[b]]
            out.let_through.append(f"{name}({what}) on a pool with blocks {held} in use: {verdict}")
    return out


__all__ = ["Misuse", "check_misuse", "misuse"]
