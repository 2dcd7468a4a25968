"""Which branches of the model's guards, contracts and updates the BMC's calls reach.

A domain is judged by what the model does with its calls, not by what the calls look like:
from the same states, the BMC's calls (:func:`.domains.calls`) must reach every branch of
every guard (``model/guards.py``), contract (``model/contracts.py``) and update
(``model/pool.py``) that a reference set of calls reaches, and every *pair* of branches one
call takes together (a block listed twice makes a loop take both sides of one test in one
call; two blocks, one hashed and one not, make ``drop_hashes`` both enter and skip its loop).

The reference is made from the declarations alone (:data:`kvpool.model.OPERATIONS`' argument
kinds), not from the domains: every block id, every list of up to two of them (a repeat
included) and the empty one, every count below the pool's size, every request, group, block
size, token count and watcher of the scope, both flags, every mask of the right length.
Calls the model refuses for their arguments' shape (an unknown id, an invalid argument) are
not compared, on either side: they are misuse, which the refinement explores.

A branch is an arc between two lines of one function whose first line decides (an ``if``,
``elif``, ``while`` or ``for``, a ``return`` or ``raise`` under one), recorded by a line
tracer (``sys.settrace``) on those three modules only: the model stays plain Python, and the
measuring is done from here.  A branch inside one line (``a if c else b``, a short-circuit)
is not seen.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

from kvpool.model import OPERATIONS, ContractBroken, Refusal
from kvpool.model import contracts as model_contracts
from kvpool.model import guards as model_guards
from kvpool.model import pool as model_pool
from kvpool.model.state import PoolState

from .domains import Bounds, calls, scope_of
from .misuse import ARGUMENT_SHAPE
from .printing import show_arg

TRACED: tuple[ModuleType, ...] = (model_guards, model_contracts, model_pool)
"""The modules whose branches count: each operation's guard, its contracts, its update."""
Branch = tuple[str, int, int]
"""(file name, line that decides, line it went to; 0: the function ended there)."""


def decision_lines(module: ModuleType) -> frozenset[int]:
    """The lines of ``module`` whose next line depends on a test: ``if``/``elif``, loop heads."""
    return frozenset(node.test.lineno if isinstance(node, ast.If | ast.While) else node.lineno
                     for node in ast.walk(ast.parse(inspect.getsource(module)))
                     if isinstance(node, ast.If | ast.While | ast.For))


