"""Each operation's calls on a small pool: the finite argument domains a search explores.

Every block id (the null block included); one- and two-element lists for
``free_blocks`` and ``cache_full_blocks``, one-element lists elsewhere; the
scope's requests (with overlapping prefixes) and groups; block sizes ``hbs``
and ``2 * hbs``; masks on two-block ranges; the scope's watchers.  Calls that
break a caller contract are generated like any other: the model raises
``ContractBroken`` on them, and a search reports or skips them.  Where every
combination of a few values per argument kind will do, the domain is derived
(:mod:`.derived`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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


def free_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    """``free_blocks`` and ``touch``: one block, and two (a block listed twice among them)."""
    yield from single_lists(s, scope)
    yield from (([a, b],) for a, b in itertools.product(_ids(s), repeat=2))


def single_lists(s: PoolState, scope: Scope) -> Iterator[Args]:
    """One block at a time, as a list (``free_blocks``' first half; ``evict_blocks`` derives the same)."""
    yield from (([b],) for b in _ids(s))


def unpin_blocks(s: PoolState, scope: Scope) -> Iterator[Args]:
    """One block with either watcher; two blocks with the first."""
    yield from (([b], w) for b in _ids(s) for w in scope.watchers)
    yield from (([a, b], scope.watchers[0]) for a, b in itertools.product(_ids(s), repeat=2))


def no_arguments(s: PoolState, scope: Scope) -> Iterator[Args]:
    yield ()


def write_block(s: PoolState, scope: Scope) -> Iterator[Args]:
    yield from ((b, r, nt) for r in scope.requests for b in _ids(s) for nt in _token_counts(s, r))


def insert_block_hash(s: PoolState, scope: Scope) -> Iterator[Args]:
    """A key of another pool copied into any block: as its primary (covering the prefix) or secondary."""
    yield from ((r, nt, g, b, nt if s.primary[b] is None else None)
                for r, g in itertools.product(scope.requests, scope.groups)
                for b in _ids(s) for nt in _token_counts(s, r))


def _block_sizes(s: PoolState) -> tuple[int, int]:
    return 2 * s.hash_block_size, s.hash_block_size


def emit_cached_block_events(s: PoolState, scope: Scope) -> Iterator[Args]:
    """No block and one block announced (no hit announces nothing)."""
    yield from ((r, n, bs, g) for r, bs, g, n in
                itertools.product(scope.requests, _block_sizes(s), scope.groups, (0, 1)))


def cache_partial_block(s: PoolState, scope: Scope) -> Iterator[Args]:
    """Partial entries end inside a block (a block boundary is ``cache_full_blocks``' job), except
    a replacement, which may end anywhere, and every entry of a pool that takes partial entries at
    block boundaries (``boundary_partials``, vLLM 0.33)."""
    for r, bs, g in itertools.product(scope.requests, _block_sizes(s), scope.groups):
        for b in _ids(s):
            for nt in _token_counts(s, r):
                if bs == s.hash_block_size and not s.boundary_partials:  # at a boundary: only to replace
                    if nt == len(r.all_token_ids) and g == scope.groups[0]:
                        yield (r, b, nt, g, bs, True)
                elif nt % bs or s.boundary_partials:
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
