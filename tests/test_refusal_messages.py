"""Every refusal names what was wrong: the pool and the model refuse alike, with the same words.

The same misuse is run on kvpool's pool and on the model: the pool's typed
error must be the model's refusal kind (as the oracle reads it) and both
messages must match the same pattern.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from kvpool.impl import (
    BlockPool,
    Request,
    get_request_block_hasher,
    hash_block_tokens,
)
from kvpool.impl import events as ev
from kvpool.impl.errors import (
    BlockHashConflictError,
    BlockNotInUseError,
    CachingDisabledError,
    InvalidArgumentError,
    NotEnoughFreeBlocksError,
    NullBlockError,
    UnknownBlockError,
)
from kvpool.impl.hashing import resolve_block_hashes
from kvpool.impl.keys import make_block_hash_with_group_id
from kvpool.model import ACTIONS, QUERIES, PoolState, Refusal, RefusalKind, initial_state
from kvpool.oracle.core.abstraction import refusal_kind

# ------------------------------------------------------------ refusals, named
# Every refusal says what was wrong: the argument, its value, the block.  The same call is
# refused by the pool and by the model with the same error type and a message matching the
# same pattern.

_CB = print  # any callable will do as a reuse watcher
_FOREIGN = object()


def _req(n: int = 8) -> Request:
    return Request("q", list(range(n)), block_hasher=get_request_block_hasher(2))


# (method, arguments with Bn standing for block n, error type, message pattern, caching)
_MISUSE: list[tuple[str, tuple[Any, ...], type[Exception], str, bool]] = [
    ("get_new_blocks", (-1,), InvalidArgumentError, r"^num_blocks must be a non-negative int, got -1$", True),
    ("get_new_blocks", (99,), NotEnoughFreeBlocksError, r"^Cannot get 99 free blocks from the pool$", True),
    ("free_blocks", ([("B", 3)],), BlockNotInUseError,
     r"^free block 3: (more releases than references|1 release\(s\) but ref count 0)$", True),
    ("free_blocks", ([("B", 2), ("B", 2)],), BlockNotInUseError,
     r"^free block 2: (more releases than references|2 release\(s\) but ref count 1)$", True),
    ("unpin_blocks", ([("B", 3)], _CB), BlockNotInUseError,
     r"^unpin block 3: (more releases than references|1 release\(s\) but ref count 0)$", True),
    ("unpin_blocks", ([("B", 1)], "x"), InvalidArgumentError, r"^on_reuse must be callable$", True),
    ("unpin_blocks", ([("B", 0)], _CB), NullBlockError, r"^the null block cannot be unpinned$", True),
    ("evict_blocks", ([99],), UnknownBlockError,
     r"^(Invalid block_id|block id) 99:? (is )?not in \[0, 8\)$", True),
    ("evict_blocks", ([-1],), UnknownBlockError,
     r"^(Invalid block_id|block id) -1:? (is )?not in \[0, 8\)$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], -1, 1, 4, 0), InvalidArgumentError,
     r"^num_cached_blocks must be a non-negative int, got -1$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, -1, 4, 0), InvalidArgumentError,
     r"^num_full_blocks must be a non-negative int, got -1$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 3, 0), InvalidArgumentError,
     r"^block_size 3 is not a positive multiple of 2$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 0, 0), InvalidArgumentError,
     r"^block_size 0 is not a positive multiple of 2$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 4.0, 0), InvalidArgumentError,
     r"^block_size 4.0 is not a positive multiple of 2$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 4, -1), InvalidArgumentError,
     r"^kv_cache_group_id -1 is not a 32-bit id$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 4, 2**32), InvalidArgumentError,
     r"^kv_cache_group_id 4294967296 is not a 32-bit id$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 2, 4, 0), InvalidArgumentError,
     r"^num_full_blocks 2 > 1 blocks$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 4, 0, [True, False]), InvalidArgumentError,
     r"^block_mask has 2 entries, want 1$", True),
    ("cache_full_blocks", ("SHORT", [("B", 2)], 0, 1, 4, 0), InvalidArgumentError,
     r"^request has 0 block hashes, want 1$", True),
    ("cache_full_blocks", ("REQ", [("B", 0), ("B", 0), ("B", 2)], 0, 3, 4, 0), InvalidArgumentError,
     r"^request has 2 block hashes, want 3$", True),
    ("get_cached_block", (b"h", [1.0]), InvalidArgumentError, r"^kv_cache_group_id 1.0 is not a 32-bit id$",
     True),
    ("cache_full_blocks", ("REQ", [("B", 1)], 0, 1, 4, 0), BlockHashConflictError,
     r"^block 1 is already cached at a prefix this long$", True),
    ("cache_full_blocks", ("REQ", [("B", 2)], 0, 1, 4, 0), CachingDisabledError,
     r"^cache_full_blocks on a pool without prefix caching$", False),
    ("emit_cached_block_events", ("REQ", -1, 4, 0), InvalidArgumentError,
     r"^num_cached_blocks must be a non-negative int, got -1$", True),
    ("emit_cached_block_events", ("REQ", 1, 3, 0), InvalidArgumentError,
     r"^block_size 3 is not a positive multiple of 2$", True),
    ("emit_cached_block_events", ("REQ", 3, 4, 0), InvalidArgumentError,
     r"^request has 2 block hashes, want 3$", True),
    ("cache_partial_block", ("REQ", ("B", 2), 3, 0, 4), InvalidArgumentError,
     r"^num_tokens 3 is not a positive multiple of 2$", True),
    ("cache_partial_block", ("REQ", ("B", 2), 0, 0, 4, True), InvalidArgumentError,
     r"^num_tokens 0 is not a positive multiple of 2$", True),
    ("cache_partial_block", ("REQ", ("B", 2), 4, 0, 4), InvalidArgumentError,
     r"^a partial entry must end inside a block$", True),
    ("cache_partial_block", ("REQ", ("B", 2), 10, 0, 8), InvalidArgumentError,
     r"^request has only 4 block hashes$", True),
    ("cache_partial_block", ("REQ", ("B", 2), 2, 0, 4), CachingDisabledError,
     r"^cache_partial_block on a pool without prefix caching$", False),
    ("cache_partial_block", ("REQ", ("B", 2), 2, 7, 3), InvalidArgumentError,
     r"^block_size 3 is not a positive multiple of 2$", True),
    ("move_block_hashes", (("B", 2), ("B", 1)), BlockHashConflictError,
     r"^block 1 already has hashes$", True),
    ("move_block_hashes", (("B", 1), ("B", 0)), NullBlockError,
     r"^hashes cannot be moved onto the null block$", True),
    ("get_cached_block", (b"h", [-1, 0]), InvalidArgumentError, r"^kv_cache_group_id -1 is not a 32-bit id$",
     True),
]


def _impl_setup(caching: bool) -> tuple[BlockPool, dict[str, Request]]:
    pool = BlockPool(8, caching, 2, enable_kv_cache_events=True)
    reqs = {"REQ": _req(), "SHORT": _req(2)}
    b1, _b2 = pool.get_new_blocks(2)
    if caching:
        pool.cache_full_blocks(reqs["REQ"], [b1], 0, 1, 4, 0)
    return pool, reqs


def _model_setup(caching: bool) -> tuple[PoolState, dict[str, Request]]:
    s = initial_state(8, caching, 2, events_on=True)
    reqs = {"REQ": _req(), "SHORT": _req(2)}
    s, _ = ACTIONS["get_new_blocks"](s, 2)
    if caching:
        s, _ = ACTIONS["cache_full_blocks"](s, reqs["REQ"], [1], 0, 1, 4, 0)
    return s, reqs


def _resolve(arg: Any, block: Any, reqs: dict[str, Request]) -> Any:
    if isinstance(arg, str) and arg in reqs:
        return reqs[arg]
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "B":
        return block(arg[1])
    if isinstance(arg, list):
        return [_resolve(a, block, reqs) for a in arg]
    return arg


@pytest.mark.parametrize(("method", "args", "error", "pattern", "caching"), _MISUSE)
def test_refusals_name_what_was_wrong(
    method: str, args: tuple[Any, ...], error: type[Exception], pattern: str, caching: bool
) -> None:
    pool, reqs = _impl_setup(caching)
    with pytest.raises(error, match=pattern) as refused:
        getattr(pool, method)(*(_resolve(a, pool.blocks.__getitem__, reqs) for a in args))
    state, mreqs = _model_setup(caching)
    fn = ACTIONS.get(method) or QUERIES[method]
    with pytest.raises(Refusal, match=pattern) as model:
        fn(state, *(_resolve(a, int, mreqs) for a in args))
    assert refusal_kind(refused.value) is model.value.kind


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda p: p.touch([p.blocks[3], BlockPool(4, True, 2).blocks[1]]), UnknownBlockError,
     r"^touch: KVCacheBlock\(block_id=1, .* is not a block of this pool$"),
    (lambda p: p.free_blocks([p.blocks[1], _FOREIGN]), UnknownBlockError, r"^free: not a KV-cache block: "),
    (lambda p: p.unpin_blocks([_FOREIGN], _CB), UnknownBlockError, r"is not a block of this pool$"),
    (lambda p: p.free_blocks([p.blocks[3], _FOREIGN]), UnknownBlockError,  # a double free, then not a block
     r"^<object object at 0x[0-9a-f]+> is not a block of this pool$"),
    (lambda p: p.is_block_writable(_FOREIGN), UnknownBlockError, r"is not a block of this pool$"),
    (lambda p: p.cache_partial_block(_req(), p.blocks[2], 2, 0, 4, True), CachingDisabledError,
     r"^cache_partial_block on a pool without prefix caching$"),
    (lambda p: BlockPool(0, True, 2), InvalidArgumentError,
     r"^num_gpu_blocks must be a positive int, got 0$"),
    (lambda p: BlockPool(4, True, 0), InvalidArgumentError,
     r"^hash_block_size must be a positive int, got 0$"),
    (lambda p: p.free_block_queue.remove(p.blocks[1]), UnknownBlockError,
     r"^block 1 is not in the free queue$"),
    (lambda p: p.free_block_queue.popleft_n(99), NotEnoughFreeBlocksError,
     r"^Cannot get 99 free blocks from the pool$"),
    (lambda p: BlockPool(1, True, 2).free_block_queue.popleft(), NotEnoughFreeBlocksError,
     r"^No free blocks available$"),
    (lambda p: get_request_block_hasher(0), ValueError, r"^hash_block_size must be positive$"),
    (lambda p: resolve_block_hashes([b"a"], 2, 3), ValueError,
     r"^target block size must be a positive multiple of hash_block_size$"),
    (lambda p: hash_block_tokens(None, [1], (1.5,)), TypeError, r"^cannot hash a float in a block key$"),
    (lambda p: ev.event_fields(_FOREIGN), TypeError, r"^not a KV-cache event: <object object"),
])
def test_pool_only_refusals_name_what_was_wrong(call: Any, error: type[Exception], pattern: str) -> None:
    pool, _ = _impl_setup(False)
    with pytest.raises(error, match=pattern):
        call(pool)


@pytest.mark.parametrize(("block", "num_tokens", "error", "pattern", "caching"), [
    (0, 2, NullBlockError, r"^the null block cannot be indexed$", True),
    (2, 2, CachingDisabledError, r"^_insert_block_hash on a pool without prefix caching$", False),
    (2, 0, InvalidArgumentError, r"^num_tokens 0 of a primary key is not a positive multiple of 2$", True),
    (2, 3, InvalidArgumentError, r"^num_tokens 3 of a primary key is not a positive multiple of 2$", True),
    (2, None, InvalidArgumentError, r"^num_tokens None of a primary key is not a positive multiple of 2$",
     True),
])
def test_insert_block_hash_refusals_name_what_was_wrong(
    block: int, num_tokens: int | None, error: type[Exception], pattern: str, caching: bool
) -> None:
    """The pool takes a packed key, the model the request and prefix that name it: the same refusal."""
    pool, reqs = _impl_setup(caching)
    key = make_block_hash_with_group_id(reqs["REQ"].block_hashes[0], 0)
    with pytest.raises(error, match=pattern) as refused:
        pool._insert_block_hash(key, pool.blocks[block], num_tokens)
    state, mreqs = _model_setup(caching)
    with pytest.raises(Refusal, match=pattern) as model:
        ACTIONS["_insert_block_hash"](state, mreqs["REQ"], 2, 0, block, num_tokens)
    assert refusal_kind(refused.value) is model.value.kind


@pytest.mark.parametrize("key", [b"abcd", b"", "abcde", bytearray(b"abcde")])
def test_insert_block_hash_refuses_what_is_not_a_key(key: Any) -> None:
    pool, _ = _impl_setup(True)
    pattern = rf"^{re.escape(repr(key))} is not an index key \(a block hash and 4 group bytes\)$"
    with pytest.raises(InvalidArgumentError, match=pattern):
        pool._insert_block_hash(key, pool.blocks[2], 2)
    pool._insert_block_hash(b"h" + bytes(4), pool.blocks[2], 2)  # a 1-byte hash is a key
    assert pool.get_cached_block(b"h", [0]) == [pool.blocks[2]]


@pytest.mark.parametrize(("action", "args"), [
    ("touch", ([8],)), ("touch", (["x"],)), ("free_blocks", ([1, 8],)), ("unpin_blocks", ([8], _CB)),
    ("cache_partial_block", (_req(), 8, 2, 0, 4)), ("move_block_hashes", (1, 8)),
    ("cache_full_blocks", (_req(), [1, 8], 0, 2, 4, 0)),
])
def test_model_refuses_unknown_block_ids_by_name(action: str, args: tuple[Any, ...]) -> None:
    state, _ = _model_setup(True)
    with pytest.raises(Refusal, match=r"^block id (8|'x') is not in \[0, 8\)$") as info:
        ACTIONS[action](state, *args)
    assert info.value.kind is RefusalKind.UNKNOWN_BLOCK
    with pytest.raises(Refusal, match=r"^block id 8 is not in \[0, 8\)$") as info:
        QUERIES["is_block_writable"](state, 8)
    assert info.value.kind is RefusalKind.UNKNOWN_BLOCK


def test_coarse_hash_view_index_error_names_the_index() -> None:
    view = resolve_block_hashes([b"a", b"b", b"c", b"d"], 2, 4)
    for bad in (2, -3):
        with pytest.raises(IndexError) as info:
            view[bad]
        assert info.value.args == (bad + (2 if bad < 0 else 0),)


def test_reset_logs_as_vllm_does(caplog: pytest.LogCaptureFixture) -> None:
    pool = BlockPool(4, True, 2)
    blocks = pool.get_new_blocks(2)
    with caplog.at_level(logging.INFO, logger="kvpool"):
        assert pool.reset_prefix_cache() is False
        pool.free_blocks(blocks)
        assert pool.reset_prefix_cache() is True
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "Failed to reset prefix cache because some blocks (2) are not freed yet"),
        (logging.INFO, "Successfully reset prefix cache"),
    ]


