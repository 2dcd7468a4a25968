"""Canonical states: one representative per class of states that differ only by names.

The model, the argument domains (every id and pair of ids, both groups, both watchers) and
every checked property treat the real blocks, the two groups and the two watchers alike (none
compares or orders them), so a renamed state has the renamed successors and the same verdicts:
the search keeps one state per class (:func:`orbit_key`) and explores them all.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.model.request import Content
from kvpool.model.state import NULL, Key, PoolState

from .domains import WATCHERS, Bounds


def canonical(s: PoolState) -> tuple[Any, ...]:
    """A hashable form of the variables (events/fired excluded, watchers by name)."""
    return (
        tuple(s.ref), tuple(s.free), tuple(s.primary), tuple(s.secondary),
        tuple(sorted(s.index.items())),
        tuple(sorted((b, w.__name__) for b, w in s.watchers.items())),
        tuple(s.holds), tuple(sorted(s.names.items(), key=lambda kv: kv[0])),
        tuple(s.holders), tuple(sorted(s.announced)),
    )


def state_digest(key: Any) -> bytes:
    """Eight bytes naming a state's key (:func:`orbit_key` or :func:`canonical`), the same in
    every process: how the shards of one search tell which states they share."""
    return hashlib.blake2b(repr(key).encode(), digest_size=8).digest()


@functools.cache
def _content_id(c: Content) -> int:
    """A number per ghost content, so block signatures sort (contents may hold ``None``).

    A digest of the content, not a counter: every process gives a content the same
    number, so a state has the same key in every shard of a sharded search.
    """
    return int.from_bytes(state_digest(c), "big")


Renaming = tuple[dict[int, int], dict[str, str]]
"""A renaming of the KV-cache groups and of the watchers (by name)."""


def renamings_of(cfg: Bounds) -> list[Renaming]:
    """Every renaming of the KV-cache groups and of the watchers the domains treat alike."""
    names = [w.__name__ for w in WATCHERS]
    gperms = [dict(zip(cfg.groups, p, strict=True)) for p in itertools.permutations(cfg.groups)]
    wperms = [dict(zip(names, p, strict=True)) for p in itertools.permutations(names)]
    return [(g, w) for g in gperms for w in wperms]


def orbit_key(s: PoolState, renamings: Sequence[Renaming] = ()) -> tuple[Any, ...]:
    """A canonical form of ``s`` up to renaming the non-null blocks (symmetry reduction).

    Each block gets a signature that mentions no block id: its places in the
    free queue, ref count, hashes, content, watcher, and its (key, position)
    in every index list.  The null block's signature comes first; the real
    blocks' signatures are sorted.  The state can be rebuilt from the key up
    to a renaming (the queue and each index list from the positions), and a
    renaming leaves every signature as it is, so two states share a key
    exactly when one is a renaming of the other.  With ``renamings`` (group
    and watcher renamings, see :func:`renamings_of`) the key is the least over
    them, so states that differ by one of those too share a key (sound: see the module
    docstring).  The free queue orders the blocks in it, so block renaming mostly merges
    states whose in-use blocks differ; group renaming halves the hashed states.
    """
    n = s.num_blocks
    places: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(s.free):
        if 0 <= b < n:
            places[b].append(i)
    fixed = [(tuple(places[b]), s.ref[b], s.holders[b], _content_id(s.holds[b]))
             for b in range(n)]
    watched = {b: w.__name__ for b, w in s.watchers.items()}
    keyed = bool(s.names) or bool(s.index) or any(p is not None for p in s.primary)
    # Renaming what the state does not mention changes nothing: skip those.
    gmaps = {tuple(sorted(g.items())) for g, _ in renamings} if keyed else set()
    wmaps = {tuple(sorted(w.items())) for _, w in renamings} if watched else set()
    best: tuple[Any, ...] | None = None
    for gmap in gmaps or {()}:
        key = _key_renamer(gmap)
        entries: list[list[tuple[Key, int]]] = [[] for _ in range(n)]
        for k, blocks in s.index.items():
            kk = key(k)
            for i, b in enumerate(blocks):
                entries[b].append((kk, i))
        announced: list[list[Key]] = [[] for _ in range(n)]
        for k, b in s.announced:
            announced[b].append(key(k))
        hashes = [((key(p.key), p.num_tokens) if (p := s.primary[b]) else (),
                   tuple(key(k) for k in s.secondary[b]), tuple(sorted(entries[b])),
                   tuple(sorted(announced[b])))
                  for b in range(n)]
        names = tuple(sorted((key(k), _content_id(c)) for k, c in s.names.items()))
        for wmap in wmaps or {()}:
            wm = dict(wmap)
            sigs = [(*fixed[b], *hashes[b], wm.get(watched.get(b, ""), watched.get(b, "")))
                    for b in range(n)]
            out = (sigs[NULL], tuple(sorted(sigs[1:])), names, len(s.free))
            if best is None or out < best:
                best = out
    assert best is not None
    return best


@functools.cache
def _key_renamer(gmap: tuple[tuple[int, int], ...]) -> Callable[[Key], Key]:
    """Rename the group part of index keys (memoised per key)."""
    table = dict(gmap)
    if all(k == v for k, v in gmap):
        return lambda k: k

    @functools.cache
    def rename(k: Key) -> Key:
        return k[0], table.get(k[1], k[1])

    return rename


def state_key(cfg: Bounds) -> Callable[[PoolState], tuple[Any, ...]]:
    """What identifies a state in a search of ``cfg``: its class up to renaming (:func:`orbit_key`)
    with :attr:`Bounds.symmetry`, else its variables (:func:`canonical`).

    Most calls reach a state seen before: the class is looked up by the state's exact variables
    (dict order included) before the state is canonicalised.
    """
    if not cfg.symmetry:
        return canonical
    renamings = renamings_of(cfg)
    memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def key(s: PoolState) -> tuple[Any, ...]:
        exact = s.variables()
        if exact not in memo:
            memo[exact] = orbit_key(s, renamings)
        return memo[exact]
    return key
