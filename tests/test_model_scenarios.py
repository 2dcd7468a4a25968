"""Scenario tests pinning the model (``kvpool.model.OPERATIONS``) on vLLM 0.31.0's BlockPool.

Each test builds a small pool, applies actions one by one (checking every invariant after
each through :func:`step`) and asserts exact results, free-queue order, reference counts,
index contents and events.  Actions update a state in place: :func:`step` applies each to a
copy, so the state before a call stays comparable with the one after it.  What a call told
besides its result (reuse notices, metrics notices, its events) is that call's ``out``.
"ref L<n>" points into ``/work/shared/reference/vllm_block_pool.txt``.
"""

from __future__ import annotations

import gc
import hashlib
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import pytest
from impl_helpers import FakeTensor, FakeTorch

from kvpool.impl import BlockPool
from kvpool.impl import events as ev
from kvpool.impl.hashing import generate_block_hash_extra_keys, get_request_block_hasher
from kvpool.impl.keys import make_block_hash_with_group_id
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import (
    ACTIONS,
    INVARIANTS,
    NULL,
    OPERATIONS,
    QUERIES,
    Output,
    PoolState,
    Primary,
    initial_state,
    violated,
)
from kvpool.model import request as model_request
from kvpool.model.events import Cleared, Event, Removed, Stored
from kvpool.model.footprints import NOTHING, Footprint, changed_outside
from kvpool.model.invariants import Around
from kvpool.model.properties import broken_by, policy_queue
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import EMPTY, chunk_keys, untagged
from kvpool.model.state import Key, Queue, QueuedTwice
from kvpool.oracle.core.abstraction import model_event, pool_event
from kvpool.oracle.core.observe import snapshot
from kvpool.proofs import bmc

HBS = 4
"""Default hash block size, equal to the block size unless a test says otherwise."""

Step = tuple[PoolState, Any]

cache_full_blocks = ACTIONS["cache_full_blocks"]
cache_partial_block = ACTIONS["cache_partial_block"]
emit_cached_block_events = ACTIONS["emit_cached_block_events"]
evict_blocks = ACTIONS["evict_blocks"]
free_blocks = ACTIONS["free_blocks"]
get_new_blocks = ACTIONS["get_new_blocks"]
move_block_hashes = ACTIONS["move_block_hashes"]
reset_prefix_cache = ACTIONS["reset_prefix_cache"]
take_events = ACTIONS["take_events"]
touch = ACTIONS["touch"]
unpin_blocks = ACTIONS["unpin_blocks"]
get_cached_block = QUERIES["get_cached_block"]
get_num_free_blocks = QUERIES["get_num_free_blocks"]
get_usage = QUERIES["get_usage"]
is_block_writable = QUERIES["is_block_writable"]


# --------------------------------------------------------------------------
# Helpers.


def step(fn: Callable[..., Step], s: PoolState, *args: Any, **kwargs: Any) -> Step:
    """Apply one action to a copy of ``s`` (``s`` stays as it was) and check that the next
    state keeps every invariant; the action updates the copy in place and returns it."""
    work = s.copy()
    nxt, result = fn(work, *args, **kwargs)
    assert nxt is work
    assert violated(nxt) == []
    return nxt, result


def unchanged(nxt: PoolState, s: PoolState) -> bool:
    """``nxt`` is ``s``'s state and its call told nothing: no event, notice or metrics notice."""
    return nxt == s and nxt.out == Output()


def pool(num_blocks: int = 5, hbs: int = HBS, events: bool = True, caching: bool = True) -> PoolState:
    s = initial_state(num_blocks, caching, hbs, events)
    assert violated(s) == []
    return s


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def request(rid: str, token_ids: Sequence[int], hbs: int = HBS, **kwargs: Any) -> Request:
    """A request whose block hashes (at ``hbs`` granularity) are filled in."""
    return Request(rid, list(token_ids), block_hasher=get_request_block_hasher(hbs), **kwargs)


def key(block_hash: bytes, group: int = 0) -> Key:
    return block_hash, group


def removed(block_hash: bytes, group: int = 0) -> Removed:
    return Removed(block_hash, group, "GPU")


def stored(
    hashes: list[bytes],
    parent: bytes | None,
    token_ids: list[int],
    block_size: int,
    extra_keys: list[tuple[Any, ...] | None] | None,
    group: int = 0,
    lora_id: int | None = None,
    lora_name: str | None = None,
    session_id: str | None = None,
) -> Stored:
    return Stored(
        hashes=tuple(hashes), parent=parent, token_ids=tuple(token_ids), block_size=block_size,
        lora_id=lora_id, lora_name=lora_name,
        extra_keys=None if extra_keys is None else tuple(extra_keys),
        group=group, medium="GPU", session_id=session_id)


def drain(s: PoolState) -> tuple[PoolState, list[Event]]:
    return step(take_events, s)


def allocate_and_cache(
    s: PoolState, req: Request, num_blocks: int, block_size: int = HBS, group: int = 0
) -> tuple[PoolState, list[int]]:
    """Allocate ``num_blocks`` blocks for ``req`` and cache them all as full blocks."""
    s, ids = step(get_new_blocks, s, num_blocks)
    s, _ = step(cache_full_blocks, s, req, ids, 0, num_blocks, block_size, group)
    return s, ids


def free_request(s: PoolState, ids: Sequence[int]) -> PoolState:
    """Free a request's blocks tail first, as vLLM's KVCacheManager does."""
    s, _ = step(free_blocks, s, list(reversed(ids)))
    return s


def make_watcher() -> Callable[[Any], None]:
    """A fresh reuse callback; the model stores and reports it by identity."""

    def on_reuse(block: Any) -> None:
        del block

    return on_reuse


def assert_refused(kind: RefusalKind, fn: Callable[..., Any], s: PoolState, *args: Any) -> str:
    """``fn(s, *args)`` is refused for ``kind`` and leaves ``s`` exactly as it was."""
    before = s.copy()
    with pytest.raises(Refusal) as info:
        fn(s, *args)
    assert info.value.kind is kind
    assert s == before
    return str(info.value)


# --------------------------------------------------------------------------
# 1. Eviction order (ref L778-808 free_blocks, L669-703 get_new_blocks).


def test_fresh_free_queue_holds_every_real_block_in_id_order() -> None:
    s = pool(5)
    assert s.free == (1, 2, 3, 4)
    assert s.ref == [0, 0, 0, 0, 0]


def test_get_new_blocks_takes_from_the_head() -> None:
    s, ids = step(get_new_blocks, pool(5), 2)
    assert ids == [1, 2]
    assert s.free == (3, 4)
    assert s.ref == [0, 1, 1, 0, 0]


def test_freed_unhashed_blocks_go_to_the_head_in_the_given_order() -> None:
    s, _ = step(get_new_blocks, pool(6), 3)
    s, _ = step(free_blocks, s, [3, 1])
    assert s.free == (3, 1, 4, 5)
    s, ids = step(get_new_blocks, s, 1)
    assert ids == [3]


def test_freed_hashed_blocks_go_to_the_tail() -> None:
    s, ids = allocate_and_cache(pool(5), request("r", tokens(8)), 2)
    s, _ = step(free_blocks, s, ids)
    assert s.free == (3, 4, 1, 2)


def test_freeing_a_request_in_reverse_evicts_its_tail_block_first() -> None:
    s, _ = step(get_new_blocks, pool(5), 3)
    s, _ = step(cache_full_blocks, s, request("r", tokens(8)), [1, 2, 3], 0, 2, HBS, 0)
    s = free_request(s, [1, 2, 3])
    assert s.free == (3, 4, 2, 1)  # unhashed 3 at the head, chain tail 2 before its parent 1
    s, ids = step(get_new_blocks, s, 3)
    assert ids == [3, 4, 2]
    assert s.primary[2] is None and s.primary[1] is not None


def test_block_listed_twice_drops_two_references_and_rejoins_at_its_last_listing() -> None:
    s, _ = step(get_new_blocks, pool(5), 2)
    s, _ = step(touch, s, [1])
    s, _ = step(free_blocks, s, [1, 2, 1])
    assert s.ref[1:3] == [0, 0]
    assert s.free == (2, 1, 3, 4)


