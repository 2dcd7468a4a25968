"""Which cache entries a request may make on its own blocks, and re-keying a block it rewrote.

Partial entries at any chunk boundary a request has written, and
``replace_existing_hashes`` by a block's sole owner, are legal only under the
model's caller contracts (a block is written only with its owner's prefix,
re-keyed only by its sole owner).  The workload and the state machine both
make them, choosing by their own dice among the same legal options listed here.
"""

from __future__ import annotations

from kvpool.model import QUERIES
from kvpool.model.state import NULL

from ..core.lockstep import Lockstep
from .runs import RunConfig, Running


def partial_offsets(block_size: int, hash_block_size: int, boundary: bool) -> list[int]:
    """Where a partial entry may end, counted from its block's start.

    At every hash-chunk boundary inside the block; at the block's end too
    when the reference allows block-boundary partials (vLLM 0.33).
    """
    inside = list(range(hash_block_size, block_size, hash_block_size))
    return [*inside, block_size] if boundary else inside


def partial_spots(run: Running, group: int, cfg: RunConfig, boundary: bool) -> list[tuple[int, int]]:
    """Every legal partial entry of a request's blocks in ``group``: (table index, tokens).

    At each chunk boundary (:func:`partial_offsets`) of each real block, up
    to the last whole chunk the request has written: the entry names a
    prefix of what the block holds, so the block's contents stay as they are.
    """
    hbs, bs = cfg.hash_block_size, cfg.block_sizes[group]
    upto = (run.request.num_tokens // hbs) * hbs
    return [(i, i * bs + off) for i, b in enumerate(run.tables[group]) if b != NULL
            for off in partial_offsets(bs, hbs, boundary) if i * bs + off <= upto]


def rewritable(pair: Lockstep, run: Running, group: int, cfg: RunConfig) -> list[tuple[int, int]]:
    """The blocks of a request's table in ``group`` it alone holds: (table index, chunks it wrote there).

    Only these may be rewritten (re-keyed with ``replace_existing_hashes``):
    a write into a block is its sole owner's.
    """
    hbs, bs = cfg.hash_block_size, cfg.block_sizes[group]
    upto = (run.request.num_tokens // hbs) * hbs
    return [(i, (min(upto, (i + 1) * bs) - i * bs) // hbs) for i, b in enumerate(run.tables[group])
            if b != NULL and pair.model.ref[b] == 1 and i * bs < upto]


def rekey(pair: Lockstep, run: Running, group: int, cfg: RunConfig, i: int, chunks: int) -> None:
    """The request rewrote block ``i`` of its table up to ``chunks`` chunks in: re-key it.

    A block with hashes is not writable (the model's ``is_block_writable``),
    so its entries are evicted first, as vLLM does before it overwrites a
    state block; then ``replace_existing_hashes`` registers what it holds now.
    """
    block, bs = run.tables[group][i], cfg.block_sizes[group]
    upto = i * bs + cfg.hash_block_size * chunks
    if not pair.can("cache_partial_block", run.request, block, upto, group, bs, True) or (
            not writable(pair, block) and not pair.can("evict_blocks", [block])):
        return  # a pool without rewrites (or evictions) is not asked for one
    if not writable(pair, block):
        pair.call("evict_blocks", [block])
    pair.call("cache_partial_block", run.request, block, upto, group, bs,
              True)  # replace_existing_hashes, positional so that traces show it


def writable(pair: Lockstep, block: int) -> bool:
    """Whether the model says the block's sole owner may write into it (ref 1, no hash)."""
    return bool(QUERIES["is_block_writable"](pair.model, block))
