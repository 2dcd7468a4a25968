"""Events of ``kvpool.impl``: ``event_fields``/``from_fields``, switching the event classes
(``use_event_classes``, ``use_vllm_event_classes``), what the pool's stored events carry
(per-block extra keys, partial entries and their parents, the parent hash of a masked range),
the event classes' fields and how an event names a hash (its low 64 bits) and a group, and the
event classes as values in either build.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
import types
from typing import Any, cast

import pytest
from impl_helpers import LOW_64, TOKENS, cache_blocks, key, make_pool, make_request, removed, taken

from kvpool.impl import (
    MEDIUM_CPU,
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    LoRARequest,
    Request,
    get_request_block_hasher,
)
from kvpool.impl import events as ev
from kvpool.impl.errors import InvalidArgumentError
from kvpool.impl.events import event_fields
from kvpool.impl.hashing import generate_block_hash_extra_keys, to_event_extra_keys
from kvpool.impl.keys import maybe_convert_block_hash
from kvpool.impl.request import MultiModalFeature, PlaceholderRange
from kvpool.model import ACTIONS, Refusal, initial_state


def _req(n: int = 8) -> Request:
    return Request("q", list(range(n)), block_hasher=get_request_block_hasher(2))


def _features(spans: list[tuple[int, int]]) -> list[MultiModalFeature]:
    return [MultiModalFeature(f"item{i}", PlaceholderRange(offset=o, length=n))
            for i, (o, n) in enumerate(spans)]


# ------------------------------------------------------- event fields, event classes


def _pool_and_full_request() -> tuple[BlockPool, Request]:
    """A pool with events on, and a request whose stored events fill every optional field."""
    return BlockPool(6, True, 2, enable_kv_cache_events=True), Request(
        "r", list(range(8)), lora_request=LoRARequest("ad", 7, "/p"), cache_salt="s",
        session_id="sess", block_hasher=get_request_block_hasher(2))


def _all_event_kinds() -> list[Any]:
    pool, req = _pool_and_full_request()
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


def test_block_removed_builds_one_entrys_event_of_the_classes_in_use() -> None:
    """The one-entry builder benchmarks/event_cost.py times: kvpool's class, or the classes set."""
    own = ev.block_removed(b"k" * 8, "GPU", 3)
    assert type(own) is ev.BlockRemoved
    assert (own.block_hashes, own.medium, own.group_idx) == ([b"k" * 8], "GPU", 3)
    stored, removed, cleared = _fake_event_classes()
    previous = ev.use_event_classes(stored, removed, cleared)
    try:
        theirs = ev.block_removed(b"k" * 8, "CPU", 1)
    finally:
        ev.use_event_classes(*previous)
    assert type(theirs) is removed
    assert theirs.kw == {"block_hashes": [b"k" * 8], "medium": "CPU", "group_idx": 1}


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


# ------------------------------------------------------- what stored events carry


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
        with pytest.raises(Refusal, match=r"^request has 2 block hashes, want 3$"):
            ACTIONS["cache_full_blocks"](state, req, [0, 0, 0, 1], 3, 4, 4, 0, [False])
    else:
        pool.cache_full_blocks(req, listed, 3, 4, 4, 0, block_mask=[False])
        assert blk.block_hash is None and pool.take_events() == []
        after, _ = ACTIONS["cache_full_blocks"](state, req, [0, 0, 0, 1], 3, 4, 4, 0, [False])
        assert after == state


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


@pytest.mark.parametrize("lora", [None, LoRARequest("ad", 7, "/p")])
@pytest.mark.parametrize("salt", [None, "", "s"])
@pytest.mark.parametrize("indices", [[0, 1, 3], [2, 3], []])
def test_extra_keys_of_blocks_without_items_are_the_chunk_keys(
        lora: LoRARequest | None, salt: str | None, indices: list[int]) -> None:
    """Without multimodal items or prompt embeddings every block gets the same keys (the
    LoRA adapter) and the first chunk the salt too: what each chunk's own keys say."""
    req = Request("r", list(range(16)), lora_request=lora, cache_salt=salt)
    assert ev.extra_keys_of_blocks(req, indices, 4) == [
        generate_block_hash_extra_keys(req, 4 * i, 4 * (i + 1), 0)[0] for i in indices]


@pytest.mark.parametrize("salt", [None, "s"])
def test_extra_keys_of_blocks_with_prompt_embeddings_are_the_chunk_keys(salt: str | None) -> None:
    """With prompt embeddings (and no multimodal item) each block's keys name its own chunk's
    embeddings: the keys shared by every block would drop them."""
    req = Request("r", list(range(16)), prompt_embeds=bytes(range(16)), cache_salt=salt)
    got = ev.extra_keys_of_blocks(req, [0, 1, 3], 4)
    assert got == [generate_block_hash_extra_keys(req, 4 * i, 4 * (i + 1), 0)[0] for i in (0, 1, 3)]
    assert all(keys and any(k[0] == "prompt_embeds" for k in keys) for keys in got)


