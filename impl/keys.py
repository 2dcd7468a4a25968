"""Block hashes, index keys and their external (event) form.

An index key is the block hash with the KV-cache group id appended as four
big-endian bytes, exactly as vLLM packs it, so keys are plain ``bytes``.
"""

from __future__ import annotations

import os
from types import FunctionType
from typing import Final, TypeAlias

from .native import i64

BlockHash: TypeAlias = bytes
BlockHashWithGroupId: TypeAlias = bytes
ExternalBlockHash: TypeAlias = bytes | int

MAX_GROUP_ID = 2**32 - 1

# Bound once: the compiled build calls it directly instead of looking it up on ``int`` per call.
_from_bytes: Final = int.from_bytes


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off", "")


# vLLM publishes event hashes as their low 64 bits unless told otherwise.
USE_INT_BLOCK_HASHES: Final = _env_flag("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", True)


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Pack a hash and a group id into one index key."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The hash part of an index key."""
    return key[:-4]


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group part of an index key (its last 4 bytes, big-endian, unsigned)."""
    n = len(key)
    if n < 4:
        return _from_bytes(key, "big")
    # Byte by byte: compiled, these are machine operations with no object made (one KV event per evicted key).
    return (key[n - 4] << 24) | (key[n - 3] << 16) | (key[n - 2] << 8) | key[n - 1]


def _probe() -> None:
    """A function of this module: a Python function unless mypyc compiled the module."""


# Compiled, event hashes are read byte by byte as machine integers (no slice, no call of
# int.from_bytes: a third of the instructions of caching a block); interpreted, by
# int.from_bytes, the faster there.  Both give the same int (tests/test_hashing.py).
_NATIVE: Final = not isinstance(_probe, FunctionType)


def low_64_at(data: bytes, end: i64) -> int:
    """``int.from_bytes(data[end - 8:end], "big")``, for ``8 <= end <= len(data)``."""
    hi: i64 = (i64(data[end - 8]) << 24) | (i64(data[end - 7]) << 16) | (
        i64(data[end - 6]) << 8) | i64(data[end - 5])
    lo: i64 = (i64(data[end - 4]) << 24) | (i64(data[end - 3]) << 16) | (
        i64(data[end - 2]) << 8) | i64(data[end - 1])
    if hi < 0x8000_0000:
        return int((hi << 32) | lo)
    # The top bit set: past a signed 64-bit integer, so added on as a Python int.
    return int(((hi - 0x8000_0000) << 32) | lo) + 0x8000_0000_0000_0000


def maybe_convert_block_hash(hash_bytes: BlockHash) -> ExternalBlockHash:
    """The form a hash takes in KV events: low 64 bits as int, or raw bytes."""
    if not USE_INT_BLOCK_HASHES:
        return hash_bytes
    if _NATIVE and len(hash_bytes) >= 8:
        return low_64_at(hash_bytes, len(hash_bytes))
    return _from_bytes(hash_bytes[-8:], "big")  # the low 64 bits of the big-endian number


def key_event_hash(key: BlockHashWithGroupId) -> ExternalBlockHash:
    """``maybe_convert_block_hash(get_block_hash(key))``: the hash a removed key's event names.

    Compiled, read from the key in place (one slice less per evicted key).
    """
    if _NATIVE and USE_INT_BLOCK_HASHES and len(key) >= 12:
        return low_64_at(key, len(key) - 4)
    return maybe_convert_block_hash(get_block_hash(key))
