"""The finite world the bounded model checker explores: requests, watchers, argument domains.

Every block id (the null block included); one- and two-element lists for
``free_blocks`` and ``cache_full_blocks``, one-element lists elsewhere; three
requests with overlapping prefixes; groups 0 and 1; block sizes ``hbs`` and
``2 * hbs``; masks on two-block ranges; two watchers.

The owner's writes (``write_block``: a request prefix into any block) are
explored too, and ``_insert_block_hash`` of every request prefix's key into
any block (the offload pool's copy).  Calls that break a caller contract
(:mod:`kvpool.model.contracts`) are generated like any other; the model
raises ``ContractBroken`` on them and the search does not follow them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.model import initial_state
from kvpool.model.state import NULL, PoolState

Action = Callable[..., tuple[PoolState, Any]]
"""A model action: ``(state, *args) -> (next state, result)``."""
Call = tuple[str, tuple[Any, ...]]
"""An action's name and its arguments."""


def watcher_a(_block: int) -> None:
    """A reuse callback (watchers are compared by identity, shown by name)."""


def watcher_b(_block: int) -> None:
    """A second reuse callback."""


WATCHERS = (watcher_a, watcher_b)
TOKENS = {"r0": [1, 1, 1, 1], "r1": [1, 1, 2, 2], "r2": [2, 2, 2, 2]}
"""Three requests: r0 and r1 share their first two tokens, r2 shares nothing."""


@dataclass(frozen=True)
class Request:
    """A request as the model reads it, its hashes naming each prefix (no collisions)."""

    request_id: str
    all_token_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]
    lora_request: Any = None
    mm_features: tuple[Any, ...] = ()
    cache_salt: str | None = None
    session_id: str | None = None

    @classmethod
    def of(cls, request_id: str, tokens: Sequence[int], hash_block_size: int) -> Request:
        """Hash each whole chunk's prefix: equal hashes exactly for equal prefixes."""
        cut = len(tokens) - len(tokens) % hash_block_size
        hashes = tuple(hashlib.sha256(repr(tuple(tokens[:end])).encode()).digest()
                       for end in range(hash_block_size, cut + 1, hash_block_size))
        return cls(request_id, tuple(tokens), hashes)


@dataclass(frozen=True)
class Config:
    """The pool and argument domains explored."""

    blocks: int = 4
    hash_block_size: int = 1
    groups: tuple[int, ...] = (0, 1)
    events_on: bool = True
    """Whether the pool emits KV events (the event-log properties need them on)."""
    symmetry: bool = True
    """Identify states that differ only by a renaming of the non-null blocks."""

    def requests(self) -> list[Request]:
        return [Request.of(name, toks, self.hash_block_size) for name, toks in TOKENS.items()]

    def initial(self) -> PoolState:
        return initial_state(self.blocks, caching=True, hash_block_size=self.hash_block_size,
                             events_on=self.events_on)


DEFAULT = Config()
"""The pool the search explores unless told otherwise: 4 blocks, hbs 1, events on."""


# --------------------------------------------------------------------------
# Argument domains.


def calls(s: PoolState, cfg: Config, requests: Sequence[Request]) -> Iterator[Call]:
    """Every contract-respecting call from ``s`` over the small domains."""
    ids = range(s.num_blocks)
    hbs = s.hash_block_size
    ones = [[b] for b in ids]
    twos = [[a, b] for a in ids for b in ids]
    for n in range(1, s.num_blocks):
        yield "get_new_blocks", (n,)
    for lst in ones + twos:
        yield "free_blocks", (lst,)
    for lst in ones:
        yield "touch", (lst,)
        yield "evict_blocks", (lst,)
        yield "_maybe_evict_cached_block", (lst[0],)
        for w in WATCHERS:
            yield "unpin_blocks", (lst, w)
    yield "reset_prefix_cache", ()
    yield "take_events", ()
    for src in ids:
        for dst in ids:
            yield "move_block_hashes", (src, dst)
    for r in requests:
        for b in ids:
            for nt in range(hbs, len(r.all_token_ids) + 1, hbs):
                yield "write_block", (b, r, nt)
    for r, g in itertools.product(requests, cfg.groups):
        for b in ids:  # a key of another pool, copied in: as primary (covering its prefix) or secondary
            for nt in range(hbs, len(r.all_token_ids) + 1, hbs):
                yield "_insert_block_hash", (r, nt, g, b, nt if s.primary[b] is None else None)
    for r, bs, g in itertools.product(requests, (2 * hbs, hbs), cfg.groups):
        yield "emit_cached_block_events", (r, 1, bs, g)
        nmax = len(r.all_token_ids) // bs
        for b in ids if bs > hbs else ():  # a partial entry must end inside a block
            for nt in range(hbs, len(r.all_token_ids) + 1, hbs):
                if nt % bs == 0:
                    continue  # a boundary that is a block's end is cache_full's job
                for rep in (False, True):
                    yield "cache_partial_block", (r, b, nt, g, bs, rep)
        # (list, num_cached): the listed blocks before num_cached are not read,
        # so one filler (the null block) stands for all of them.
        ranges = [([b], 0) for b in ids] + [([NULL, b], 1) for b in ids]
        ranges += [([a, b], 0) for a in ids for b in ids]
        for lst, nc in ranges:
            nf = min(len(lst), nmax)
            if nc >= nf:
                continue
            masks: list[list[bool] | None] = [None]
            if nf - nc == 2:
                masks += [[True, False], [False, True]]
            for mask in masks:
                yield "cache_full_blocks", (r, lst, nc, nf, bs, g, mask)


