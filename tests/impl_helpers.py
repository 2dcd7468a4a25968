"""Helpers of the pool's unit tests (``tests/test_impl_*.py``): pools, requests, keys and events
as the tests compare them, and recording callbacks; and a fake torch tensor, which the hashing
tests of the pool and of the model share.  ``tests/conftest.py`` puts this folder on
``sys.path`` (tests are no package), so a test file imports it by name.
"""


from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from kvpool.impl import (
    MEDIUM_GPU,
    BlockPool,
    KVCacheBlock,
    Request,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from kvpool.impl.events import event_fields

HBS = 2  # hash_block_size of the pools below
BS = 4  # block size of the KV-cache group (two hash chunks per block)
LOW_64 = (1 << 64) - 1


# --------------------------------------------------------------------------- helpers


def make_pool(
    num_blocks: int = 10,
    *,
    caching: bool = True,
    events: bool = True,
    hbs: int = HBS,
    metrics: Any = None,
    medium: str = MEDIUM_GPU,
) -> BlockPool:
    return BlockPool(num_blocks, caching, hbs, enable_kv_cache_events=events,
                     metrics_collector=metrics, medium=medium)


def make_request(tokens: Sequence[int], hbs: int = HBS, name: str = "r", **kw: Any) -> Request:
    return Request(name, list(tokens), block_hasher=get_request_block_hasher(hbs), **kw)


def ids(blocks: Sequence[KVCacheBlock] | None) -> list[int]:
    assert blocks is not None
    return [b.block_id for b in blocks]


def free_ids(pool: BlockPool) -> list[int]:
    return ids(pool.free_block_queue.get_all_free_blocks())


def key(request: Request, chunk: int, group: int = 0) -> bytes:
    """Index key of the request's prefix ending with hash chunk ``chunk``."""
    return make_block_hash_with_group_id(request.block_hashes[chunk], group)


def ext(block_hash: bytes) -> int:
    """The external (event) form of a hash: its low 64 bits."""
    return int.from_bytes(block_hash, "big") & LOW_64


def stored(**fields: Any) -> dict[str, Any]:
    """``event_fields`` of a BlockStored with the given fields, defaults elsewhere."""
    base: dict[str, Any] = {
        "type": "BlockStored", "block_hashes": [], "parent_block_hash": None, "token_ids": [],
        "block_size": BS, "lora_id": None, "medium": MEDIUM_GPU, "lora_name": None,
        "extra_keys": None, "group_idx": 0, "kv_cache_spec_kind": None,
        "kv_cache_spec_sliding_window": None, "locality": None, "ownership": None,
        "session_id": None,
    }
    base.update(fields)
    return base


def removed(block_key: bytes, medium: str = MEDIUM_GPU) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [ext(get_block_hash(block_key))],
            "medium": medium, "group_idx": get_group_id(block_key), "locality": None,
            "ownership": None}


def taken(pool: BlockPool) -> list[dict[str, Any]]:
    return [event_fields(e) for e in pool.take_events()]


def index_of(pool: BlockPool) -> dict[bytes, list[int]]:
    index = pool.cached_block_hash_to_block
    keys = list(index.keys())
    return {k: ids(index.blocks_of(k)) for k in keys}


def cache_blocks(pool: BlockPool, request: Request, n: int, group: int = 0) -> list[KVCacheBlock]:
    """Allocate ``n`` blocks and cache them as the request's first ``n`` full blocks."""
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(request, blocks, 0, n, BS, group)
    return blocks


class RecordingWatcher:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, block: KVCacheBlock) -> None:
        self.seen.append(block.block_id)


TOKENS = list(range(100, 116))  # 16 tokens: 8 hash chunks, 4 full blocks


# --------------------------------------------------------------------------- prompt embeddings


class FakeTorch(types.ModuleType):
    """Just enough of the torch module for the prompt-embeddings hashing: its uint8 dtype."""

    uint8 = "uint8"


class FakeTensor:
    """Just enough of a torch tensor: slicing, flatten, contiguous, view(uint8), numpy."""

    def __init__(self, rows: list[bytes]) -> None:
        self.rows = rows

    def __getitem__(self, idx: slice) -> FakeTensor:
        return FakeTensor(self.rows[idx])

    def flatten(self) -> FakeTensor:
        return FakeTensor([b"".join(self.rows)])

    def contiguous(self) -> FakeTensor:
        return self

    def view(self, dtype: Any) -> FakeTensor:
        assert dtype == "uint8"
        return self

    def numpy(self) -> bytes:
        return b"".join(self.rows)
