"""Each operation's calls on a small pool: the finite argument domains a search explores.

Every block id (the null block included); one- and two-element lists for
``free_blocks`` and ``cache_full_blocks``, one-element lists elsewhere; the
scope's requests (with overlapping prefixes) and groups; block sizes ``hbs``
and ``2 * hbs``; masks on two-block ranges; the scope's watchers.  Calls that
break a caller contract are generated like any other: the model raises
``ContractBroken`` on them, and a search reports or skips them.  An
operation that declares no domain has every combination of a few values per
argument kind (:func:`by_kinds`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .kinds import Arg, ArgKind
from .state import NULL, PoolState, Watcher

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Scope:
    """What a small-pool search may pass besides block ids: requests, groups, watchers."""

    requests: Sequence[Any]
    groups: Sequence[int]
    watchers: Sequence[Watcher]


def _ids(s: PoolState) -> range:
    return range(s.num_blocks)


def _token_counts(s: PoolState, request: Any) -> range:
    hbs = s.hash_block_size
    return range(hbs, len(request.all_token_ids) + 1, hbs)


def values_of(kind: ArgKind, s: PoolState, scope: Scope) -> list[Any]:
    """A few values of one argument kind on a small pool, each shape the kind has among them.

    Every block id; one-block lists and two-block lists (a block listed twice among them) of
    ``blocks``, one-block lists of ``block_ids``; counts from one up to every real block; the
    scope's requests, watchers and groups; each group alone and all of them; every hash of the
    scope's requests; block sizes ``2 * hbs`` and ``hbs``; whole-chunk token counts up to the
    longest request; a flag both ways; no mask and a mask; no token count and one chunk.
    """
    ids, hbs = list(_ids(s)), s.hash_block_size
    match kind:
        case "block":
            return ids
        case "blocks":
            return [[b] for b in ids] + [[a, b] for a, b in itertools.product(ids, repeat=2)]
        case "block_ids":
            return [[b] for b in ids]
        case "count":
            return list(range(1, s.num_blocks))
        case "request":
            return list(scope.requests)
        case "watcher":
            return list(scope.watchers)
        case "hash":
            return list(dict.fromkeys(h for r in scope.requests for h in r.block_hashes))
        case "group":
            return list(scope.groups)
        case "groups":
            return [[g] for g in scope.groups] + ([list(scope.groups)] if len(scope.groups) > 1 else [])
        case "size":
            return list(_block_sizes(s))
        case "tokens":
            return list(range(hbs, max((len(r.all_token_ids) for r in scope.requests), default=0) + 1, hbs))
        case "flag":
            return [False, True]
        case "mask?":
            return [None, [True, False]]
        case "tokens?":
            return [None, hbs]
    raise ValueError(f"no values for argument kind {kind!r}")


def by_kinds(args: Sequence[Arg]) -> Callable[[PoolState, Scope], Iterator[Args]]:
    """The domain of an operation that declares none: every combination of a few values per
    argument (:func:`values_of`), in declared order; :func:`no_arguments` when it has none."""
    if not args:
        return no_arguments

    def domain(s: PoolState, scope: Scope) -> Iterator[Args]:
        yield from itertools.product(*(values_of(a.kind, s, scope) for a in args))

    return domain


def get_new_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    yield from ((n,) for n in range(1, s.num_blocks))


def free_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    """``free_blocks`` and ``touch``: one block, and two (a block listed twice among them)."""
    for b in _ids(s):
        yield ([b],)
    for a, b in itertools.product(_ids(s), repeat=2):
        yield ([a, b],)


def single_lists(s: PoolState, scope: Scope) -> Iterator[Args]:
    """``evict_blocks``: one block at a time."""
    for b in _ids(s):
        yield ([b],)


def maybe_evict_cached_block(s: PoolState, scope: Scope) -> Iterator[Args]:
    for b in _ids(s):
        yield (b,)


def unpin_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    """One block with either watcher; two blocks with the first."""
    for b in _ids(s):
        for w in scope.watchers:
            yield ([b], w)
    for a, b in itertools.product(_ids(s), repeat=2):
        yield ([a, b], scope.watchers[0])


def no_arguments(s: PoolState, scope: Scope) -> Iterator[Args]:
    yield ()


def move_block_hashes(s: PoolState, scope: Scope) -> Iterator[Args]:
    yield from itertools.product(_ids(s), repeat=2)


def write_block(s: PoolState, scope: Scope) -> Iterator[Args]:
    for r in scope.requests:
        for b in _ids(s):
            for nt in _token_counts(s, r):
                yield (b, r, nt)


def insert_block_hash(s: PoolState, scope: Scope) -> Iterator[Args]:
    """A key of another pool copied into any block: as its primary (covering the prefix) or secondary."""
    for r, g in itertools.product(scope.requests, scope.groups):
        for b in _ids(s):
            for nt in _token_counts(s, r):
                yield (r, nt, g, b, nt if s.primary[b] is None else None)


def _block_sizes(s: PoolState) -> tuple[int, int]:
    return 2 * s.hash_block_size, s.hash_block_size


def emit_cached_block_events(s: PoolState, scope: Scope) -> Iterator[Args]:
    for r, bs, g in itertools.product(scope.requests, _block_sizes(s), scope.groups):
        yield (r, 1, bs, g)


def cache_partial_block(s: PoolState, scope: Scope) -> Iterator[Args]:
    """Partial entries end inside a block (a block boundary is ``cache_full_blocks``' job), except
    a replacement, which may end anywhere."""
    for r, bs, g in itertools.product(scope.requests, _block_sizes(s), scope.groups):
        for b in _ids(s):
            for nt in _token_counts(s, r):
                if bs == s.hash_block_size:  # at a block boundary: only to replace the contents
                    if nt == len(r.all_token_ids) and g == scope.groups[0]:
                        yield (r, b, nt, g, bs, True)
                elif nt % bs:
                    for rep in (False, True):
                        yield (r, b, nt, g, bs, rep)


def cache_full_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    """(list, num_cached): blocks before ``num_cached`` are not read, so the null block stands for them."""
    ranges: list[tuple[list[int], int]] = [([b], 0) for b in _ids(s)] + [([NULL, b], 1) for b in _ids(s)]
    ranges += [([a, b], 0) for a, b in itertools.product(_ids(s), repeat=2)]
    for r, bs, g in itertools.product(scope.requests, _block_sizes(s), scope.groups):
        nmax = len(r.all_token_ids) // bs
        for lst, nc in ranges:
            nf = min(len(lst), nmax)
            if nc >= nf:  # nothing new to cache: a no-op, once per request, size and group
                if lst == [NULL, NULL]:
                    yield (r, lst, nc, nf, bs, g, None)
                continue
            masks: list[list[bool] | None] = [None]
            if nf - nc == 2:
                masks += [[True, False], [False, True]]
            for mask in masks:
                yield (r, lst, nc, nf, bs, g, mask)


def none(s: PoolState, scope: Scope) -> Iterator[Args]:
    """Queries are not explored: they change nothing."""
    return iter(())
