"""Tests written to kill the mutants the rest of the suite let survive (issue #8).

``bash benchmarks/mutation.sh impl|model`` runs mutmut over ``impl/`` and ``model/``;
MUTATION.md lists the score and the survivors that are equivalent.  Each test here pins
behaviour against a reference semantics (a brute-force definition, the model, or vLLM's
documented behaviour) rather than against the source text.  The last test checks the
syntax of the weekly CI workflow that runs the mutation testing.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import logging
import sys
import types
from pathlib import Path
from typing import Any, cast

import pytest

from kvpool.impl import (
    BlockPool,
    KVCacheBlock,
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
from kvpool.impl.hashing import (
    resolve_block_hashes,
)
from kvpool.impl.keys import make_block_hash_with_group_id, maybe_convert_block_hash
from kvpool.impl.request import MultiModalFeature, PlaceholderRange
from kvpool.model import ACTIONS, QUERIES, PoolState, initial_state
from kvpool.oracle.observe import free_queue_link_errors, snapshot

ROOT = Path(__file__).resolve().parents[1]


def _features(spans: list[tuple[int, int]]) -> list[MultiModalFeature]:
    return [MultiModalFeature(f"item{i}", PlaceholderRange(offset=o, length=n))
            for i, (o, n) in enumerate(spans)]


# ------------------------------------------------------------------------ events


def _all_event_kinds() -> list[Any]:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    req = Request("r", list(range(8)), lora_request=LoRARequest("ad", 7, "/p"), cache_salt="s",
                  session_id="sess", block_hasher=get_request_block_hasher(2))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 3)
    pool.free_blocks(blocks)
    pool.evict_blocks([blocks[0].block_id])
    pool.reset_prefix_cache()
    return pool.take_events()


def test_event_fields_round_trip() -> None:
    events = _all_event_kinds()
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    for event in events:
        data = ev.event_fields(event)
        again = ev.from_fields(data)
        assert again == event and type(again) is type(event)
        assert data == ev.event_fields(again)  # from_fields does not consume its argument


def _fake_event_classes() -> tuple[type, type, type]:
    class Stored:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    class Removed(Stored):
        pass

    class Cleared(Stored):
        pass

    return Stored, Removed, Cleared


def test_use_event_classes_switches_and_returns_the_previous_ones() -> None:
    stored, removed, cleared = _fake_event_classes()
    previous = ev.use_event_classes(stored, removed, cleared)
    try:
        assert previous == (ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared)
        out = _all_event_kinds()
        assert [type(e) for e in out] == [stored, removed, cleared]
        assert out[1].kw == {"block_hashes": out[0].kw["block_hashes"][:1], "medium": "GPU", "group_idx": 3}
    finally:
        back = ev.use_event_classes(*previous)
    assert back == (stored, removed, cleared)
    assert [type(e) for e in _all_event_kinds()] == [ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared]


def test_use_vllm_event_classes_takes_them_from_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    stored, removed, cleared = _fake_event_classes()
    fake = types.ModuleType("vllm.distributed.kv_events")
    fake.BlockStored, fake.BlockRemoved, fake.AllBlocksCleared = stored, removed, cleared  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.distributed"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_events", fake)
    previous = ev.use_vllm_event_classes()
    try:
        assert previous == (ev.BlockStored, ev.BlockRemoved, ev.AllBlocksCleared)
        assert (ev.EventClasses.stored, ev.EventClasses.removed, ev.EventClasses.cleared) == (
            stored, removed, cleared)
    finally:
        ev.use_event_classes(*previous)


# ------------------------------------------------------------ pools and blocks


class _Accesses:
    def __init__(self) -> None:
        self.accessed: list[int] = []

    def on_block_allocated(self, block: Any) -> None:
        pass

    def on_block_accessed(self, block: Any) -> None:
        self.accessed.append(block.block_id)

    def on_block_evicted(self, block: Any) -> None:
        pass

    def reset(self) -> None:
        pass


def test_touch_takes_any_iterable_of_blocks() -> None:
    metrics = _Accesses()
    pool = BlockPool(6, True, 2, metrics_collector=metrics)
    b = pool.blocks
    pool.touch((b[2], b[3]))
    pool.touch(cast(Any, (x for x in [b[4], b[2]])))  # any iterable, not only sequences
    assert metrics.accessed == [2, 3, 4, 2]
    assert [b[i].ref_cnt for i in range(1, 6)] == [0, 2, 1, 1, 0]
    with pytest.raises(UnknownBlockError):
        pool.touch(cast(Any, (x for x in [b[5], b[1], BlockPool(3, True, 2).blocks[1]])))
    assert [x.block_id for x in pool.free_block_queue.get_all_free_blocks()] == [1, 5]
    assert b[1].ref_cnt == b[5].ref_cnt == 0 and metrics.accessed == [2, 3, 4, 2]


@pytest.mark.parametrize("bad", [0, 1, 2])
@pytest.mark.parametrize("how", ["unpin", "free", "free_iter"])
def test_refused_release_changes_no_reference(how: str, bad: int) -> None:
    """An over-release anywhere in the list is refused and every count stays as it was."""
    pool = BlockPool(8, True, 2)
    blocks = pool.get_new_blocks(4)
    pool.touch([blocks[0]])
    listed = [blocks[0], blocks[1], blocks[2]]
    listed[bad] = pool.blocks[6]  # a free block: one release too many
    before = snapshot(pool)
    with pytest.raises(BlockNotInUseError):
        if how == "unpin":
            pool.unpin_blocks(listed, _CB)
        elif how == "free":
            pool.free_blocks(listed)
        else:
            pool.free_blocks(x for x in listed)
    assert snapshot(pool) == before
    assert [b.ref_cnt for b in pool.blocks] == [0, 2, 1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_refused_free_with_a_block_of_another_pool_changes_no_reference(order: tuple[int, ...]) -> None:
    mine, theirs = BlockPool(6, True, 2), BlockPool(4, True, 2)
    used = mine.get_new_blocks(2)
    (their_block,) = theirs.get_new_blocks(1)
    listed = [[used[0], their_block, mine.blocks[5]][i] for i in order] + [used[1]]
    before = snapshot(mine), snapshot(theirs)
    with pytest.raises(BlockNotInUseError):
        mine.free_blocks(listed)
    assert (snapshot(mine), snapshot(theirs)) == before


@pytest.mark.parametrize("events", [True, False])
def test_masked_range_needs_the_parent_hash_only_for_events(events: bool) -> None:
    """With nothing to store, ``cache_full_blocks`` still needs the parent's hash for the
    event, so a request too short for it is refused when (and only when) events are on."""
    req = _req()  # two hashes at block size 4
    pool = BlockPool(6, True, 2, enable_kv_cache_events=events)
    (blk,) = pool.get_new_blocks(1)
    listed = [pool.null_block] * 3 + [blk]
    state, _ = ACTIONS["get_new_blocks"](initial_state(6, True, 2, events_on=events), 1)
    for short in (_req(2), _req(0)):  # nothing stored, no event: no hash needed at all
        if not events:
            pool.cache_full_blocks(short, [blk], 0, 1, 4, 0, block_mask=[False])
            assert ACTIONS["cache_full_blocks"](state, short, [1], 0, 1, 4, 0, [False])[0] == state
    if events:
        with pytest.raises(InvalidArgumentError, match=r"^request has 2 block hashes, want 3$"):
            pool.cache_full_blocks(req, listed, 3, 4, 4, 0, block_mask=[False])
        with pytest.raises(InvalidArgumentError, match=r"^request has 2 block hashes, want 3$"):
            ACTIONS["cache_full_blocks"](state, req, [0, 0, 0, 1], 3, 4, 4, 0, [False])
    else:
        pool.cache_full_blocks(req, listed, 3, 4, 4, 0, block_mask=[False])
        assert blk.block_hash is None and pool.take_events() == []
        after, _ = ACTIONS["cache_full_blocks"](state, req, [0, 0, 0, 1], 3, 4, 4, 0, [False])
        assert after == state


@pytest.mark.parametrize("holder", [False, True])
def test_object_posing_as_a_block_of_another_pool_is_refused(holder: bool) -> None:
    """Refused by this pool, or (naming a holder too) by the pool it claims; nothing changes."""
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    (own,) = mine.get_new_blocks(1)
    poser: Any = types.SimpleNamespace(pool=theirs, **({"_holder": theirs} if holder else {}))
    with pytest.raises(UnknownBlockError, match=r"^free: not a KV-cache block: "):
        mine.free_blocks([own, block, poser])
    assert block.ref_cnt == 1 and theirs.get_num_free_blocks() == 2
    assert own.ref_cnt == 1 and mine.get_num_free_blocks() == 2


def _partial_pool() -> tuple[BlockPool, Request, Request]:
    pool = BlockPool(8, True, 2, enable_kv_cache_events=True)
    a = Request("a", list(range(16)), block_hasher=get_request_block_hasher(2))
    b = Request("b", list(range(100, 116)), block_hasher=get_request_block_hasher(2))
    return pool, a, b


@pytest.mark.parametrize("b_tokens", [2, 6])
def test_partial_entry_of_equal_or_shorter_prefix_is_added_once(b_tokens: int) -> None:
    pool, a, b = _partial_pool()
    (blk,) = pool.get_new_blocks(1)
    key_a = pool.cache_partial_block(a, blk, 6, 0, 8)
    key_b = pool.cache_partial_block(b, blk, b_tokens, 0, 8)
    assert pool.take_events() == [
        ev.BlockStored([maybe_convert_block_hash(a.block_hashes[2])],
                       maybe_convert_block_hash(a.block_hashes[1]), [4, 5], 2, None, "GPU", None,
                       extra_keys=[None], group_idx=0),
        ev.BlockStored([maybe_convert_block_hash(b.block_hashes[b_tokens // 2 - 1])],
                       maybe_convert_block_hash(b.block_hashes[b_tokens // 2 - 2]) if b_tokens > 2 else None,
                       b.all_token_ids[b_tokens - 2:b_tokens], 2, None, "GPU", None, extra_keys=[None],
                       group_idx=0),
    ]
    assert pool.cache_partial_block(b, blk, b_tokens, 0, 8) == key_b  # already there: nothing new
    assert pool.cache_partial_block(a, blk, 6, 0, 8) == key_a
    assert pool.take_events() == []
    assert pool.get_cached_block(a.block_hashes[2], [0]) == [blk]
    assert pool.get_cached_block(b.block_hashes[b_tokens // 2 - 1], [0]) == [blk]
    assert blk.block_hash == key_a and blk.block_hash_num_tokens == 6


def test_partial_entry_event_names_its_parent_chunk() -> None:
    pool, a, _ = _partial_pool()
    (blk,) = pool.get_new_blocks(1)
    pool.cache_partial_block(a, blk, 4, 0, 8)
    (stored,) = cast(list[Any], pool.take_events())
    assert stored.parent_block_hash == maybe_convert_block_hash(a.block_hashes[0])
    assert stored.block_hashes == [maybe_convert_block_hash(a.block_hashes[1])]


@pytest.mark.parametrize("group", [0, 1, 63, 64, 65, 1000, 2**31, 2**32 - 1, False, True])
def test_any_32_bit_group_id_keys_like_the_model(group: int) -> None:
    req = _req()
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    (blk,) = pool.get_new_blocks(1)
    hashes = resolve_block_hashes(req.block_hashes, 2, 4)
    pool.cache_full_blocks(req, [blk], 0, 1, 4, group)
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2, events_on=True), 1)
    state, _ = ACTIONS["cache_full_blocks"](state, req, [1], 0, 1, 4, group)
    primary = state.primary[1]
    assert primary is not None
    assert blk.block_hash == make_block_hash_with_group_id(hashes[0], group) == primary.key
    assert pool.get_cached_block(hashes[0], [group]) == [blk]
    assert QUERIES["get_cached_block"](state, hashes[0], [group]) == [1]
    key = pool.cache_partial_block(req, blk, 6, group, 8)
    state, model_key = ACTIONS["cache_partial_block"](state, req, 1, 6, group, 8)
    assert key == model_key == make_block_hash_with_group_id(req.block_hashes[2], group) == blk.block_hash
    # stored, removed (the block grew), stored
    assert [cast(Any, e).group_idx for e in pool.take_events()] == [group, group, group]


def test_block_constructor_keeps_vllms_fields() -> None:
    prev, nxt = KVCacheBlock(1), KVCacheBlock(3)
    block = KVCacheBlock(2, 5, b"key", 8, prev, nxt, True)
    assert (block.block_id, block.ref_cnt, block.block_hash, block.block_hash_num_tokens) == (2, 5, b"key", 8)
    assert block.prev_free_block is prev and block.next_free_block is nxt and block.is_null is True
    assert block.pool is None
    assert repr(block) == ("KVCacheBlock(block_id=2, ref_cnt=5, _block_hash=b'key', "
                           "_block_hash_num_tokens=8, prev_free_block=1, next_free_block=3)")


def test_free_queue_sentinels_are_block_minus_one_as_in_vllm() -> None:
    pool = BlockPool(4, True, 2)
    queue = pool.free_block_queue
    assert queue.fake_free_list_head.block_id == queue.fake_free_list_tail.block_id == -1
    assert "prev_free_block=-1" in repr(pool.blocks[1]) and "next_free_block=-1" in repr(pool.blocks[3])


def test_block_hash_conflict_names_the_block() -> None:
    pool = BlockPool(4, True, 2)
    block = pool.blocks[2]
    block.set_block_hash(b"k" * 8, 2)
    with pytest.raises(BlockHashConflictError, match="block 2 "):
        block.set_block_hash(b"j" * 8, 4)
    assert block.block_hash == b"k" * 8 and block.block_hash_num_tokens == 2


def test_freeing_a_shared_block_of_another_pool_keeps_its_other_references() -> None:
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    theirs.touch([block, block])  # three references
    mine.free_blocks([block])
    assert block.ref_cnt == 2 and theirs.get_num_free_blocks() == 2
    mine.free_blocks([block, block])
    assert block.ref_cnt == 0 and theirs.get_num_free_blocks() == 3


def test_over_freeing_a_block_of_another_pool_is_refused_and_named() -> None:
    mine, theirs = BlockPool(4, True, 2), BlockPool(4, True, 2)
    (block,) = theirs.get_new_blocks(1)
    with pytest.raises(ValueError, match=f"free block {block.block_id}: more releases"):
        mine.free_blocks([block, block])
    assert block.ref_cnt == 1


def test_block_of_no_pool_is_refused_and_named() -> None:
    pool = BlockPool(4, True, 2)
    stray = type(pool.blocks[1])(7)
    with pytest.raises(UnknownBlockError, match="belongs to no pool"):
        pool.free_blocks([stray])


def test_stored_event_extra_keys_are_per_block_keys() -> None:
    """``BlockStored.extra_keys`` has, per stored block, the LoRA, the multimodal items
    overlapping the block (offset from the block's start) and the salt on the first block."""
    spans = [(1, 2), (3, 6), (13, 1), (15, 4)]
    bs, n = 4, 5
    req = Request("x", list(range(n * bs)), lora_request=LoRARequest("ad", 1, "/p"), cache_salt="s",
                  mm_features=_features(spans), block_hasher=get_request_block_hasher(2))

    def want(i: int) -> tuple[Any, ...]:
        start, end = i * bs, (i + 1) * bs
        mm = tuple((f"item{k}", o - start) for k, (o, ln) in enumerate(spans) if o < end and o + ln > start)
        return ("ad", *mm, *(("s",) if i == 0 else ()))

    pool = BlockPool(8, True, 2, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(req, blocks, 0, 2, bs, 0)
    pool.cache_full_blocks(req, blocks, 2, n, bs, 0, block_mask=[True, False, True])
    pool.emit_cached_block_events(req, n, bs, 0)
    first, second, hits = cast(list[Any], pool.take_events())
    assert first.extra_keys == [want(0), want(1)]
    assert second.extra_keys == [want(2), want(4)]
    assert hits.extra_keys == [want(i) for i in range(n)]


def test_removing_a_sentinel_from_the_free_queue_is_refused() -> None:
    pool = BlockPool(4, True, 2)
    queue = pool.free_block_queue
    for sentinel in (queue.fake_free_list_head, queue.fake_free_list_tail):
        with pytest.raises(UnknownBlockError):
            queue.remove(sentinel)
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 2, 3]


def test_refused_touch_relinks_the_free_queue_both_ways() -> None:
    pool = BlockPool(8, True, 2)
    stranger = BlockPool(4, True, 2).blocks[1]
    b = pool.blocks
    with pytest.raises(UnknownBlockError):
        pool.touch([b[3], b[5], b[4], stranger])
    assert free_queue_link_errors(pool.free_block_queue) == []
    pool.touch([b[4]])  # unlinking uses both neighbours' links
    pool.touch([b[6]])
    pool.touch([b[3]])
    assert [x.block_id for x in pool.free_block_queue.get_all_free_blocks()] == [1, 2, 5, 7]
    assert free_queue_link_errors(pool.free_block_queue) == []


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
    with pytest.raises(error, match=pattern):
        getattr(pool, method)(*(_resolve(a, pool.blocks.__getitem__, reqs) for a in args))
    state, mreqs = _model_setup(caching)
    fn = ACTIONS.get(method) or QUERIES[method]
    with pytest.raises(error, match=pattern):
        fn(state, *(_resolve(a, int, mreqs) for a in args))


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
    with pytest.raises(UnknownBlockError, match=r"^block id (8|'x') is not in \[0, 8\)$"):
        ACTIONS[action](state, *args)
    with pytest.raises(UnknownBlockError, match=r"^block id 8 is not in \[0, 8\)$"):
        QUERIES["is_block_writable"](state, 8)


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
    assert list(state.events) == [event]
    assert event.token_ids == list(range(8)) and event.parent_block_hash is None and event.block_size == 4


def test_one_token_partial_entry_with_one_token_chunks() -> None:
    req = Request("o", [7, 8, 9], block_hasher=get_request_block_hasher(1))
    pool = BlockPool(4, True, 1)
    (blk,) = pool.get_new_blocks(1)
    key = pool.cache_partial_block(req, blk, 1, 0, 2)
    state, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 1), 1)
    state, model_key = ACTIONS["cache_partial_block"](state, req, 1, 1, 0, 2)
    assert key == model_key == make_block_hash_with_group_id(req.block_hashes[0], 0)
    assert state.index == {key: (1,)} and pool.get_cached_block(req.block_hashes[0], [0]) == [blk]


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
    assert list(state.events) == [event]
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
    assert list(state.events) == events
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


