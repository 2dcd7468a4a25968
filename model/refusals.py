"""Why the specification refuses a call: one exception, a kind, a message.

A refused call changes nothing.  Every pool under test must refuse the same
calls; how it spells a refusal (kvpool's typed errors, vLLM's ``ValueError``)
is mapped onto these kinds by the oracle (``kvpool.oracle.core.abstraction``).
"""

from __future__ import annotations

import enum


class RefusalKind(enum.Enum):
    """What was wrong with a refused call."""

    NOT_ENOUGH_FREE_BLOCKS = "more blocks asked for than the free queue holds"
    INVALID_ARGUMENT = "a count, size, length or id out of its range"
    UNKNOWN_BLOCK = "not a block of this pool"
    NULL_BLOCK = "would give the null block a meaning it must not have"
    NOT_IN_USE = "drops a reference nobody holds"
    HASH_CONFLICT = "would clobber a hash the block already carries"
    CACHING_DISABLED = "prefix-cache entries offered to a pool without caching"


class Refusal(Exception):
    """The specification refuses this call; the state is unchanged."""

    def __init__(self, kind: RefusalKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