# --------------------------------------------------------------------------
# 2. Duplicates under one hash (ref L35-133 BlockHashToBlockMap, L198-224).


def two_requests_with_one_prefix() -> tuple[PoolState, list[bytes]]:
    """r1 cached in blocks 1, 2 and r2 (same tokens) in blocks 3, 4; events drained."""
    r1, r2 = request("r1", tokens(8)), request("r2", tokens(8))
    s, _ = allocate_and_cache(pool(5), r1, 2)
    s, _ = allocate_and_cache(s, r2, 2)
    s, _ = drain(s)
    assert r1.block_hashes == r2.block_hashes
    return s, r1.block_hashes


def test_same_prefix_in_two_requests_indexes_both_blocks_in_insertion_order() -> None:
    s, bh = two_requests_with_one_prefix()
    assert dict(s.index) == {key(bh[0]): (1, 3), key(bh[1]): (2, 4)}
    assert s.primary[3] == Primary(key(bh[0]), 4)


def test_get_cached_block_returns_the_first_duplicate() -> None:
    s, bh = two_requests_with_one_prefix()
    assert get_cached_block(s, bh[0], [0]) == [1]
    assert get_cached_block(s, bh[1], [0]) == [2]


def test_reallocating_one_duplicate_removes_only_that_copy() -> None:
    s, bh = two_requests_with_one_prefix()
    s = free_request(s, [1, 2])
    assert s.free == (2, 1)
    s, ids = step(get_new_blocks, s, 1)
    assert ids == [2]
    assert dict(s.index) == {key(bh[0]): (1, 3), key(bh[1]): (4,)}
    assert s.events == [removed(bh[1])]


def test_evicting_the_first_duplicate_serves_the_second() -> None:
    s, bh = two_requests_with_one_prefix()
    s, _ = step(evict_blocks, s, [1])
    assert get_cached_block(s, bh[0], [0]) == [3]
    assert s.events == [removed(bh[0])]


# --------------------------------------------------------------------------
# 3. Lazy hash removal (ref L732-753 _maybe_evict_cached_block, L755-771 touch).


def one_cached_then_freed_block() -> tuple[PoolState, bytes]:
    """Pool of 4 whose block 1 holds a cached 1-block request, freed; events drained."""
    r = request("r", tokens(4))
    s, ids = allocate_and_cache(pool(4), r, 1)
    s = free_request(s, ids)
    s, _ = drain(s)
    return s, r.block_hashes[0]


def test_freed_cached_block_keeps_its_hash_and_still_hits() -> None:
    s, h = one_cached_then_freed_block()
    assert s.free == (2, 3, 1)
    assert s.primary[1] == Primary(key(h), 4)
    assert get_cached_block(s, h, [0]) == [1]


def test_touching_a_freed_cached_block_takes_it_out_of_the_free_queue() -> None:
    s, _h = one_cached_then_freed_block()
    s, _ = step(touch, s, [1])
    assert s.ref[1] == 1
    assert s.free == (2, 3)


def test_hash_is_dropped_only_when_the_block_is_handed_out_again() -> None:
    s, h = one_cached_then_freed_block()
    s, ids = step(get_new_blocks, s, 2)
    assert ids == [2, 3]
    assert s.events == []
    assert dict(s.index) == {key(h): (1,)}
    s, ids = step(get_new_blocks, s, 1)
    assert ids == [1]
    assert s.events == [removed(h)]
    assert dict(s.index) == {}
    assert s.primary[1] is None


def test_evicting_a_block_in_use_drops_its_hash_but_keeps_its_reference() -> None:
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(4), r, 1)
    s, _ = drain(s)
    s, _ = step(evict_blocks, s, [1])
    assert s.ref[1] == 1
    assert s.free == (2, 3)
    assert dict(s.index) == {}
    assert s.events == [removed(r.block_hashes[0])]


def test_evicting_an_idle_block_keeps_its_place_in_the_free_queue() -> None:
    s, h = one_cached_then_freed_block()
    s, _ = step(evict_blocks, s, [1])
    assert s.free == (2, 3, 1)
    assert s.primary[1] is None
    assert s.events == [removed(h)]


# --------------------------------------------------------------------------
# 4. Partial entries (ref L449-591 cache_partial_block, L286-299 promotion).


def block_with_partial_entries(*boundaries: int, hbs: int = 2) -> tuple[PoolState, Request]:
    """Pool of 3, hbs 2, block size 8: block 1 holds r's partial entries at ``boundaries``."""
    r = request("r", tokens(8), hbs=hbs)
    s, _ = step(get_new_blocks, pool(3, hbs=hbs), 1)
    for num_tokens in boundaries:
        s, _ = step(cache_partial_block, s, r, 1, num_tokens, 0, 8)
    s, _ = drain(s)
    return s, r


def test_partial_entry_makes_a_block_reachable_inside_it() -> None:
    r = request("r", tokens(6), hbs=2)
    s, ids = step(get_new_blocks, pool(4, hbs=2), 2)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 1, 4, 0)
    s, _ = drain(s)
    bh = r.block_hashes
    s, result = step(cache_partial_block, s, r, 2, 6, 0, 4)
    assert result == key(bh[2])
    assert s.primary[2] == Primary(key(bh[2]), 6)
    assert dict(s.index) == {key(bh[1]): (1,), key(bh[2]): (2,)}
    assert get_cached_block(s, bh[2], [0]) == [2]
    assert s.events == [stored([bh[2]], bh[1], [104, 105], 2, [None])]


def test_first_chunk_partial_entry_has_no_parent() -> None:
    s, r = block_with_partial_entries()
    s, _ = step(cache_partial_block, s, r, 1, 2, 0, 8)
    assert s.events == [stored([r.block_hashes[0]], None, [100, 101], 2, [None])]


def test_partial_entry_over_a_longer_prefix_replaces_the_shorter_entry() -> None:
    s, r = block_with_partial_entries(2)
    bh = r.block_hashes
    s, _ = step(cache_partial_block, s, r, 1, 4, 0, 8)
    assert s.primary[1] == Primary(key(bh[1]), 4)
    assert s.secondary[1] == ()
    assert dict(s.index) == {key(bh[1]): (1,)}
    assert s.events == [removed(bh[0]), stored([bh[1]], bh[0], [102, 103], 2, [None])]


def test_partial_entry_over_a_shorter_prefix_becomes_secondary() -> None:
    s, r = block_with_partial_entries(4)
    bh = r.block_hashes
    s, _ = step(cache_partial_block, s, r, 1, 2, 0, 8)
    assert s.primary[1] == Primary(key(bh[1]), 4)
    assert s.secondary[1] == (key(bh[0]),)
    assert dict(s.index) == {key(bh[1]): (1,), key(bh[0]): (1,)}
    assert s.events == [stored([bh[0]], None, [100, 101], 2, [None])]