@dataclass
class Tracer:
    """Records the branches each traced call takes."""

    lines: dict[str, frozenset[int]] = field(default_factory=dict)
    taken: set[Branch] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.lines = {m.__file__ or "": decision_lines(m) for m in TRACED}

    def _local(self, frame: FrameType) -> Callable[..., Any]:
        deciding = self.lines[frame.f_code.co_filename]
        name = frame.f_code.co_filename.rsplit("/", 1)[-1]
        prev = [0]

        def local(frame: FrameType, event: str, _arg: Any) -> Any:
            if event == "line":
                if prev[0] in deciding:
                    self.taken.add((name, prev[0], frame.f_lineno))
                prev[0] = frame.f_lineno
            elif event in ("return", "exception") and prev[0] in deciding:
                self.taken.add((name, prev[0], 0))
                prev[0] = 0
            return local
        return local

    def _global(self, frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename in self.lines:
            return self._local(frame)
        return None

    def taking(self, fn: Callable[[], Any]) -> frozenset[Branch]:
        """The branches ``fn()`` takes (its exceptions propagate)."""
        self.taken = set()
        sys.settrace(self._global)
        try:
            fn()
        finally:
            sys.settrace(None)
        return frozenset(self.taken)

    def run(self, s: PoolState, name: str, args: tuple[Any, ...]) -> frozenset[Branch] | None:
        """The branches one call takes on a copy of ``s`` (None: refused for its arguments' shape)."""
        op = OPERATIONS[name]

        def call() -> None:
            try:
                op.run(s.copy(), op.bind(args))
            except Refusal as refusal:
                if refusal.kind in ARGUMENT_SHAPE:
                    raise
            except ContractBroken:
                pass

        try:
            return self.taking(call)
        except Refusal:
            return None


def pairs_of(name: str, taken: frozenset[Branch]) -> set[tuple[str, Branch, Branch]]:
    """The pairs of branches one call of ``name`` took together."""
    return {(name, a, b) for a, b in itertools.combinations(sorted(taken), 2)}


# --------------------------------------------------------------------------
# The reference calls: from the declarations' argument kinds.


def _values(kind: str, s: PoolState, cfg: Bounds) -> Sequence[Any]:
    scope = scope_of(cfg)
    ids = list(range(s.num_blocks))
    hbs = s.hash_block_size
    longest = max(len(r.all_token_ids) for r in scope.requests)
    table: dict[str, Sequence[Any]] = {
        "count": range(s.num_blocks),
        "block": ids,
        "blocks": [[], *([b] for b in ids), *([a, b] for a, b in itertools.product(ids, repeat=2))],
        "request": list(scope.requests),
        "watcher": list(scope.watchers),
        "group": list(scope.groups),
        "size": [hbs, 2 * hbs],
        "tokens": list(range(hbs, longest + 1, hbs)),
        "flag": [False, True],
    }
    table["block_ids"] = table["blocks"]
    table["tokens?"] = [None, *table["tokens"]]
    return table[kind]


def reference_calls(s: PoolState, cfg: Bounds, only: Collection[str] | None = None
                    ) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Every well-formed call over the scope's values, by the declared argument kinds (a mask is
    given for each length the call's range may have, every value of it); ``only``: of these
    operations."""
    for name, op in OPERATIONS.items():
        if op.role == "query" or (only is not None and name not in only):
            continue
        kinds = [a.kind for a in op.args]
        plain = [_values(k, s, cfg) if k != "mask?" else [None] for k in kinds]
        for args in itertools.product(*plain):
            yield name, args
            if "mask?" in kinds:
                for mask in _masks(op.args, args):
                    yield name, (*args[:-1], mask)


def _masks(args: Sequence[Any], values: tuple[Any, ...]) -> Iterator[list[bool]]:
    named = {a.name: v for a, v in zip(args, values, strict=True)}
    span = named.get("num_full_blocks", 0) - named.get("num_cached_blocks", 0)
    if 0 < span <= len(named.get("block_ids", [])):
        yield from (list(m) for m in itertools.product((False, True), repeat=span))


# --------------------------------------------------------------------------
# The comparison.


@dataclass
class Coverage:
    """The branches and pairs the domain's calls and the reference calls reach from the same states."""

    states: int = 0
    domain_calls: int = 0
    reference_calls: int = 0
    domain: set[tuple[str, Branch]] = field(default_factory=set)
    reference: set[tuple[str, Branch]] = field(default_factory=set)
    domain_pairs: set[tuple[str, Branch, Branch]] = field(default_factory=set)
    reference_pairs: set[tuple[str, Branch, Branch]] = field(default_factory=set)
    witness: dict[Any, tuple[PoolState, str, tuple[Any, ...]]] = field(default_factory=dict)
    """For each branch or pair the reference reaches, the first state and call that reach it."""

    @property
    def missing(self) -> list[tuple[str, Branch]]:
        return sorted(self.reference - self.domain)

    @property
    def missing_pairs(self) -> list[tuple[str, Branch, Branch]]:
        return sorted(self.reference_pairs - self.domain_pairs)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.missing_pairs


def measure(states: Sequence[PoolState], cfg: Bounds,
            domain: Callable[[PoolState], Iterator[tuple[str, tuple[Any, ...]]]] | None = None,
            only: Collection[str] | None = None) -> Coverage:
    """The branches (per operation) and pairs of branches (per call) each side reaches from ``states``;
    ``domain`` replaces the BMC's calls (a test's narrower domain), ``only`` limits both sides to
    some operations."""
    requests = cfg.requests()
    domain = domain or (lambda s: calls(s, cfg, requests))
    tracer = Tracer()
    out = Coverage(states=len(states))
    counted: set[tuple[str, frozenset[Branch], str]] = set()  # (operation, branches, side) seen
    for s in states:
        made: dict[str, frozenset[Branch] | None] = {}  # a call both sides make runs once
        for side, todo in (("domain", domain(s)), ("reference", reference_calls(s, cfg, only))):
            for name, args in todo:
                if only is not None and name not in only:
                    continue
                key = repr((name, args))
                if key not in made:
                    made[key] = tracer.run(s, name, args)
                taken = made[key]
                if taken is None:
                    continue
                if side == "domain":
                    out.domain_calls += 1
                else:
                    out.reference_calls += 1
                if (name, taken, side) in counted:
                    continue
                counted.add((name, taken, side))
                branches = {(name, b) for b in taken}
                pairs = pairs_of(name, taken)
                if side == "domain":
                    out.domain |= branches
                    out.domain_pairs |= pairs
                    continue
                for item in (branches - out.reference) | (pairs - out.reference_pairs):
                    out.witness.setdefault(item, (s, name, args))
                out.reference |= branches
                out.reference_pairs |= pairs
    return out


def shortfall(cov: Coverage, most: int = 12) -> list[str]:
    """What the domain's calls miss, each with a reference call from a state that reaches it."""
    def witness(item: Any) -> str:
        s, name, args = cov.witness[item]
        held = [b for b in range(s.num_blocks) if s.ref[b]]
        return (f"e.g. {name}({', '.join(show_arg(a) for a in args)}) on a pool with blocks {held} "
                f"in use, {[b for b in range(s.num_blocks) if s.primary[b]]} hashed")

    out = [f"{name}: never {show_branch(b)} ({witness((name, b))})" for name, b in cov.missing]
    out += [f"{name}: never together {show_branch(a)} AND {show_branch(b)} ({witness((name, a, b))})"
            for name, a, b in cov.missing_pairs]
    return out[:most] + ([f"... and {len(out) - most} more"] if len(out) > most else [])


def show_branch(b: Branch) -> str:
    """``pool.py:120 -> 121`` with the two lines' code."""
    name, at, to = b
    module = next(m for m in TRACED if (m.__file__ or "").endswith(name))
    lines = inspect.getsource(module).splitlines()
    went = "the function ends" if to == 0 else f"{to}: {lines[to - 1].strip()}"
    return f"{name}:{at}: {lines[at - 1].strip()}  ->  {went}"


__all__ = ["TRACED", "Branch", "Coverage", "Tracer", "decision_lines", "measure", "pairs_of",
           "reference_calls", "shortfall", "show_branch"]
