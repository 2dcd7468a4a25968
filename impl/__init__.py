"""kvpool.impl: the concrete block pool, a drop-in for vLLM's ``BlockPool``.

Self-contained: it imports nothing outside this package and needs no
third-party package at run time.  ``COMPILED`` says which build is loaded:
the plain Python one, or the same source compiled by mypyc
(``KVPOOL_COMPILE=1 pip install .``, see ``setup.py``).
"""

from types import FunctionType

from .block import KVCacheBlock
from .errors import (
    BlockHashConflictError,
    BlockNotInUseError,
    BlockPoolError,
    CachingDisabledError,
    InvalidArgumentError,
    NotEnoughFreeBlocksError,
    NullBlockError,
    UnknownBlockError,
)
from .events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from .free_queue import FreeKVCacheBlockQueue
from .hash_index import BlockHashToBlockMap
from .hashing import get_request_block_hasher, hash_block_tokens, resolve_block_hashes
from .keys import (
    BlockHash,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from .metrics import KVCacheMetricsCollector
from .pool import BlockPool
from .request import LoRARequest, MultiModalFeature, PlaceholderRange, Request


def _probe() -> None:
    """A function of this module: a Python function unless mypyc compiled the module."""


COMPILED: bool = not isinstance(_probe, FunctionType)

__all__ = [
    "COMPILED", "MEDIUM_CPU", "MEDIUM_GPU", "MEDIUM_STORAGE", "AllBlocksCleared", "BlockHash",
    "BlockHashConflictError", "BlockHashToBlockMap", "BlockHashWithGroupId",
    "BlockNotInUseError", "BlockPool", "BlockPoolError", "BlockRemoved", "BlockStored",
    "CachingDisabledError", "ExternalBlockHash", "FreeKVCacheBlockQueue", "InvalidArgumentError",
    "KVCacheBlock", "KVCacheEvent", "KVCacheMetricsCollector", "LoRARequest",
    "MultiModalFeature", "NotEnoughFreeBlocksError", "NullBlockError", "PlaceholderRange",
    "Request", "UnknownBlockError", "get_block_hash", "get_group_id",
    "get_request_block_hasher", "hash_block_tokens", "make_block_hash_with_group_id",
    "maybe_convert_block_hash", "resolve_block_hashes",
]