@pytest.mark.parametrize("num_tokens", [4, 2], ids=["primary", "secondary"])
def test_repeating_a_partial_entry_changes_nothing_and_emits_nothing(num_tokens: int) -> None:
    s, r = block_with_partial_entries(4, 2)
    nxt, result = step(cache_partial_block, s, r, 1, num_tokens, 0, 8)
    assert result == key(r.block_hashes[num_tokens // 2 - 1])
    assert unchanged(nxt, s)
    assert nxt.events == []


def test_promotion_to_a_full_block_removes_every_partial_entry() -> None:
    s, r = block_with_partial_entries(4, 2)
    bh = r.block_hashes
    s, _ = step(cache_full_blocks, s, r, [1], 0, 1, 8, 0)
    assert s.primary[1] == Primary(key(bh[3]), 8)
    assert s.secondary[1] == ()
    assert dict(s.index) == {key(bh[3]): (1,)}
    assert s.events == [removed(bh[1]), removed(bh[0]), stored([bh[3]], None, tokens(8), 8, [None])]


def test_replace_existing_hashes_drops_every_entry_first() -> None:
    s, r = block_with_partial_entries(4, 2)
    other = request("other", tokens(4, start=200), hbs=2)
    s, result = step(cache_partial_block, s, other, 1, 2, 0, 8, True)
    oh = other.block_hashes
    assert result == key(oh[0])
    assert s.primary[1] == Primary(key(oh[0]), 2)
    assert dict(s.index) == {key(oh[0]): (1,)}
    assert s.events == [
        removed(r.block_hashes[1]),
        removed(r.block_hashes[0]),
        stored([oh[0]], None, [200, 201], 2, [None]),
    ]


@pytest.mark.parametrize(
    ("num_tokens", "block_size"),
    [(3, 8), (-2, 8), (0, 8), (6, 8), (8, 8), (2, 2), (2, 5)],
    ids=["not-a-chunk-multiple", "negative", "zero", "beyond-request-hashes", "block-end",
         "block-size-is-hbs", "block-size-not-a-multiple"],
)
def test_partial_entry_misuse_is_refused(num_tokens: int, block_size: int) -> None:
    s, _ = step(get_new_blocks, pool(3, hbs=2), 1)
    r = request("r", tokens(4), hbs=2)
    assert_refused(RefusalKind.INVALID_ARGUMENT, cache_partial_block, s, r, 1, num_tokens, 0, block_size)


def test_partial_entry_on_the_null_block_returns_none_and_changes_nothing() -> None:
    s = pool(3, hbs=2)
    nxt, result = step(cache_partial_block, s, request("r", tokens(4), hbs=2), NULL, 2, 0, 8)
    assert result is None
    assert unchanged(nxt, s)


# --------------------------------------------------------------------------
# 5. move_block_hashes (ref L651-667).


def test_move_block_hashes_repoints_every_entry_without_events() -> None:
    s, r = block_with_partial_entries(4, 2)
    bh = r.block_hashes
    s, ids = step(get_new_blocks, s, 1)
    assert ids == [2]
    s, _ = step(move_block_hashes, s, 1, 2)
    assert s.primary[2] == Primary(key(bh[1]), 4)
    assert s.secondary[2] == (key(bh[0]),)
    assert s.primary[1] is None and s.secondary[1] == ()
    assert dict(s.index) == {key(bh[1]): (2,), key(bh[0]): (2,)}
    assert s.events == []
    assert is_block_writable(s, 1)


def test_move_onto_a_hashed_block_is_refused() -> None:
    s, r = block_with_partial_entries(4)
    s, _ = step(get_new_blocks, s, 1)
    s, _ = step(cache_partial_block, s, r, 2, 2, 0, 8)
    assert_refused(RefusalKind.HASH_CONFLICT, move_block_hashes, s, 1, 2)


def test_move_onto_the_null_block_is_refused() -> None:
    s, _ = block_with_partial_entries(4)
    assert_refused(RefusalKind.NULL_BLOCK, move_block_hashes, s, 1, NULL)


# --------------------------------------------------------------------------
# 6. Reuse watchers (ref L705-730 unpin_blocks, L686-687, L852-855).


def test_unpin_releases_idle_blocks_to_the_tail_and_registers_the_watcher() -> None:
    w = make_watcher()
    s, _ = step(get_new_blocks, pool(5), 3)
    assert s.out.fired == []
    s, _ = step(unpin_blocks, s, [1, 2], w)
    assert s.ref[1:4] == [0, 0, 1]
    assert s.free == (4, 1, 2)
    assert dict(s.watchers) == {1: w, 2: w}
    assert s.out.fired == []


def test_unpin_of_a_shared_block_keeps_it_in_use_but_registers_the_watcher() -> None:
    w = make_watcher()
    s, _ = step(get_new_blocks, pool(4), 1)
    s, _ = step(touch, s, [1])
    s, _ = step(unpin_blocks, s, [1], w)
    assert s.ref[1] == 1
    assert s.free == (2, 3)
    assert dict(s.watchers) == {1: w}


def test_handing_out_an_unpinned_block_fires_its_watcher_once() -> None:
    w = make_watcher()
    s, _ = step(get_new_blocks, pool(5), 3)
    s, _ = step(unpin_blocks, s, [1, 2], w)
    s, ids = step(get_new_blocks, s, 2)
    assert ids == [4, 1]
    assert s.out.fired == [(w, 1)]
    assert dict(s.watchers) == {2: w}
    s, _ = step(free_blocks, s, [1])
    assert s.out.fired == []
    s, ids = step(get_new_blocks, s, 1)
    assert ids == [1]
    assert s.out.fired == []  # fired once: handing block 1 out again tells nobody


def test_reset_fires_remaining_watchers_in_registration_order() -> None:
    w1, w2 = make_watcher(), make_watcher()
    s, _ = step(get_new_blocks, pool(4), 3)
    s, _ = step(unpin_blocks, s, [3], w2)
    assert s.out.fired == []
    s, _ = step(unpin_blocks, s, [1], w1)
    assert s.out.fired == []
    s, _ = step(free_blocks, s, [2])
    assert s.out.fired == []
    s, ok = step(reset_prefix_cache, s)
    assert ok is True
    assert s.out.fired == [(w2, 3), (w1, 1)]
    assert dict(s.watchers) == {}


def test_reregistering_a_watcher_replaces_it_in_its_first_place() -> None:
    w1, w2, w3 = make_watcher(), make_watcher(), make_watcher()
    s, _ = step(get_new_blocks, pool(4), 2)
    s, _ = step(touch, s, [1])
    s, _ = step(unpin_blocks, s, [1], w1)
    s, _ = step(unpin_blocks, s, [2], w2)
    s, _ = step(unpin_blocks, s, [1], w3)
    assert list(s.watchers.items()) == [(1, w3), (2, w2)]
    assert s.out.fired == []  # the replaced watcher w1 is not told
    s, ok = step(reset_prefix_cache, s)
    assert ok is True
    assert s.out.fired == [(w3, 1), (w2, 2)]


def test_unpinning_the_null_block_is_refused() -> None:
    s, _ = step(touch, pool(3), [NULL])
    assert_refused(RefusalKind.NULL_BLOCK, unpin_blocks, s, [NULL], make_watcher())


def test_unpinned_hashed_block_keeps_its_hash_and_stays_hittable() -> None:
    w = make_watcher()
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(4), r, 1)
    s, _ = drain(s)
    s, _ = step(unpin_blocks, s, [1], w)
    h = r.block_hashes[0]
    assert s.free == (2, 3, 1)
    assert s.primary[1] == Primary(key(h), 4)
    assert get_cached_block(s, h, [0]) == [1]
    s, _ = step(touch, s, [1])
    assert s.ref[1] == 1
    assert dict(s.watchers) == {1: w}
    assert s.events == []


# --------------------------------------------------------------------------
# 7. reset_prefix_cache (ref L830-869).


def test_reset_is_refused_while_a_real_block_is_in_use() -> None:
    s, _ = allocate_and_cache(pool(4), request("r", tokens(4)), 1)
    s, _ = drain(s)
    nxt, ok = step(reset_prefix_cache, s)
    assert ok is False
    assert unchanged(nxt, s)
    assert nxt.events == []


def test_reset_clears_every_hash_and_emits_all_blocks_cleared() -> None:
    r = request("r", tokens(8))
    s, ids = allocate_and_cache(pool(4), r, 2)
    s = free_request(s, ids)
    s, _ = drain(s)
    s, ok = step(reset_prefix_cache, s)
    assert ok is True
    assert dict(s.index) == {}
    assert s.primary == [None] * 4
    assert s.secondary == [()] * 4
    assert s.free == (3, 2, 1)
    assert s.events == [Cleared()]
    assert get_cached_block(s, r.block_hashes[0], [0]) is None


# --------------------------------------------------------------------------
# 8. Events (ref L226-344 cache_full_blocks, L346-447, L893-904).


def test_events_off_never_records_events() -> None:
    r = request("r", tokens(8))
    s, ids = allocate_and_cache(pool(4, events=False), r, 2)
    actions: list[tuple[Callable[..., Step], tuple[Any, ...]]] = [
        (emit_cached_block_events, (r, 2, HBS, 0)),
        (evict_blocks, ([2],)),
        (free_blocks, (list(reversed(ids)),)),
        (get_new_blocks, (3,)),
        (free_blocks, ([1, 2, 3],)),
        (reset_prefix_cache, ()),
    ]
    assert s.events == []
    for fn, args in actions:
        s, _ = step(fn, s, *args)
        assert s.events == [] and s.out.events == []
    s, taken = step(take_events, s)
    assert taken == []


def test_take_events_hands_over_the_log_and_clears_it() -> None:
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(3), r, 1)
    s, taken = step(take_events, s)
    assert taken == [stored([r.block_hashes[0]], None, tokens(4), 4, [None])]
    assert s.events == []
    _, taken = step(take_events, s)
    assert taken == []


