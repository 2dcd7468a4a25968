"""Typed errors of the block pool.

Every refusal is a subclass of :class:`BlockPoolError`, itself a ``ValueError``
so that callers written against vLLM (which raises ``ValueError`` when it runs
out of blocks) keep working.  A refused call has changed nothing: the pool
checks every argument before it mutates anything.
"""

from __future__ import annotations


class BlockPoolError(ValueError):
    """Root of every error the pool raises on purpose."""


class NotEnoughFreeBlocksError(BlockPoolError):
    """More blocks were asked for than the free queue holds."""


class InvalidArgumentError(BlockPoolError):
    """A count, size, length or id is out of its allowed range."""


class UnknownBlockError(BlockPoolError):
    """The object is not a block of this pool (or of any pool)."""


class NullBlockError(BlockPoolError):
    """The operation would give the null block a meaning it must not have."""


class BlockNotInUseError(BlockPoolError):
    """A reference is dropped that nobody holds (double or over-free)."""


class BlockHashConflictError(BlockPoolError):
    """A block already carries a hash that this operation would clobber."""


class CachingDisabledError(BlockPoolError):
    """Prefix-cache entries were offered to a pool built without caching."""
