"""The pool-and-model refusal table and the model's mutation killers, pending their move."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from kvpool.impl import (
    BlockPool,
    LoRARequest,
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
from kvpool.impl.request import MultiModalFeature, PlaceholderRange
from kvpool.model import ACTIONS, QUERIES, PoolState, Refusal, RefusalKind, initial_state
from kvpool.oracle.abstraction import model_event, pool_event, refusal_kind
from kvpool.oracle.observe import snapshot


# Multimodal items item0, item1, ... at the given (offset, length) spans; used by the model tests.
def _features(spans: list[tuple[int, int]]) -> list[MultiModalFeature]:
    return [MultiModalFeature(f"item{i}", PlaceholderRange(offset=o, length=n))
            for i, (o, n) in enumerate(spans)]


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


# ------------------------------------------------------------------- the model


def test_invariant_decorator_registers_and_returns_the_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.model import invariants

    monkeypatch.setattr(invariants, "INVARIANTS", dict(invariants.INVARIANTS))

    def never_holds(s: PoolState) -> bool:
        return False

    assert invariants.invariant(never_holds) is never_holds
    assert invariants.INVARIANTS["never_holds"] is never_holds
    assert invariants.violated(initial_state(4, True, 2)) == ["never_holds"]


def test_hit_events_carry_only_the_hit_tokens() -> None:
    req = Request("h", list(range(11)), block_hasher=get_request_block_hasher(2))
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    pool.emit_cached_block_events(req, 2, 4, 0)
    state, _ = ACTIONS["emit_cached_block_events"](initial_state(4, True, 2, events_on=True), req, 2, 4, 0)
    (event,) = cast(list[Any], pool.take_events())
    assert [model_event(e) for e in state.events] == [pool_event(event)]
    assert event.token_ids == list(range(8)) and event.parent_block_hash is None and event.block_size == 4


def test_one_token_partial_entry_with_one_token_chunks() -> None:
    req = Request("o", [7, 8, 9], block_hasher=get_request_block_hasher(1))
    pool = BlockPool(4, True, 1)
    (blk,) = pool.get_new_blocks(1)
    key = pool.cache_partial_block(req, blk, 1, 0, 2)
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 1), 1)
    state, model_key = ACTIONS["cache_partial_block"](state, req, 1, 1, 0, 2)
    assert key == make_block_hash_with_group_id(req.block_hashes[0], 0)
    assert model_key == (req.block_hashes[0], 0)
    assert state.index == {model_key: (1,)} and pool.get_cached_block(req.block_hashes[0], [0]) == [blk]


@pytest.mark.parametrize("num_tokens", [2, 4, 6, 10, 12, 14])
def test_partial_entry_events_with_multimodal_items_match_the_model(num_tokens: int) -> None:
    spans = [(1, 2), (3, 6), (13, 1), (15, 4)]
    req = Request("x", list(range(20)), lora_request=LoRARequest("ad", 1, "/p"), cache_salt="s",
                  mm_features=_features(spans), block_hasher=get_request_block_hasher(2))
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_partial_block(req, blk, num_tokens, 0, 8)
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2, events_on=True), 1)
    state, _ = ACTIONS["cache_partial_block"](state, req, 1, num_tokens, 0, 8)
    (event,) = cast(list[Any], pool.take_events())
    assert [model_event(e) for e in state.events] == [pool_event(event)]
    start = num_tokens - 2
    mm = tuple((f"item{k}", o - start) for k, (o, n) in enumerate(spans) if o < num_tokens and o + n > start)
    assert event.extra_keys == [("ad", *mm, *(("s",) if start == 0 else ()))]


def test_model_null_block_counter_per_reference_version() -> None:
    """0.31 moves the null block's counter on free/touch, 0.33 leaves it; real blocks alike."""
    for null_counted in (True, False):
        s, _ = ACTIONS["get_new_blocks"](initial_state(5, True, 2, null_counted=null_counted), 3)
        s, _ = ACTIONS["touch"](s, [0, 1, 0, 2])
        assert s.ref == ((2 if null_counted else 0), 2, 2, 1, 0)
        s, _ = ACTIONS["free_blocks"](s, [0, 3, 1, 0, 2])
        assert s.ref == (0, 1, 1, 0, 0) and s.free == (3, 4)