def test_cache_full_blocks_emits_one_block_stored_for_the_range() -> None:
    r = request("r", tokens(8))
    s, ids = step(get_new_blocks, pool(4), 2)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 2, HBS, 0)
    bh = r.block_hashes
    assert s.events == [stored([bh[0], bh[1]], None, tokens(8), 4, [None, None])]


def test_cache_full_blocks_parent_is_the_last_already_cached_block() -> None:
    r = request("r", tokens(12))
    s, ids = step(get_new_blocks, pool(4), 3)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 2, HBS, 0)
    s, _ = drain(s)
    s, _ = step(cache_full_blocks, s, r, ids, 2, 3, HBS, 0)
    bh = r.block_hashes
    assert s.events == [stored([bh[2]], bh[1], tokens(4, start=108), 4, [None])]


def test_cache_full_blocks_parent_uses_block_size_granularity() -> None:
    r = request("r", tokens(8), hbs=2)
    s, ids = step(get_new_blocks, pool(4, hbs=2), 2)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 1, 4, 0)
    s, _ = drain(s)
    s, _ = step(cache_full_blocks, s, r, ids, 1, 2, 4, 0)
    bh = r.block_hashes
    assert dict(s.index) == {key(bh[1]): (1,), key(bh[3]): (2,)}
    assert s.events == [stored([bh[3]], bh[1], [104, 105, 106, 107], 4, [None])]


@pytest.mark.parametrize(
    ("features", "extra_keys", "lora_id", "lora_name", "session_id"),
    [
        ({"lora_request": LoRARequest("adapter", 7, "/adapters/a")},
         [("adapter",), ("adapter",)], 7, "adapter", None),
        ({"mm_features": [MultiModalFeature("img", PlaceholderRange(offset=2, length=4))]},
         [(("img", 2),), (("img", -2),)], None, None, None),
        ({"cache_salt": "salt"}, [("salt",), None], None, None, None),
        ({"session_id": "sess"}, [None, None], None, None, "sess"),
    ],
    ids=["lora", "multimodal", "cache-salt-on-first-block", "session"],
)
def test_block_stored_carries_request_metadata_per_block(
    features: dict[str, Any],
    extra_keys: list[tuple[Any, ...] | None],
    lora_id: int | None,
    lora_name: str | None,
    session_id: str | None,
) -> None:
    r = request("r", tokens(8), **features)
    s, _ = allocate_and_cache(pool(4), r, 2)
    bh = r.block_hashes
    assert s.events == [
        stored([bh[0], bh[1]], None, tokens(8), 4, extra_keys,
               lora_id=lora_id, lora_name=lora_name, session_id=session_id),
    ]


def test_block_stored_reports_the_kv_cache_group() -> None:
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(3), r, 1, group=3)
    h = r.block_hashes[0]
    assert dict(s.index) == {key(h, 3): (1,)}
    assert s.events == [stored([h], None, tokens(4), 4, [None], group=3)]


def test_block_mask_skips_masked_blocks_in_index_and_event() -> None:
    features = [
        MultiModalFeature("A", PlaceholderRange(offset=0, length=2)),
        MultiModalFeature("B", PlaceholderRange(offset=8, length=2)),
    ]
    r = request("r", tokens(12), mm_features=features)
    s, ids = step(get_new_blocks, pool(4), 3)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 3, HBS, 0, [True, False, True])
    bh = r.block_hashes
    assert dict(s.index) == {key(bh[0]): (1,), key(bh[2]): (3,)}
    assert s.primary[2] is None
    assert s.events == [
        stored([bh[0], bh[2]], None, tokens(12), 4, [(("A", 0),), (("B", 0),)]),
    ]


def test_null_blocks_are_skipped_in_index_and_event() -> None:
    r = request("r", tokens(12))
    s, ids = step(get_new_blocks, pool(4), 2)
    s, _ = step(cache_full_blocks, s, r, [NULL, *ids], 0, 3, HBS, 0)
    bh = r.block_hashes
    assert dict(s.index) == {key(bh[1]): (1,), key(bh[2]): (2,)}
    assert s.events == [stored([bh[1], bh[2]], None, tokens(12), 4, [None, None])]


def test_fully_masked_range_still_emits_an_empty_block_stored() -> None:
    r = request("r", tokens(8))
    s, ids = step(get_new_blocks, pool(4), 2)
    s, _ = step(cache_full_blocks, s, r, ids, 0, 2, HBS, 0, [False, False])
    assert dict(s.index) == {}
    assert s.events == [stored([], None, tokens(8), 4, None)]


def test_emit_cached_block_events_announces_hits_without_changing_the_pool() -> None:
    s, bh = two_requests_with_one_prefix()
    hit = request("hit", tokens(8), session_id="s2")
    nxt, _ = step(emit_cached_block_events, s, hit, 2, HBS, 0)
    assert nxt.events == [
        stored([bh[0], bh[1]], None, tokens(8), 4, [None, None], session_id="s2"),
    ]
    assert nxt.out == Output(events=nxt.events)  # its events are the pending ones (s was drained)
    assert replace(nxt, events=[]) == s


@pytest.mark.parametrize(("events", "num_cached"), [(False, 1), (True, 0)], ids=["events-off", "no-hits"])
def test_emit_cached_block_events_is_silent_without_events_or_hits(events: bool, num_cached: int) -> None:
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(3, events=events), r, 1)
    s, _ = drain(s)
    nxt, _ = step(emit_cached_block_events, s, r, num_cached, HBS, 0)
    assert unchanged(nxt, s)


# --------------------------------------------------------------------------
# 9. Refusals leave the state unchanged.


def pool_with_cached_request() -> tuple[PoolState, Request]:
    """Pool of 4: blocks 1, 2 hold r's two cached blocks (ref 1 each); block 3 is free."""
    r = request("r", tokens(8))
    s, _ = allocate_and_cache(pool(4), r, 2)
    s, _ = drain(s)
    return s, r


FRESH = request("fresh", tokens(4, start=500))
SHORT = request("short", tokens(3))
W = make_watcher()

# vLLM asserts or raises on most of these, mid-mutation.  A few it accepts silently and the
# model hardens: over-/idle frees drive ref_cnt negative (ref L794), id -1 picks the last
# block (L827), get_new_blocks(-1) inflates the free count (kv_cache_utils L350),
# a negative emit count emits nothing (L407).
def test_cache_full_blocks_with_more_cached_than_full_does_nothing() -> None:
    # As vLLM (L261-262): its sparse-attention coordinator may ask for fewer ready blocks.
    s = initial_state(4, True, HBS, True)
    nxt, _ = step(cache_full_blocks, s, FRESH, [3], 1, 0, HBS, 0)
    assert unchanged(nxt, s)