# ------------------------------------------------------------ the CI recipe


def _parse_yaml_subset(text: str) -> Any:
    """A parser for the block-style YAML subset GitHub workflows use here: mappings,
    sequences of scalars or mappings, ``|`` block scalars, quoted or plain scalars and
    ``#`` comments.  Raises ValueError on anything else (tabs, bad indentation, flow
    collections, duplicate keys)."""
    lines: list[tuple[int, str]] = []
    raw_lines = text.splitlines()
    i = 0
    block_scalars: dict[int, str] = {}
    while i < len(raw_lines):
        raw = raw_lines[i]
        if "\t" in raw:
            raise ValueError(f"line {i + 1}: tab")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        lines.append((indent, stripped))
        if stripped.endswith(": |") or stripped == "- |" or stripped.endswith(": |-"):
            body: list[str] = []
            i += 1
            while i < len(raw_lines) and (not raw_lines[i].strip()
                                          or len(raw_lines[i]) - len(raw_lines[i].lstrip(" ")) > indent):
                body.append(raw_lines[i])
                i += 1
            if not any(b.strip() for b in body):
                raise ValueError(f"line {i}: empty block scalar")
            cut = min(len(b) - len(b.lstrip(" ")) for b in body if b.strip())
            block_scalars[len(lines) - 1] = "\n".join(b[cut:] for b in body).rstrip("\n") + "\n"
            continue
        i += 1

    def scalar(token: str) -> Any:
        if token[:1] in "'\"":
            if len(token) < 2 or token[-1] != token[0]:
                raise ValueError(f"unterminated string {token!r}")
            return token[1:-1]
        if token[:1] in "[{&*!%@`":
            raise ValueError(f"unsupported scalar {token!r}")
        if token.lstrip("-").isdigit():
            return int(token)
        return {"true": True, "false": False, "null": None}.get(token, token)

    def split_key(item: str) -> tuple[str, str] | None:
        if item[:1] in "'\"":
            end = item.find(item[0], 1)
            if end < 0 or item[end + 1:end + 2] != ":":
                return None
            return item[1:end], item[end + 2:].strip()
        key, sep, rest = item.partition(": ")
        if not sep:
            if item.endswith(":"):
                return item[:-1], ""
            return None
        return key, rest.strip()

    def parse(pos: int, indent: int) -> tuple[Any, int]:
        if pos >= len(lines) or lines[pos][0] != indent:
            raise ValueError(f"expected a node at indent {indent}")
        if lines[pos][1].startswith("- ") or lines[pos][1] == "-":
            seq: list[Any] = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1][:1] == "-":
                item = lines[pos][1][1:].strip()
                if pos in block_scalars:
                    seq.append(block_scalars[pos])
                    pos += 1
                elif split_key(item) is not None:
                    # "- key: value" opens a mapping indented two further
                    lines[pos] = (indent + 2, item)
                    value, pos = parse(pos, indent + 2)
                    seq.append(value)
                else:
                    seq.append(scalar(item))
                    pos += 1
            return seq, pos
        mapping: dict[str, Any] = {}
        while pos < len(lines) and lines[pos][0] == indent:
            kv = split_key(lines[pos][1])
            if kv is None:
                raise ValueError(f"not a mapping entry: {lines[pos][1]!r}")
            key, rest = kv
            if key in mapping:
                raise ValueError(f"duplicate key {key!r}")
            if pos in block_scalars:
                mapping[key] = block_scalars[pos]
                pos += 1
            elif rest:
                mapping[key] = scalar(rest)
                pos += 1
            elif pos + 1 < len(lines) and lines[pos + 1][0] > indent:
                mapping[key], pos = parse(pos + 1, lines[pos + 1][0])
            elif pos + 1 < len(lines) and lines[pos + 1][0] == indent and lines[pos + 1][1][:1] == "-":
                mapping[key], pos = parse(pos + 1, indent)  # a sequence may sit at its key's indent
            else:
                mapping[key] = None
                pos += 1
        return mapping, pos

    if not lines:
        raise ValueError("empty document")
    doc, end = parse(0, lines[0][0])
    if end != len(lines):
        raise ValueError(f"unparsed from line {lines[end]!r}")
    return doc