def test_model_keeps_every_reuse_notification() -> None:
    def first(b: Any) -> None:
        pass

    def second(b: Any) -> None:
        pass

    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2), 2)
    s, _ = ACTIONS["unpin_blocks"](s, [1], first)
    s, _ = ACTIONS["get_new_blocks"](s, 2)  # 3 then 1: block 1 is reused
    assert s.fired == ((first, 1),)
    s, _ = ACTIONS["unpin_blocks"](s, [2], second)
    s, _ = ACTIONS["free_blocks"](s, [1, 3])
    s, ok = ACTIONS["reset_prefix_cache"](s)
    assert ok and s.fired == ((first, 1), (second, 2)) and s.watchers == {}


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize(("num_cached", "num_full"), [(0, 0), (1, 1), (2, 1), (3, 3)])
def test_cache_full_blocks_with_nothing_new_does_nothing(
    caching: bool, num_cached: int, num_full: int
) -> None:
    """As in vLLM (its sparse-attention coordinator relies on it): not even a refusal."""
    req = _req(2)  # no hash at block size 4
    pool = BlockPool(4, caching, 2, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(1)
    before = snapshot(pool)
    pool.cache_full_blocks(req, blocks, num_cached, num_full, 4, 0)
    assert snapshot(pool) == before and pool.take_events() == []
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, caching, 2, events_on=True), 1)
    assert ACTIONS["cache_full_blocks"](state, req, [1], num_cached, num_full, 4, 0) == (state, None)


def test_stored_events_carry_the_range_tokens_like_the_model() -> None:
    req = Request("t", list(range(20)), block_hasher=get_request_block_hasher(2))
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(req, blocks, 0, 1, 4, 0)
    pool.cache_full_blocks(req, blocks, 1, 3, 4, 0)
    state, _ = ACTIONS["get_new_blocks"](initial_state(6, True, 2, events_on=True), 4)
    state, _ = ACTIONS["cache_full_blocks"](state, req, [1, 2, 3, 4], 0, 1, 4, 0)
    state, _ = ACTIONS["cache_full_blocks"](state, req, [1, 2, 3, 4], 1, 3, 4, 0)
    events = cast(list[Any], pool.take_events())
    assert [model_event(e) for e in state.events] == [pool_event(e) for e in events]
    assert [e.token_ids for e in events] == [list(range(4)), list(range(4, 12))]


def test_model_ghost_content_is_what_the_hashes_cover() -> None:
    """``names``/``holds`` record each chunk's tokens and the extra keys its hash covers."""
    spans = [(0, 3), (5, 2), (9, 4)]
    req = Request("g", list(range(16)), mm_features=_features(spans), cache_salt="s",
                  block_hasher=get_request_block_hasher(2))
    state, _ = ACTIONS["get_new_blocks"](initial_state(6, True, 2), 3)
    state, _ = ACTIONS["cache_full_blocks"](state, req, [1, 2, 3], 0, 3, 4, 0)
    chunks = tuple((tuple(range(k, k + 2)), ev.extra_keys_of_chunk(req, k, k + 2)) for k in range(0, 12, 2))
    assert chunks[0][1] == (("mm", "item0", 0), ("cache_salt", "s"))
    for i, b in enumerate((1, 2, 3)):
        primary = state.primary[b]
        assert primary is not None
        assert state.names[primary.key] == chunks[: 2 * (i + 1)] == state.holds[b]


def test_model_initial_state_defaults_are_the_pools() -> None:
    pool = BlockPool(4, True, 2)
    state = initial_state(4, True, 2)
    assert (state.events_on, state.medium) == (pool.enable_kv_cache_events, pool.medium) == (False, "GPU")
    assert state.null_counted is True and state.free == (1, 2, 3) and state.ref == (0, 0, 0, 0)