REFUSALS: list[tuple[str, RefusalKind, Callable[[PoolState, Request], Any]]] = [
    ("over-free-in-one-call", RefusalKind.NOT_IN_USE, lambda s, r: free_blocks(s, [1, 1])),
    ("free-of-an-idle-block", RefusalKind.NOT_IN_USE, lambda s, r: free_blocks(s, [3])),
    ("over-unpin-in-one-call", RefusalKind.NOT_IN_USE, lambda s, r: unpin_blocks(s, [2, 2], W)),
    ("free-unknown-negative", RefusalKind.UNKNOWN_BLOCK, lambda s, r: free_blocks(s, [-1])),
    ("free-unknown-past-end", RefusalKind.UNKNOWN_BLOCK, lambda s, r: free_blocks(s, [4])),
    ("touch-unknown", RefusalKind.UNKNOWN_BLOCK, lambda s, r: touch(s, [4])),
    ("evict-unknown-negative", RefusalKind.UNKNOWN_BLOCK, lambda s, r: evict_blocks(s, [-1])),
    ("evict-unknown-past-end", RefusalKind.UNKNOWN_BLOCK, lambda s, r: evict_blocks(s, [4])),
    ("unpin-unknown", RefusalKind.UNKNOWN_BLOCK, lambda s, r: unpin_blocks(s, [4], W)),
    ("move-unknown", RefusalKind.UNKNOWN_BLOCK, lambda s, r: move_block_hashes(s, 1, 4)),
    ("writable-unknown", RefusalKind.UNKNOWN_BLOCK, lambda s, r: is_block_writable(s, -1)),
    ("more-blocks-than-free", RefusalKind.NOT_ENOUGH_FREE_BLOCKS, lambda s, r: get_new_blocks(s, 2)),
    ("negative-get-count", RefusalKind.INVALID_ARGUMENT, lambda s, r: get_new_blocks(s, -1)),
    ("negative-num-cached", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: cache_full_blocks(s, FRESH, [3], -1, 1, HBS, 0)),
    ("negative-emit-count", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: emit_cached_block_events(s, r, -1, HBS, 0)),
    ("mask-length", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: cache_full_blocks(s, FRESH, [3], 0, 1, HBS, 0, [True, False])),
    ("too-few-request-hashes", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: cache_full_blocks(s, SHORT, [3], 0, 1, HBS, 0)),
    ("group-id-too-large", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: cache_full_blocks(s, FRESH, [3], 0, 1, HBS, 2**32)),
    ("group-id-negative", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: cache_full_blocks(s, FRESH, [3], 0, 1, HBS, -1)),
    ("lookup-group-id-too-large", RefusalKind.INVALID_ARGUMENT,
     lambda s, r: get_cached_block(s, r.block_hashes[0], [2**32])),
    ("already-cached-at-this-length", RefusalKind.HASH_CONFLICT,
     lambda s, r: cache_full_blocks(s, r, [1, 2], 0, 2, HBS, 0)),
]