def test_weekly_mutation_workflow_is_valid() -> None:
    text = (ROOT / ".github" / "workflows" / "mutation-weekly.yml").read_text()
    doc = _parse_yaml_subset(text)
    if importlib.util.find_spec("yaml") is not None:  # a real YAML parser agrees when installed
        yaml = importlib.import_module("yaml")  # untyped; only where installed
        loaded = yaml.safe_load(text)
        loaded["on"] = loaded.pop(True, loaded.get("on"))  # YAML 1.1 reads the key `on` as true
        assert loaded == doc
    assert isinstance(doc, dict) and doc["name"]
    crons = [entry["cron"] for entry in doc["on"]["schedule"]]
    assert crons and all(len(c.split()) == 5 for c in crons)
    job = doc["jobs"]["mutation"]
    assert isinstance(job["runs-on"], str) and int(job["timeout-minutes"]) > 0
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("bash benchmarks/mutation.sh all" in r for r in runs)
    assert any(step.get("uses", "").startswith("actions/checkout@") for step in job["steps"])


def test_yaml_subset_parser_rejects_broken_documents() -> None:
    assert _parse_yaml_subset("a:\n  b: 1\n  c:\n  - x\n  - y: 'z'\n    w: |\n      l1\n      l2\n") == {
        "a": {"b": 1, "c": ["x", {"y": "z", "w": "l1\nl2\n"}]}}
    for broken in ["a:\n\tb: 1\n", "a: 1\na: 2\n", "a:\n  b: 1\n c: 2\n", "a: 'x\n", "a: [1, 2]\n",
                   "just text\n"]:
        with pytest.raises(ValueError):
            _parse_yaml_subset(broken)