def test_event_extra_keys_of_blocks_sharing_keys_are_converted_for_each() -> None:
    lora = (("lora", "ad", "/p"), ("mm", "img", 2))
    salt = (("cache_salt", "s"),)
    given = [lora, lora, None, salt, lora, (("lora", "ad", "/p"),)]
    want = [("ad", ("img", 2)), ("ad", ("img", 2)), None, ("s",), ("ad", ("img", 2)), ("ad",)]
    assert to_event_extra_keys(given) == want
    assert to_event_extra_keys(iter(given)) == want == to_event_extra_keys(tuple(given))  # any iterable
    assert to_event_extra_keys(iter([])) is None


def test_other_event_classes_are_built_with_the_values_of_the_pools_own() -> None:
    """Inside vLLM a stored event is built by keyword from vLLM's class: every value the pool's
    own event carries, none left out (the four later fields keep the class's defaults)."""

    def events() -> list[Any]:
        pool, req = _pool_and_full_request()
        blocks = pool.get_new_blocks(3)
        pool.cache_full_blocks(req, blocks, 0, 1, 2, 3)
        pool.cache_full_blocks(req, blocks, 1, 3, 2, 3)  # with a parent
        return pool.take_events()

    own = events()
    previous = ev.use_event_classes(*_fake_event_classes())
    try:
        theirs = events()
    finally:
        ev.use_event_classes(*previous)
    defaults = ("kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership")
    want = [{f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name not in defaults}
            for e in own]
    assert [e.kw for e in theirs] == want
    assert len(want) == 2 and None not in want[1].values()  # the second has a parent: no value is None


# ------------------------------------------------------- events as values, in either build


def test_events_are_dataclasses_that_keep_what_they_are_given() -> None:
    """Compiled, the event classes are native classes with a compiled ``__init__``: still
    dataclasses, equal by value, pickled and copied, and keeping any value (a request's
    token sequence need not be a list), as the classes ``dataclass`` makes do."""
    stored = ev.BlockStored((1, 2), None, range(3), 4, None, "GPU", None, group_idx="g")
    gone = ev.BlockRemoved(block_hashes=[5], medium=None)
    for event in (stored, gone, ev.AllBlocksCleared()):
        assert dataclasses.is_dataclass(event) and dataclasses.replace(event) == event
        assert pickle.loads(pickle.dumps(event)) == event == copy.deepcopy(event)
    assert (stored.block_hashes, stored.token_ids, stored.group_idx, stored.session_id) == (
        (1, 2), range(3), "g", None)
    assert dataclasses.asdict(gone) == {
        "block_hashes": [5], "medium": None, "group_idx": None, "locality": None, "ownership": None}
    assert gone != ev.BlockRemoved([5], None, 0) and gone != ev.AllBlocksCleared()
    assert [f.name for f in dataclasses.fields(ev.BlockStored)] == [
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
        "locality", "ownership", "session_id"]
    for cls in (ev.BlockStored, ev.BlockRemoved):  # every field keeps its own argument
        given = {f.name: f"{f.name}!" for f in dataclasses.fields(cls)}
        assert dataclasses.asdict(cls(**given)) == given == dataclasses.asdict(cls(*given.values()))
    gone.group_idx = None  # a field can be set, as the seeded bugs of events do
    with pytest.raises(TypeError):
        ev.BlockRemoved([5])  # type: ignore[call-arg]


# ----------------------------------------------------------- event hashes and fields


def test_event_hashes_are_the_low_64_bits_as_int() -> None:
    high = bytes([0xFF] * 24 + [1, 2, 3, 4, 5, 6, 7, 8])
    assert maybe_convert_block_hash(high) == 0x0102030405060708
    pool = make_pool(4)
    req = make_request(TOKENS)
    cache_blocks(pool, req, 1)
    (event,) = pool.take_events()
    assert isinstance(event, BlockStored)
    (h,) = event.block_hashes
    assert isinstance(h, int) and 0 <= h <= LOW_64
    assert h == int.from_bytes(req.block_hashes[1], "big") & LOW_64


def test_event_classes_have_the_reference_fields_exactly() -> None:
    stored_event = BlockStored([1], None, [1, 2], 2, None, "GPU", None)
    assert list(event_fields(stored_event)) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"]
    assert event_fields(BlockRemoved([1], "GPU")) == {
        "type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": None,
        "locality": None, "ownership": None}
    assert event_fields(AllBlocksCleared()) == {"type": "AllBlocksCleared"}


def test_removed_event_names_hash_and_group_of_the_key() -> None:
    pool = make_pool(4, medium=MEDIUM_CPU)
    req = make_request(TOKENS)
    block = cache_blocks(pool, req, 1, group=9)[0]
    taken(pool)
    pool.evict_blocks({block.block_id})
    assert taken(pool) == [removed(key(req, 1, group=9), medium=MEDIUM_CPU)]
