"""Block hashes, index keys and their external (event) form.

An index key is the block hash with the KV-cache group id appended as four
big-endian bytes, exactly as vLLM packs it, so keys are plain ``bytes``.
"""

from __future__ import annotations

import os
from typing import TypeAlias

BlockHash: TypeAlias = bytes
BlockHashWithGroupId: TypeAlias = bytes
ExternalBlockHash: TypeAlias = bytes | int

MAX_GROUP_ID = 2**32 - 1


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off", "")


# vLLM publishes event hashes as their low 64 bits unless told otherwise.
USE_INT_BLOCK_HASHES = _env_flag("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", True)


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Pack a hash and a group id into one index key."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The hash part of an index key."""
    return key[:-4]


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group part of an index key."""
    return int.from_bytes(key[-4:], "big")  # unsigned


def maybe_convert_block_hash(hash_bytes: BlockHash) -> ExternalBlockHash:
    """The form a hash takes in KV events: low 64 bits as int, or raw bytes."""
    if not USE_INT_BLOCK_HASHES:
        return hash_bytes
    return int.from_bytes(hash_bytes[-8:], "big")  # the low 64 bits of the big-endian number
