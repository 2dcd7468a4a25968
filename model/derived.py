"""The parts an operation's argument kinds say: what a declaration that leaves a part out gets.

Read :mod:`.kinds` first.  A *guard*: each argument checked by its kind, in
declared order, with the checks of :mod:`.guards` (:func:`check_arg`); then
the refusals the declaration names (:data:`REFUSALS`), in order, on the
blocks the call names.  A *footprint*: those blocks and their keys.  A
*split*: the declared z3 step once per such block, in order (``identity``
names none).  A *domain*: every combination of a few values per kind
(:func:`values_of`).  A query changes nothing: its footprint is nothing, its
split the identity, and the searches do not explore it.  No contracts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .domains import Args, Scope, no_arguments
from .footprints import Footprint, nothing, of_blocks
from .guards import (
    Verdict,
    check_block_size,
    check_caching,
    check_callable,
    check_chunks,
    check_count,
    check_group,
    check_ids,
    check_releasable,
)
from .kinds import BLOCK_KINDS, Arg, ArgKind, filled, named_blocks
from .refusals import Refusal, RefusalKind
from .split import Split, per_block, unchanged
from .state import NULL, BlockId, PoolState

# --------------------------------------------------------------------------
# The guard.


def check_arg(s: PoolState, arg: Arg, value: Any) -> None:
    """One argument, by its kind: ids of this pool's blocks, a non-negative count, 32-bit group
    ids, a block size or a token count in whole hash chunks, a callable watcher.  A request, a
    hash, a flag and a mask are read by the update, as the hand-written guards leave them."""
    name = arg.name
    match arg.kind:
        case "block":
            check_ids(s, [value])
        case "blocks" | "block_ids":
            check_ids(s, value)
        case "count":
            check_count(name, value)
        case "group":
            check_group(value, name)
        case "groups":
            for g in value:
                check_group(g, name.removesuffix("s"))  # one of kv_cache_group_ids: a kv_cache_group_id
        case "size":
            check_block_size(s, value, name)
        case "tokens":
            check_chunks(s, value, name)
        case "tokens?" if value is not None:
            check_chunks(s, value, name)
        case "watcher":
            check_callable(name, value)


Check = Callable[[PoolState, str, Sequence[BlockId]], None]
"""A refusal a declaration adds to its kinds': ``(state, operation, the blocks the call names)``;
it raises a :class:`~.refusals.Refusal` or returns."""
REFUSALS: dict[str, Check] = {}
"""The refusals a declaration may name, by name."""


def refusal(check: Check) -> Check:
    """Register ``check`` under its name; its docstring's first line explains it."""
    REFUSALS[check.__name__] = check
    return check


@refusal
def held(s: PoolState, op: str, blocks: Sequence[BlockId]) -> None:
    """The caller holds a reference to each real block for each time the call lists it."""
    check_releasable(s, blocks, op)


@refusal
def real(s: PoolState, op: str, blocks: Sequence[BlockId]) -> None:
    """The call names no null block."""
    if NULL in blocks:
        raise Refusal(RefusalKind.NULL_BLOCK, f"{op} cannot take the null block")


@refusal
def caching(s: PoolState, op: str, blocks: Sequence[BlockId]) -> None:
    """The pool was built with prefix caching."""
    check_caching(s, op)


def guard_of(op: str, args: Sequence[Arg], refuses: Sequence[Check] = ()) -> Callable[..., Verdict]:
    """Each argument checked by its kind, in declared order, then each of ``refuses`` in order."""

    def guard(s: PoolState, *values: Any) -> Verdict:
        values = filled(args, values)
        for a, v in zip(args, values, strict=True):
            check_arg(s, a, v)
        blocks = named_blocks(args, values)
        for check in refuses:
            check(s, op, blocks)
        return None

    return guard


# --------------------------------------------------------------------------
# The footprint and the split.


def footprint_of(args: Sequence[Arg]) -> Callable[..., Footprint]:
    """The blocks the block arguments name, and their keys (``nothing`` when none names a block)."""
    if not any(a.kind in BLOCK_KINDS for a in args):
        return nothing

    def footprint(s: PoolState, *values: Any) -> Footprint:
        return of_blocks(s, named_blocks(args, values))

    return footprint


def split_of(step: str, args: Sequence[Arg]) -> Callable[..., Split]:
    """``step`` once per block the block arguments name, in order (``identity``: ``unchanged``)."""
    if step == "identity":
        return unchanged

    def split(s: PoolState, result: Any, *values: Any) -> Split:
        return per_block(step, named_blocks(args, values))

    return split


# --------------------------------------------------------------------------
# The domain.


def values_of(kind: ArgKind, s: PoolState, scope: Scope) -> Sequence[Any]:
    """A few values of one argument kind on a small pool, each shape the kind has among them
    (two-block lists list a block twice among them; token counts are whole chunks)."""
    ids, hbs = range(s.num_blocks), s.hash_block_size
    match kind:
        case "block":
            return ids
        case "blocks":
            return [[b] for b in ids] + [[a, b] for a, b in itertools.product(ids, repeat=2)]
        case "block_ids":
            return [[b] for b in ids]
        case "count":
            return range(1, s.num_blocks)
        case "request":
            return scope.requests
        case "watcher":
            return scope.watchers
        case "hash":
            return list(dict.fromkeys(h for r in scope.requests for h in r.block_hashes))
        case "group":
            return scope.groups
        case "groups":
            return [[g] for g in scope.groups] + ([list(scope.groups)] if len(scope.groups) > 1 else [])
        case "size":
            return (2 * hbs, hbs)
        case "tokens":
            return range(hbs, max((len(r.all_token_ids) for r in scope.requests), default=0) + 1, hbs)
        case "tokens?":
            return (None, hbs)
        case "flag":
            return (False, True)
        case "mask?":
            return (None, [True, False])
    raise ValueError(f"no values for argument kind {kind!r}")


def domain_of(args: Sequence[Arg]) -> Callable[[PoolState, Scope], Iterator[Args]]:
    """Every combination of :func:`values_of` each argument, in declared order (``no_arguments``
    when there are none)."""
    if not args:
        return no_arguments

    def domain(s: PoolState, scope: Scope) -> Iterator[Args]:
        yield from itertools.product(*(values_of(a.kind, s, scope) for a in args))

    return domain
