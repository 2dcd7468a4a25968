"""The finite world the bounded model checker explores: its pool, requests and watchers.

Three requests with overlapping prefixes, groups 0 and 1, two watchers; the
argument domains of each operation over them are the operation's own
(declared in :mod:`kvpool.model.operations`, written in
:mod:`kvpool.model.domains`).  The owner's writes (``write_block``) are
explored too.  Calls that break a caller contract are generated like any
other; the model raises ``ContractBroken`` on them and the search does not
follow them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.model import OPERATIONS, initial_state
from kvpool.model.domains import Scope
from kvpool.model.state import REFERENCES, PoolState

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
class Bounds:
    """The pool and argument domains explored."""

    blocks: int = 4
    hash_block_size: int = 1
    groups: tuple[int, ...] = (0, 1)
    events_on: bool = True
    """Whether the pool emits KV events (the event-log properties need them on)."""
    symmetry: bool = True
    """Identify states that differ only by a renaming of the non-null blocks."""
    reference: str = "0.31"
    """The vLLM version whose behaviour the model reproduces (:data:`kvpool.model.state.REFERENCES`)."""

    def requests(self) -> list[Request]:
        return [Request.of(name, toks, self.hash_block_size) for name, toks in TOKENS.items()]

    def initial(self) -> PoolState:
        return initial_state(self.blocks, caching=True, hash_block_size=self.hash_block_size,
                             events_on=self.events_on, **REFERENCES[self.reference])


DEFAULT = Bounds()
"""The pool the search explores unless told otherwise: 4 blocks, hbs 1, events on."""


def scope_of(cfg: Bounds, requests: Sequence[Request] | None = None) -> Scope:
    """What the search passes besides block ids: the configuration's requests, groups and watchers."""
    return Scope(cfg.requests() if requests is None else requests, cfg.groups, WATCHERS)


def calls(s: PoolState, cfg: Bounds, requests: Sequence[Request]) -> Iterator[Call]:
    """Every call from ``s`` over the small domains, operation by operation as declared
    (:mod:`kvpool.model.domains`); queries are not explored, they change nothing."""
    scope = scope_of(cfg, requests)
    for name, op in OPERATIONS.items():
        for args in op.domain(s, scope):
            yield name, args
