"""The events the specification emits: plain values, not any pool's classes.

A pool announces its prefix cache to consumers (routers, KV-aware schedulers)
with three kinds of event.  The model states them in its own vocabulary:
hashes are the opaque values the request carries, a key's group is a plain
int.  How a pool spells them (vLLM's ``BlockStored`` with a hash published as
its low 64 bits, say) is the oracle's business (``kvpool.oracle.core.abstraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Hash = bytes
"""A block hash, as the request carries it; never looked into."""

ExtraKeys = tuple[Any, ...]
"""One chunk's extra keys in the untagged form consumers parse."""


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks became reachable under ``hashes``, a chain read parent first."""

    hashes: tuple[Hash, ...]
    parent: Hash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    lora_name: str | None
    extra_keys: tuple[ExtraKeys | None, ...] | None
    """Per stored block; ``None`` when no block was stored."""
    group: int
    medium: str
    session_id: str | None


@dataclass(frozen=True, slots=True)
class Removed:
    """One index entry, ``(hash, group)``, went away."""

    hash: Hash
    group: int
    medium: str


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every index entry went away at once (a reset)."""


Event = Stored | Removed | Cleared
