"""How each operation splits into the per-block steps the z3 proofs are about.

The proofs (``kvpool.proofs.transitions``) prove one step per block: a batch
operation is the sequence of its blocks' steps, and induction on the length
of the batch carries each invariant across it.  Each function here is the
split of one call (one step per block named is derived, :mod:`.derived`):
the named steps with their arguments as model values (blocks, keys,
contents), which the agreement check runs through the z3 steps and
compares with the model's own next state.  The step names are
the keys of ``kvpool.proofs.transitions.STEPS``; each operation's
declaration (:mod:`.operations`) lists the steps its split may use.

A batch is its step once per listing, in order; ``get_new_blocks(n)`` is
``alloc(b)`` for the ``n`` blocks handed out (they are distinct, so the
model's "take them all, then update each" equals the sequence), and
``cache_full_blocks``' conflict check against what each chosen block covered
is each ``cache_full`` step's ``ptok < tokens``.  Calls that change nothing
the abstraction sees are the ``identity`` step.

Each split takes the state before the call, the model's result (``None``
when it refused) and the call's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .pool import chosen
from .request import block_hash, content, prefix_key
from .state import NULL, BlockId, PoolState

StepCall = tuple[str, tuple[Any, ...]]
"""A z3 step by name, with its arguments as model values."""


@dataclass(frozen=True)
class Split:
    """A call as z3 steps, and what the model's verdict requires of them."""

    steps: tuple[StepCall, ...]
    """Run in turn: the model's verdict (the agreement check reads it from the model) says
    whether each must be enabled."""
    exhaust: str | None = None
    """After the steps, this step must be disabled for every block (a refused ``get_new_blocks``)."""

    @property
    def name(self) -> str:
        """The step the split is about (a split uses one kind of step)."""
        return self.steps[-1][0] if self.steps else (self.exhaust or "identity")


IDENTITY = ("identity", ())


def per_block(step: str, blocks: Sequence[BlockId]) -> Split:
    return Split(tuple((step, (b,)) for b in blocks))


def get_new_blocks(s: PoolState, result: Any, num_blocks: int) -> Split:
    if result is not None:
        return per_block("alloc", result)
    return Split(tuple(("alloc", (b,)) for b in s.free), exhaust="alloc")


def touch(s: PoolState, result: Any, block_ids: Sequence[BlockId]) -> Split:
    return per_block("touch", block_ids)


def reset_prefix_cache(s: PoolState, result: Any) -> Split:
    return Split((("reset", ()),))


def cache_full_blocks(
    s: PoolState, result: Any, request: Any, block_ids: Sequence[BlockId],
    num_cached_blocks: int, num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> Split:
    hbs = s.hash_block_size
    picked = chosen(block_ids, num_cached_blocks, num_full_blocks, block_mask)
    if not picked:  # none chosen: also when num_cached_blocks >= num_full_blocks
        return Split((IDENTITY,))
    return Split(tuple(
        ("cache_full", (b, (block_hash(request, hbs, block_size, i), kv_cache_group_id), (i + 1) * block_size,
                        content(request, (i + 1) * block_size, hbs)))
        for i, b in picked))


def cache_partial_block(
    s: PoolState, result: Any, request: Any, block_id: BlockId, num_tokens: int,
    kv_cache_group_id: int, block_size: int, replace_existing_hashes: bool = False,
) -> Split:
    if block_id == NULL:
        return Split((IDENTITY,))
    hbs = s.hash_block_size
    key = prefix_key(request, num_tokens, hbs, kv_cache_group_id)
    return Split((("cache_partial", (block_id, key, num_tokens, content(request, num_tokens, hbs),
                                     replace_existing_hashes)),))


def move_block_hashes(s: PoolState, result: Any, src_id: BlockId, dst_id: BlockId) -> Split:
    return Split((("move", (src_id, dst_id)),))


def insert_block_hash(
    s: PoolState, result: Any, request: Any, prefix_tokens: int, kv_cache_group_id: int,
    block_id: BlockId, num_tokens: int | None,
) -> Split:
    hbs = s.hash_block_size
    key = prefix_key(request, prefix_tokens, hbs, kv_cache_group_id)
    prefix = content(request, prefix_tokens, hbs)
    return Split((("insert", (block_id, key, num_tokens or 0, prefix)),))


def write_block(s: PoolState, result: Any, block_id: BlockId, request: Any,
                num_tokens: int) -> Split:
    return Split((("write", (block_id, content(request, num_tokens, s.hash_block_size))),))


def unchanged(s: PoolState, result: Any, *args: Any) -> Split:
    """Event-only operations: the abstraction sees no change."""
    return Split((IDENTITY,))
