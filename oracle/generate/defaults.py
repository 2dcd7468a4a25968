"""A call of an operation no hand-written scenario makes, drawn from its arguments' kinds.

The workload's steps and the state machine's rules call each operation as an
engine would (:data:`WRITTEN`).  An operation declared since has this default
scenario, read off its declaration alone: the blocks it names are its own
(one or two handed out for it, cached under a request now and then) and the
null block; every other argument is one of the model's few values of its
kind (:func:`kvpool.model.derived.values_of`), with a fresh request.  A call
the model would refuse is made only as misuse (with misuse on, a block
argument is now and then an id of no block), and one that would break a
caller contract never.  Then the scenario gives back every reference the
call left it, so the pool's other holders find their blocks as they were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.model import OPERATIONS, Operation, PoolState, Refusal
from kvpool.model.derived import values_of
from kvpool.model.domains import Scope
from kvpool.model.kinds import BLOCK_KINDS
from kvpool.model.request import num_blocks_hashed
from kvpool.model.state import NULL

from ..core.adapter import REFERENCE_API
from ..core.lockstep import Lockstep

WRITTEN: frozenset[str] = REFERENCE_API
"""The operations the workload's steps and the state machine's rules call by hand: vLLM's API, each
of it (``tests/test_registry.py``, ``tests/test_machine.py``); every other one gets
:func:`default_call`."""

Choose = Callable[[Sequence[Any]], Any]
"""Picks one of the values offered (the workload's dice, or the state machine's drawn picks)."""


def unwritten() -> list[str]:
    """The pool operations no hand-written scenario calls, in declared order."""
    return [n for n, op in OPERATIONS.items() if op.role != "caller" and n not in WRITTEN]


def chooser(picks: Sequence[int]) -> Choose:
    """A :data:`Choose` that takes ``picks`` in turn, each modulo the choices (then the first)."""
    it = iter(picks)
    return lambda values: values[next(it, 0) % len(values)]


def default_call(pair: Lockstep, name: str, choose: Choose, request: Any, groups: Sequence[int],
                 misuse: bool) -> None:
    """One call of ``name`` on blocks of its own (module docstring); nothing when it cannot be made."""
    op, model = OPERATIONS[name], pair.model
    ours: Counter[int] = Counter()
    if op.role != "query" and any(a.kind in BLOCK_KINDS for a in op.args):
        got = pair.call("get_new_blocks", choose((1, 2)))
        if isinstance(got, Exception):
            return  # the pool ran dry: no block to call it on
        ours.update(got)
        if model.caching and choose((False, True)):
            _cache(pair, request, got, choose)
        blocks = [*ours, NULL, *([model.num_blocks] if misuse else [])]
    else:
        blocks = [choose(range(model.num_blocks)) for _ in range(2)]
    args = _arguments(op, model, Scope([request], groups, [pair.watcher("default")]), blocks, choose)
    verdict = None if args is None else _verdict(op, model, args)
    if args is not None and (verdict == "legal" or (verdict == "refused" and misuse)):
        watched = set(ours) | (set(op.footprint(model, *args).blocks) if verdict == "legal" else set())
        before = {b: model.ref[b] for b in watched}
        pair.call(name, *args)
        ours.update({b: model.ref[b] - was for b, was in before.items()})  # the call was ours
    held = [b for b in ours.elements() if b != NULL]
    if held:
        pair.call("free_blocks", held)


def _cache(pair: Lockstep, request: Any, blocks: list[int], choose: Choose) -> None:
    """Cache the blocks as the request's first ones, at the hash block size or twice it."""
    hbs = pair.model.hash_block_size
    size = choose((hbs, 2 * hbs))
    full = min(len(blocks), num_blocks_hashed(request, hbs, size))
    if full:
        pair.call("cache_full_blocks", request, blocks, 0, full, size, 0)


def _arguments(op: Operation, s: PoolState, scope: Scope, blocks: list[int],
               choose: Choose) -> tuple[Any, ...] | None:
    """One value per argument: blocks among ``blocks``, the rest among the model's values of its kind."""
    out: list[Any] = []
    for a in op.args:
        if a.kind == "block":
            out.append(choose(blocks))
        elif a.kind in BLOCK_KINDS:
            out.append([choose(blocks) for _ in range(choose((1, 2)))])
        else:
            values = values_of(a.kind, s, scope)
            if not values:
                return None  # a request too short for a token count, say
            out.append(choose(values))
    return tuple(out)


def _verdict(op: Operation, s: PoolState, args: tuple[Any, ...]) -> str:
    """What the model would make of the call, without making it: legal, refused or a broken contract."""
    try:
        if op.guard(s, *args) is None:
            op.requires(s, *args)
    except Refusal:
        return "refused"
    except Exception:  # a broken contract, or arguments the guard cannot read: not a call to make
        return "broken"
    return "legal"


__all__ = ["WRITTEN", "Choose", "chooser", "default_call", "unwritten"]