@pytest.mark.parametrize(("kind", "call"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refused_call_leaves_the_state_unchanged(
    kind: RefusalKind, call: Callable[[PoolState, Request], Any]
) -> None:
    s, r = pool_with_cached_request()
    assert_refused(kind, call, s, r)


def test_double_free_is_refused() -> None:
    s, _ = step(get_new_blocks, pool(3), 1)
    s, _ = step(free_blocks, s, [1])
    assert_refused(RefusalKind.NOT_IN_USE, free_blocks, s, [1])


def test_not_enough_free_blocks_carries_the_reference_message() -> None:
    message = assert_refused(RefusalKind.NOT_ENOUGH_FREE_BLOCKS, get_new_blocks, pool(4), 4)
    assert message == "Cannot get 4 free blocks from the pool"


def test_caching_on_a_pool_without_caching_is_refused() -> None:
    s, _ = step(get_new_blocks, pool(3, hbs=2, caching=False), 1)
    r = request("r", tokens(4), hbs=2)
    assert_refused(RefusalKind.CACHING_DISABLED, cache_full_blocks, s, r, [1], 0, 1, 4, 0)
    assert_refused(RefusalKind.CACHING_DISABLED, cache_partial_block, s, r, 1, 2, 0, 4)


# --------------------------------------------------------------------------
# 10. The null block (ref L184-188, L764-769, L794-795, L810-828).


def test_touch_and_free_of_the_null_block_move_only_its_counter() -> None:
    s0 = pool(3)
    s, _ = step(touch, s0, [NULL])
    assert s.ref[NULL] == 1
    assert s.free == s0.free
    s, _ = step(free_blocks, s, [NULL])
    s, _ = step(free_blocks, s, [NULL])
    assert s.ref[NULL] == -1
    assert s.free == s0.free


def test_null_block_is_never_handed_out() -> None:
    s, ids = step(get_new_blocks, pool(4), 3)
    assert ids == [1, 2, 3]
    assert_refused(RefusalKind.NOT_ENOUGH_FREE_BLOCKS, get_new_blocks, s, 1)


def test_evicting_the_null_block_changes_nothing_but_tells_the_metrics_collector() -> None:
    s, _ = allocate_and_cache(pool(3), request("r", tokens(4)), 1)
    s, _ = drain(s)
    nxt, _ = step(evict_blocks, s, [NULL])
    assert nxt == s
    assert nxt.out == Output(told=[("evicted", NULL)])  # as vLLM's evict_blocks does


def test_reset_succeeds_while_only_the_null_block_is_referenced() -> None:
    s, _ = step(touch, pool(3), [NULL])
    _, ok = step(reset_prefix_cache, s)
    assert ok is True


# --------------------------------------------------------------------------
# 11. Several KV-cache groups (ref L198-224, L283-285).


def one_hash_in_two_groups() -> tuple[PoolState, bytes]:
    """The same 1-block request cached in group 0 (block 1) and group 1 (block 2)."""
    r = request("r", tokens(4))
    s, _ = allocate_and_cache(pool(4), r, 1, group=0)
    s, _ = allocate_and_cache(s, r, 1, group=1)
    return s, r.block_hashes[0]


def test_same_hash_in_two_groups_is_two_keys() -> None:
    s, h = one_hash_in_two_groups()
    assert key(h, 0) != key(h, 1)
    assert dict(s.index) == {key(h, 0): (1,), key(h, 1): (2,)}


def test_get_cached_block_returns_one_block_per_group_or_none() -> None:
    s, h = one_hash_in_two_groups()
    assert get_cached_block(s, h, [0, 1]) == [1, 2]
    assert get_cached_block(s, h, [1, 0]) == [2, 1]
    assert get_cached_block(s, h, [0, 2]) is None
    s, _ = step(evict_blocks, s, [1])
    assert get_cached_block(s, h, [0, 1]) is None
    assert get_cached_block(s, h, [1]) == [2]


# --------------------------------------------------------------------------
# 12. Queries (ref L773-775, L871-891).


def test_is_block_writable_only_for_the_sole_owner_of_an_unhashed_block() -> None:
    s, _ = allocate_and_cache(pool(5), request("r", tokens(4)), 1)
    s, ids = step(get_new_blocks, s, 2)
    assert ids == [2, 3]
    s, _ = step(touch, s, [3])
    assert is_block_writable(s, 2)
    assert not is_block_writable(s, 1)  # hashed
    assert not is_block_writable(s, 3)  # shared
    assert not is_block_writable(s, 4)  # idle
    assert not is_block_writable(s, NULL)


def test_get_usage_is_the_fraction_of_real_blocks_in_use() -> None:
    s = pool(5)
    assert get_usage(s) == 0.0
    s, _ = step(get_new_blocks, s, 2)
    assert get_usage(s) == 0.5
    s, _ = step(get_new_blocks, s, 2)
    assert get_usage(s) == 1.0


def test_get_usage_of_a_pool_with_only_the_null_block_is_zero() -> None:
    s = pool(1)
    assert s.free == ()
    assert get_usage(s) == 0.0


def test_get_num_free_blocks_counts_the_free_queue() -> None:
    s = pool(5)
    assert get_num_free_blocks(s) == 4
    s, _ = step(get_new_blocks, s, 3)
    assert get_num_free_blocks(s) == 1
    s, _ = step(free_blocks, s, [2])
    assert get_num_free_blocks(s) == 2


# --------------------------------------------------------------------------
# 13. Ghost soundness: a hit never serves another prefix's KV.


def test_index_stays_sound_across_allocation_caching_and_reuse() -> None:
    sound = INVARIANTS["index_entries_are_sound"]
    r1, r2 = request("r1", tokens(8)), request("r2", tokens(8, start=300))
    s, ids = allocate_and_cache(pool(3), r1, 2)
    assert sound(s)
    s = free_request(s, ids)
    s, ids = allocate_and_cache(s, r2, 2)  # reuses both blocks of r1
    assert ids == [2, 1]
    assert sound(s)
    assert dict(s.index) == {key(r2.block_hashes[0]): (2,), key(r2.block_hashes[1]): (1,)}


def _features(spans: list[tuple[int, int]]) -> list[MultiModalFeature]:
    return [MultiModalFeature(f"item{i}", PlaceholderRange(offset=o, length=n))
            for i, (o, n) in enumerate(spans)]


def _req(n: int = 8) -> Request:
    return Request("q", list(range(n)), block_hasher=get_request_block_hasher(2))


# --------------------------------------------------------------------------
# Pinned by mutation testing: each test once killed a surviving mutant of the model.


def test_invariant_decorator_registers_and_returns_the_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.model import invariants

    monkeypatch.setattr(invariants, "INVARIANTS", dict(invariants.INVARIANTS))

    def never_holds(s: PoolState, at: invariants.Around = invariants.EVERYWHERE) -> bool:
        return False

    assert invariants.invariant(never_holds) is never_holds
    assert invariants.INVARIANTS["never_holds"] is never_holds
    assert invariants.violated(initial_state(4, True, 2)) == ["never_holds"]


def test_a_block_queued_twice_is_named_and_a_queue_prints_in_order() -> None:
    said = r"^block 3 is queued already: the free queue holds each block once$"
    with pytest.raises(QueuedTwice, match=said) as caught:
        Queue([3, 1, 3])
    assert caught.value.block == 3
    for push in (Queue.push_head, Queue.push_tail):
        with pytest.raises(QueuedTwice, match=r"^block 2 is queued already") as caught:
            push(Queue([1, 2]), [2])
        assert caught.value.block == 2
    assert repr(Queue([2, 1])) == "Queue([2, 1])"
    assert Queue([1, 2]) == Queue([1, 2]) and Queue([1, 2]) != Queue([2, 1]) != Queue([2])


class _Buffer(bytes):
    """A buffer with a ``numpy`` method but no ``flatten``: not a tensor."""

    def __getitem__(self, idx: Any) -> Any:
        return _Buffer(bytes(self)[idx])

    def numpy(self) -> bytes:
        raise AssertionError("a buffer is hashed through memoryview, not as a tensor")


@pytest.mark.parametrize(("torch_loaded", "kind"), [(False, bytes), (True, bytes), (False, _Buffer),
                                                    (True, FakeTensor)],
                         ids=["buffer", "buffer-beside-torch", "buffer-with-numpy", "tensor"])
def test_the_models_prompt_embeds_key_is_the_pools(torch_loaded: bool, kind: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The workloads make no prompt embeddings: this is the model's one check against the pool.
    monkeypatch.setitem(sys.modules, "torch", FakeTorch("torch") if torch_loaded else None)
    data = bytes(range(40, 48))
    embeds = FakeTensor([bytes([x]) for x in data]) if kind is FakeTensor else kind(data)
    req = Request("e", list(range(8)), prompt_embeds=embeds)
    digest = hashlib.sha256(data[2:6]).digest()
    pools, _ = generate_block_hash_extra_keys(req, 2, 6, 0)
    assert chunk_keys(req, 2, 6) == pools == (("prompt_embeds", digest),)
    assert untagged(pools) == (digest,)  # as events publish it


def test_hit_events_carry_only_the_hit_tokens() -> None:
    req = Request("h", list(range(11)), block_hasher=get_request_block_hasher(2))
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    pool.emit_cached_block_events(req, 2, 4, 0)
    state, _ = ACTIONS["emit_cached_block_events"](initial_state(4, True, 2, events_on=True), req, 2, 4, 0)
    (event,) = cast(list[Any], pool.take_events())
    assert [model_event(e) for e in state.events] == [pool_event(event)]
    assert event.token_ids == list(range(8)) and event.parent_block_hash is None and event.block_size == 4


def test_hit_events_publish_each_blocks_extra_keys() -> None:
    # Multimodal items in the first and in the second block, and a salt: each block's keys are
    # those of its own token range.
    items = [MultiModalFeature("a", PlaceholderRange(1, 2)), MultiModalFeature("b", PlaceholderRange(6, 3))]
    req = Request("m", list(range(12)), block_hasher=get_request_block_hasher(2), mm_features=items,
                  cache_salt="s")
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    pool.emit_cached_block_events(req, 2, 4, 0)
    state, _ = ACTIONS["emit_cached_block_events"](initial_state(4, True, 2, events_on=True), req, 2, 4, 0)
    (event,) = cast(list[Any], pool.take_events())
    assert [model_event(e) for e in state.events] == [pool_event(event)]
    assert event.extra_keys == [(("a", 1), "s"), (("b", 2),)]


def test_the_policy_queue_of_an_allocation_is_the_queue_without_its_head() -> None:
    # queue_follows_eviction_policy leaves allocations to allocation_takes_queue_head; the
    # declaration's policy must still say what an allocation leaves.
    s = initial_state(4, True, 2)  # free queue: 1, 2, 3
    after, taken = ACTIONS["get_new_blocks"](s.copy(), 2)
    t = OPERATIONS["get_new_blocks"].transition(s, after, (2,), taken, out=after.out)
    assert taken == [1, 2] and policy_queue(t) == tuple(after.free) == (3,)
    assert not broken_by(t)


@pytest.mark.parametrize("events", [False, True])
def test_an_inserted_key_is_announced_only_with_events_on(events: bool) -> None:
    # The caller announces an inserted key (no event); the model notes it as live only where
    # events exist, as for every other entry.
    req = Request("i", list(range(4)), block_hasher=get_request_block_hasher(2))
    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2, events_on=events), 1)
    s, _ = ACTIONS["_insert_block_hash"](s, req, 2, 0, 1, 2)
    key = (req.block_hashes[0], 0)
    assert s.announced == ({(key, 1)} if events else set()) and not s.events


@pytest.mark.parametrize("prefix_tokens", [3, 6], ids=["not-whole-chunks", "past-the-hashes"])
def test_an_insert_needs_a_key_of_the_requests_whole_chunks(prefix_tokens: int) -> None:
    # The key the model's insert names is the request's hash of its first prefix_tokens tokens.
    req = Request("k", list(range(4)), block_hasher=get_request_block_hasher(2))  # two hashes
    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2), 1)
    said = assert_refused(RefusalKind.INVALID_ARGUMENT, ACTIONS["_insert_block_hash"], s, req, prefix_tokens,
                          0, 1, 2)
    assert said == f"no key names the first {prefix_tokens} tokens"


def test_changed_outside_names_each_change_the_footprint_does_not_cover() -> None:
    # What changes_stay_in_footprint reports: every kind of change, each named once, none inside.
    req = Request("f", list(range(4)), block_hasher=get_request_block_hasher(2))
    s, _ = ACTIONS["get_new_blocks"](initial_state(6, True, 2, events_on=True), 2)  # free: 3, 4, 5
    s, _ = ACTIONS["cache_full_blocks"](s, req, [1, 2], 0, 2, 2, 0)
    s.watchers[4] = make_watcher()  # the same watcher before and after: not a change
    after = s.copy()
    after.ref[3] = after.holders[3] = 1
    after.watchers[3] = make_watcher()
    after.free = Queue([4, 3, 5])
    key = (req.block_hashes[0], 0)
    after.index[key] = (1, 2)
    after.names[key] = EMPTY
    after.announced.discard((key, 1))
    short = f"…{key[0][-3:].hex()}/g0"
    assert changed_outside(s, after, NOTHING) == [
        "block 3's ref", "block 3's holders", "block 3's watcher",
        "the untouched blocks' places in the free queue", f"the index entries of key {short}",
        f"the name of key {short}", "1 announcement(s) of untouched entries"]
    assert changed_outside(s, after, Footprint(frozenset({1, 2, 3, 4, 5}), frozenset(s.index))) == []
    # A footprint of the blocks and the other key: only this key's changes are outside it.
    other = (req.block_hashes[1], 0)
    assert changed_outside(s, after, Footprint(frozenset({1, 2, 3, 4, 5}), frozenset({other}))) == [
        f"the index entries of key {short}", f"the name of key {short}"]


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
        assert s.ref == [(2 if null_counted else 0), 2, 2, 1, 0]
        s, _ = ACTIONS["free_blocks"](s, [0, 3, 1, 0, 2])
        assert s.ref == [0, 1, 1, 0, 0] and s.free == (3, 4)