# ---------------------------------------------------------------- touch's inlined unlink


def _links(pool: BlockPool) -> list[tuple[int, Any, Any]]:
    """Every block's ref count and free-queue neighbours, by id (a full picture of the queue)."""
    return [(b.ref_cnt, getattr(b.prev_free_block, "block_id", b.prev_free_block),
             getattr(b.next_free_block, "block_id", b.next_free_block)) for b in pool.blocks]


def test_touch_unlinks_an_idle_block_completely() -> None:
    """A touched idle block leaves the queue with both links None, as vLLM's remove() leaves it."""
    pool = BlockPool(6, True, 1)
    block = pool.blocks[3]
    pool.touch([block])
    assert block.prev_free_block is None and block.next_free_block is None
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [1, 2, 4, 5]


def test_refused_touch_undoes_by_what_it_unlinked_not_by_ref_counts() -> None:
    """A block the caller took out of the queue by hand (idle, yet held) is not relinked on undo."""
    pool = BlockPool(8, True, 1)
    loose = pool.blocks[4]
    pool.free_block_queue.remove(loose)
    before, free_before = _links(pool), pool.get_num_free_blocks()
    with pytest.raises(UnknownBlockError, match=r"^touch: "):
        pool.touch([pool.blocks[2], loose, pool.blocks[6], pool.blocks[2], KVCacheBlock(3)])
    assert _links(pool) == before and pool.get_num_free_blocks() == free_before
    assert [b.ref_cnt for b in pool.blocks] == [0] * 8
    assert free_queue_link_errors(pool.free_block_queue) == []


@pytest.mark.parametrize("cut", ["both", "prev", "next"])
def test_touch_refuses_an_idle_block_missing_from_the_queue_and_changes_nothing(cut: str) -> None:
    """An idle block not (fully) linked into the queue is refused by name; earlier blocks are undone."""
    pool = BlockPool(8, True, 1)
    held = pool.get_new_blocks(1)[0]
    loose = pool.blocks[5]
    if cut == "both":
        loose.prev_free_block = loose.next_free_block = None
    elif cut == "prev":
        loose.prev_free_block = None
    else:
        loose.next_free_block = None
    before, free_before = _links(pool), pool.get_num_free_blocks()
    with pytest.raises(UnknownBlockError, match=r"^touch: block 5 is not in the free queue$"):
        pool.touch([held, pool.blocks[2], pool.blocks[3], loose, pool.blocks[4]])
    assert _links(pool) == before and pool.get_num_free_blocks() == free_before
