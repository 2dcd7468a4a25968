"""What the pool assumes of its caller: named contracts, and what each operation requires.

The proofs hold only for callers that keep these contracts, so the model does
not take them on faith: a call that breaks one raises :class:`ContractBroken`
(the caller is wrong, not the pool: a verdict of its own) and changes
nothing.  A call's requirements are checked after its guard passed
(:mod:`.guards`), in the order written here.  The one assumption the model
cannot check in full is that hashes do not collide; it checks what it can
see of it (a key in use naming another prefix).

A block is *writable* when its sole owner holds it and no hash names it
(``is_block_writable``): only then may it receive KV that does not extend
what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .pool import chosen
from .request import Content, block_hash, compatible, content, prefix_key
from .state import NULL, BlockId, Key, PoolState

CONTRACTS: dict[str, str] = {
    "hashes_name_one_prefix":
        "A block hash names one token prefix: a key in use never stands for another prefix.",
    "writes_extend_unless_writable":
        "KV is written into a block by one of its holders, and only as an extension of the "
        "prefix it holds unless the block is writable.",
    "replaced_by_its_sole_owner":
        "Only a block's sole owner replaces its contents (replace_existing_hashes).",
    "moves_onto_the_callers_copy":
        "move_block_hashes moves entries onto a block the caller holds alone, into which it "
        "copied the source block.",
    "cached_once_per_call":
        "cache_full_blocks lists each block once: a block holds one position of a request.",
}
"""Every caller contract, by name, with the one line that states it."""


class ContractBroken(Exception):
    """The caller broke a contract; the specification says nothing about what the pool does."""

    def __init__(self, contract: str, message: str) -> None:
        super().__init__(f"caller broke {contract}: {message}")
        self.contract = contract


# --------------------------------------------------------------------------
# The contracts as checks.


def writable(s: PoolState, b: BlockId) -> bool:
    """Whether ``b``'s sole owner may write anything into it (no hash names it)."""
    return b != NULL and s.ref[b] == 1 and s.primary[b] is None


def writes_extend_unless_writable(s: PoolState, b: BlockId, written: Content) -> None:
    if not compatible(s.holds[b], written) and not writable(s, b):
        raise ContractBroken("writes_extend_unless_writable",
                             f"block {b} holds a prefix that {len(written)} written chunk(s) "
                             "do not extend, and it is not writable")


def written_by_a_holder(s: PoolState, b: BlockId, why: str) -> None:
    if b == NULL or s.ref[b] < 1:
        raise ContractBroken("writes_extend_unless_writable", f"block {b} has no holder to {why}")


def hashes_name_one_prefix(s: PoolState, key: Key, prefix: Content) -> None:
    if s.index.get(key) and s.names.get(key, prefix) is not prefix:
        raise ContractBroken("hashes_name_one_prefix",
                             f"key …{key[0][-3:].hex()}/g{key[1]} already names another prefix")


def cached_once_per_call(blocks: Sequence[BlockId]) -> None:
    if len(set(blocks)) != len(blocks):
        raise ContractBroken("cached_once_per_call", f"blocks {list(blocks)} list one block at two positions")


# --------------------------------------------------------------------------
# What each operation requires (operations not listed require nothing).


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> None:
    picked = chosen(block_ids, num_cached_blocks, num_full_blocks, block_mask)
    cached_once_per_call([b for _i, b in picked])
    hbs = s.hash_block_size
    for i, b in picked:
        prefix = content(request, (i + 1) * block_size, hbs)
        hashes_name_one_prefix(s, (block_hash(request, hbs, block_size, i), kv_cache_group_id), prefix)
        writes_extend_unless_writable(s, b, prefix)


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> None:
    hbs = s.hash_block_size
    prefix = content(request, num_tokens, hbs)
    hashes_name_one_prefix(s, prefix_key(request, num_tokens, hbs, kv_cache_group_id), prefix)
    if not replace_existing_hashes:
        writes_extend_unless_writable(s, block_id, prefix)
    elif s.ref[block_id] != 1:
        raise ContractBroken("replaced_by_its_sole_owner",
                             f"block {block_id} has {s.ref[block_id]} references, not one")


def move_block_hashes(s: PoolState, src_id: BlockId, dst_id: BlockId) -> None:
    if s.ref[dst_id] != 1:
        raise ContractBroken("moves_onto_the_callers_copy",
                             f"block {dst_id} has {s.ref[dst_id]} references: "
                             "it is not the caller's own copy")


def insert_block_hash(
    s: PoolState, request: Any, prefix_tokens: int, kv_cache_group_id: int, block_id: BlockId,
    num_tokens: int | None,
) -> None:
    hbs = s.hash_block_size
    prefix = content(request, prefix_tokens, hbs)
    hashes_name_one_prefix(s, prefix_key(request, prefix_tokens, hbs, kv_cache_group_id), prefix)
    written_by_a_holder(s, block_id, "copy KV into it")
    writes_extend_unless_writable(s, block_id, prefix)


def write_block(s: PoolState, block_id: BlockId, request: Any, num_tokens: int) -> None:
    written_by_a_holder(s, block_id, "write into it")
    writes_extend_unless_writable(s, block_id, content(request, num_tokens, s.hash_block_size))


def nothing(s: PoolState, *args: Any) -> None:
    """The operations that require nothing of their caller."""