def test_model_keeps_every_reuse_notification() -> None:
    def first(b: Any) -> None:
        pass

    def second(b: Any) -> None:
        pass

    # Each call tells its own notices (``out``); none is lost between calls.
    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2), 2)
    s, _ = ACTIONS["unpin_blocks"](s, [1], first)
    s, _ = ACTIONS["get_new_blocks"](s, 2)  # 3 then 1: block 1 is reused
    assert s.out.fired == [(first, 1)]
    s, _ = ACTIONS["unpin_blocks"](s, [2], second)
    assert s.out.fired == []
    s, _ = ACTIONS["free_blocks"](s, [1, 3])
    assert s.out.fired == []
    s, ok = ACTIONS["reset_prefix_cache"](s)
    assert ok and s.out.fired == [(second, 2)] and s.watchers == {}


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
    before = state.copy()
    after, result = ACTIONS["cache_full_blocks"](state, req, [1], num_cached, num_full, 4, 0)
    assert result is None and after == before and after.out == Output()


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
        assert tuple(state.names[primary.key]) == chunks[: 2 * (i + 1)]
        assert state.holds[b] is state.names[primary.key]  # interned: one prefix, one object


def test_model_initial_state_defaults_are_the_pools() -> None:
    pool = BlockPool(4, True, 2)
    state = initial_state(4, True, 2)
    assert (state.events_on, state.medium) == (pool.enable_kv_cache_events, pool.medium) == (False, "GPU")
    assert state.null_counted is True and state.free == (1, 2, 3) and state.ref == [0, 0, 0, 0]


def test_an_inserted_second_copy_of_a_live_key_is_counted_with_the_first() -> None:
    # Block 1 holds key K (announced by caching); the caller inserts K into block 2 as well and
    # announces it itself: K then has two live announcements, one per index entry.
    req = Request("c", list(range(4)), block_hasher=get_request_block_hasher(2))
    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2, events_on=True), 2)
    s, _ = ACTIONS["cache_full_blocks"](s, req, [1], 0, 1, 2, 0)
    before = s.copy()
    after, result = ACTIONS["_insert_block_hash"](s, req, 2, 0, 2, 2)
    k = (req.block_hashes[0], 0)
    assert set(after.index[k]) == {1, 2} and after.announced == {(k, 1), (k, 2)}
    t = OPERATIONS["_insert_block_hash"].transition(before, after, (req, 2, 0, 2, 2), result, out=after.out)
    assert not broken_by(t)


def test_a_check_around_some_blocks_reads_only_those_blocks() -> None:
    # The refinement checks only what a call touched: a fault elsewhere is not that call's.
    s = initial_state(4, True, 2)
    s.ref[3] = 5  # held, yet queued as free; and no holder says so
    broken = ["free_queue_holds_exactly_idle_blocks", "ref_counts_equal_holders"]
    assert violated(s) == violated(s, Around(blocks=(3,), keys=(), entries=())) == broken
    assert violated(s, Around(blocks=(1,), keys=(), entries=())) == []
    s.ref[3], s.ref[1] = 0, 5  # now the fault is at block 1, the first real block
    assert violated(s, Around(blocks=(1,), keys=(), entries=())) == broken
    # A block the pool does not have is nothing to check (a misuse call may name one).
    assert violated(initial_state(4, True, 2), Around(blocks=(-1, 4, 9), keys=(), entries=())) == []


def test_a_check_around_the_null_block_or_some_keys_reads_them() -> None:
    s = initial_state(4, True, 2)
    s.secondary[0] = ((b"xyz", 0),)  # a secondary key on the null block, in no index entry
    null_faults = ["null_block_inert", "index_matches_block_hashes", "secondary_entries_need_primary"]
    assert violated(s, Around(blocks=(0,), keys=(), entries=())) == violated(s) == null_faults
    s = initial_state(4, True, 2)
    k = (b"abc", 0)
    s.index[k] = ()  # a key with no entries
    assert violated(s, Around(blocks=(), keys=(k,), entries=())) == violated(s) == [
        "index_matches_block_hashes", "index_entries_are_sound"]
    assert violated(s, Around(blocks=(), keys=(), entries=())) == []


def _outcome(fn: Callable[..., Any], s: PoolState, *args: Any) -> tuple[Any, ...]:
    """What ``fn(copy of s, *args)`` returns or raises, with the state it leaves."""
    work = s.copy()
    try:
        return "returned", fn(work, *args), work
    except Exception as error:  # the outcome is compared, whatever it is
        return "raised", type(error), str(error), work


@pytest.mark.parametrize("name", [n for n, op in OPERATIONS.items() if any(a.optional for a in op.args)])
def test_every_part_of_a_declaration_defaults_what_the_declaration_defaults(name: str) -> None:
    # Callers omit the optional arguments (a mask, the replace flag): each part of the
    # operation then reads the declared default, as if it had been passed.
    op = OPERATIONS[name]
    required = sum(not a.optional for a in op.args)
    defaults = tuple(a.default for a in op.args[required:])
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states: list[PoolState] = []
    assert bmc.explore(cfg, 1, 600, visit=states.append).ok
    compared = 0
    for s in states:
        for name_, domain_args in bmc.calls(s, cfg, cfg.requests()):
            if name_ != name:
                continue
            short = tuple(domain_args[:required])
            args = short + defaults  # the domain's arguments, the optional ones at their defaults
            for part in (op.guard, op.requires, op.next, op.footprint):
                assert _outcome(part, s, *short) == _outcome(part, s, *args), (part.__name__, args)
            assert op.split(s, None, *short) == op.split(s, None, *args)
            compared += 1
    assert compared > 10


def test_changed_outside_reads_every_key_the_index_or_the_names_had_or_have() -> None:
    # Each key counts whether it is in the index or in the names, before or after, and
    # whether its entries changed, its name, or both; a key inside the footprint hides only itself.
    req = Request("g", list(range(8)), block_hasher=get_request_block_hasher(2))  # four keys
    s, _ = ACTIONS["get_new_blocks"](initial_state(6, True, 2, events_on=True), 2)
    s, _ = ACTIONS["cache_full_blocks"](s, req, [1, 2], 0, 2, 2, 0)  # k0 on block 1, k1 on block 2
    k = [(h, 0) for h in req.block_hashes]
    entries, name = ([f"the {what} of key …{key[0][-3:].hex()}/g0" for key in k]
                     for what in ("index entries", "name"))
    every_block = Footprint(frozenset(range(6)), frozenset())

    def outside(change: Callable[[PoolState], None], start: PoolState = s,
                fp: Footprint = every_block) -> list[str]:
        after = start.copy()
        change(after)
        return changed_outside(start, after, fp)

    assert outside(lambda a: a.index.update({k[0]: (1, 2)})) == [entries[0]]
    assert outside(lambda a: a.names.update({k[0]: EMPTY})) == [name[0]]
    assert outside(lambda a: a.index.update({k[2]: (3,)})) == [entries[2]]  # a key new to the index
    assert outside(lambda a: a.names.update({k[3]: EMPTY})) == [name[3]]  # a key new to the names
    unnamed = s.copy()
    unnamed.index[k[2]] = (3,)
    assert outside(lambda a: a.index.pop(k[2]), start=unnamed) == [entries[2]]  # a key gone

    def change_three(a: PoolState) -> None:
        a.index.update({k[0]: (1, 2), k[1]: (1, 2), k[2]: (3,)})

    for hidden in range(3):
        fp = Footprint(every_block.blocks, frozenset({k[hidden]}))
        assert sorted(outside(change_three, fp=fp)) == sorted(entries[i] for i in range(3) if i != hidden)
    # An announcement of a key in the footprint, on a block outside it, is inside.
    key_only = Footprint(frozenset(), frozenset({k[0]}))
    assert outside(lambda a: a.announced.discard((k[0], 1)), fp=key_only) == []


def test_a_refused_call_has_no_footprint_even_when_its_blocks_do_not_exist() -> None:
    # A refused call changes nothing, so it touches nothing; its arguments may name blocks the
    # pool does not have (the refinement's misuse makes such calls), which no footprint could read.
    s = initial_state(4, True, 2)
    t = OPERATIONS["free_blocks"].transition(s, s.copy(), ([99],), refusal="block 99 does not exist")
    assert t.refused and t.footprint is None and not broken_by(t)
    assert OPERATIONS["free_blocks"].transition(s, s.copy(), ([1],)).footprint is not None


def test_footprints_name_only_what_the_call_touches() -> None:
    # An allocation of more blocks than are free is refused and touches nothing (no walk of
    # the queue); a masked-out block is not cached, so it is not in the footprint.
    s = initial_state(4, True, 2)  # free: 1, 2, 3
    alloc = OPERATIONS["get_new_blocks"].footprint
    assert alloc(s, 4) == NOTHING and alloc(s, 2) == Footprint(frozenset({1, 2}))
    assert OPERATIONS["free_blocks"].footprint(s, [4, -1, 3]) == Footprint(frozenset({3}))  # 4: no such block
    req = Request("m", list(range(4)), block_hasher=get_request_block_hasher(2))
    s, _ = ACTIONS["get_new_blocks"](s, 2)
    fp = OPERATIONS["cache_full_blocks"].footprint(s, req, [1, 2], 0, 2, 2, 0, [True, False])
    assert fp == Footprint(frozenset({1}), frozenset({(req.block_hashes[0], 0)}))


@pytest.mark.parametrize(("start", "end"), [(0, 4), (4, 8), (2, 6)])
def test_the_models_chunk_keys_are_the_pools_tags_included(start: int, end: int) -> None:
    # The model keeps vLLM's tagged keys (the tag says how events untag them): every kind at once.
    req = Request("t", list(range(8)), lora_request=LoRARequest("ad", 3, "/p"), cache_salt="s",
                  mm_features=_features([(1, 2), (5, 2)]), prompt_embeds=bytes(range(8)))
    pools, _ = generate_block_hash_extra_keys(req, start, end, 0)
    assert chunk_keys(req, start, end) == pools
    assert {k[0] for k in pools or ()} >= {"lora", "mm", "prompt_embeds"}


@pytest.fixture
def chunks_read(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The token ranges whose chunk keys the model reads, in order, from now on."""
    read: list[tuple[int, int]] = []
    real = model_request.chunk_keys
    monkeypatch.setattr(model_request, "chunk_keys", lambda r, a, b: read.append((a, b)) or real(r, a, b))
    return read


def test_a_requests_prefixes_are_read_once_per_hash_block_size(chunks_read: list[tuple[int, int]]) -> None:
    # A call reads only the chunks no call read before (the model's cost does not grow with a
    # request's length); another hash block size reads its own chunks.
    read = chunks_read
    req = Request("p", list(range(8)))
    first = model_request.content(req, 4, 1)
    assert read == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert model_request.content(req, 4, 1) is first and len(read) == 4
    model_request.content(req, 6, 1)
    assert read[4:] == [(4, 5), (5, 6)]
    by_two = model_request.content(req, 4, 2)
    assert by_two is model_request.content(Request("q", list(range(8))), 4, 2) and by_two is not first


class _Unreferable:
    """A request that cannot be referred to weakly (slots, no ``__weakref__``), as a trace line's."""

    __slots__ = ("all_token_ids", "cache_salt", "lora_request", "mm_features")

    def __init__(self, tokens: Sequence[int]) -> None:
        self.all_token_ids, self.mm_features = list(tokens), ()
        self.cache_salt = self.lora_request = None


def test_requests_that_cannot_be_referred_to_weakly_are_read_one_at_a_time(
        chunks_read: list[tuple[int, int]]) -> None:
    read = chunks_read
    a, b = _Unreferable([1, 2, 3, 4]), _Unreferable([5, 6, 7, 8])
    first_a = model_request.content(a, 4, 2)
    assert model_request.content(a, 4, 2) is first_a and read == [(0, 2), (2, 4)]  # the last one is kept
    first_b = model_request.content(b, 4, 2)
    assert first_b is not first_a and first_b is model_request.content(Request("b", [5, 6, 7, 8]), 4, 2)
    assert model_request.content(a, 4, 2) is first_a  # read again (only the last request is kept)
    assert model_request.content(a, 4, 1) is model_request.content(Request("a", [1, 2, 3, 4]), 4, 1)


def test_the_model_forgets_a_request_once_it_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the model keeps of a request lives as long as the request: a day of calls does not
    # accumulate every request ever read.  Read at two hash block sizes, it was kept twice.
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    req = Request("gone", list(range(8)))
    alive, key = weakref.ref(req), id(req)
    model_request.content(req, 8, 2)
    assert key in model_request._chains
    model_request.content(req, 8, 1)
    del req
    gc.collect()
    assert alive() is None and key not in model_request._chains and unraisable == []


def test_an_evicted_keys_name_is_forgotten_with_its_last_entry() -> None:
    req = Request("n", list(range(4)), block_hasher=get_request_block_hasher(2))
    s, _ = ACTIONS["get_new_blocks"](initial_state(4, True, 2), 1)
    s, _ = ACTIONS["cache_full_blocks"](s, req, [1], 0, 1, 2, 0)
    s, _ = ACTIONS["free_blocks"](s, [1])
    s, _ = ACTIONS["evict_blocks"](s, [1])
    assert s.index == {} and s.names == {}


def test_binding_fills_in_the_declared_defaults_and_names_what_is_wrong() -> None:
    partial = OPERATIONS["cache_partial_block"]
    assert partial.bind(("r", 1, 2, 0, 4)) == ("r", 1, 2, 0, 4, False)
    assert partial.bind(("r", 1, 2, 0, 4), {"replace_existing_hashes": True})[5] is True
    with pytest.raises(TypeError, match=r"^free_blocks\(\) takes 1 arguments, 2 given$"):
        OPERATIONS["free_blocks"].bind(([1], [2]))
    with pytest.raises(TypeError, match=r"^free_blocks\(\) missing argument 'block_ids'$"):
        OPERATIONS["free_blocks"].bind(())
    with pytest.raises(TypeError, match=r"^free_blocks\(\) got unexpected argument\(s\) \['a', 'b'\]$"):
        OPERATIONS["free_blocks"].bind(([1],), {"b": 1, "a": 2})


def test_a_fresh_pool_has_told_nothing_and_an_empty_queue_fills_from_either_end() -> None:
    assert initial_state(4, True, 2).out == Output()
    for push in (Queue.push_head, Queue.push_tail):
        q = Queue()
        assert list(q) == [] and len(q) == 0
        push(q, [3, 1])
        assert list(q) == [3, 1] and q == Queue([3, 1])


@pytest.mark.parametrize("boundary_partials", [False, True])
def test_partial_entries_at_a_block_boundary_follow_the_pools_setting(boundary_partials: bool) -> None:
    # vLLM 0.33's setting: a partial entry may end at a block boundary without replacing.
    req = Request("b", list(range(4)), block_hasher=get_request_block_hasher(2))
    s = initial_state(4, True, 2, boundary_partials=boundary_partials)
    assert s.boundary_partials is boundary_partials
    s, _ = ACTIONS["get_new_blocks"](s, 1)
    if boundary_partials:
        s, key = ACTIONS["cache_partial_block"](s, req, 1, 2, 0, 2)
        assert key == (req.block_hashes[0], 0)
    else:
        assert_refused(RefusalKind.INVALID_ARGUMENT, ACTIONS["cache_partial_block"], s, req, 1, 2, 0, 2)
