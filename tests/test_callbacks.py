"""Exception safety of the pool around user callbacks.

Reuse watchers (``unpin_blocks(..., on_reuse)``) and the metrics collector are
user code and may raise.  Per the module docstring of ``kvpool.impl.pool``:
every callback due is called once, in the reference's order, even after one
raised; the first exception then propagates; the operation stays done, except
``get_new_blocks``, which puts the blocks back at the head of the free queue.

Each call site of a callback gets a scenario; the callback raises on its k-th
call for several k, and the pool must be consistent afterwards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvpool.impl import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    KVCacheBlock,
    Request,
    get_block_hash,
    get_request_block_hasher,
    maybe_convert_block_hash,
)
from kvpool.oracle.core.observe import free_queue_link_errors

HBS = 2
BS = 4
Call = tuple[str, int | None]  # (callback kind, block id or None)


class Boom(Exception):
    """What an injected callback raises."""


# --------------------------------------------------------------------- callbacks


@dataclass
class Callbacks:
    """Every user callback of a scenario: a metrics collector and reuse watchers.

    Each call is logged; once armed, the calls of one kind raise on the k-th.
    """

    log: list[Call] = field(default_factory=list)
    raised: list[Exception] = field(default_factory=list)
    fail_kind: str | None = None
    fail_at: int = 0
    error: type[BaseException] = Boom
    _counts: Counter[str] = field(default_factory=Counter)

    def arm(self, kind: str | None, k: int = 0, error: type[BaseException] = Boom) -> None:
        """Start afresh: clear the log; raise ``error`` on the k-th call of ``kind``."""
        self.log.clear()
        self.raised.clear()
        self._counts.clear()
        self.fail_kind, self.fail_at, self.error = kind, k, error

    def _called(self, kind: str, block_id: int | None) -> None:
        self.log.append((kind, block_id))
        self._counts[kind] += 1
        if kind == self.fail_kind and self._counts[kind] == self.fail_at:
            exc = self.error(f"{kind} call #{self.fail_at}")
            if isinstance(exc, Exception):
                self.raised.append(exc)
            raise exc

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        self._called("allocated", block.block_id)

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        self._called("accessed", block.block_id)

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        self._called("evicted", block.block_id)

    def reset(self) -> None:
        self._called("reset", None)

    def watcher(self, block: KVCacheBlock) -> None:
        self._called("watcher", block.block_id)


# ------------------------------------------------------------------- consistency


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def watched(pool: BlockPool) -> list[int]:
    return list(pool._reuse_watchers)


def assert_consistent(pool: BlockPool, held: Counter[int]) -> None:
    """The pool's structures agree with each other and with who holds what.

    ``held`` counts the references the test's "requests" hold per block id.
    """
    assert free_queue_link_errors(pool.free_block_queue) == []
    forward = free_ids(pool)
    assert pool.null_block.block_id not in forward
    for block in pool.blocks[1:]:
        bid = block.block_id
        assert block.ref_cnt == held[bid], f"block {bid}: ref {block.ref_cnt}, held {held[bid]}"
        assert (bid in forward) == (block.ref_cnt == 0), f"block {bid} queued wrongly"
    index = pool.cached_block_hash_to_block
    keys = list(index.keys())
    indexed = {(k, b.block_id) for k in keys for b in index.blocks_of(k)}
    assert all(index.blocks_of(k) for k in keys), "empty index entry"
    named: set[tuple[bytes, int]] = set()
    for block in pool.blocks:
        if block.block_hash is not None:
            named.add((block.block_hash, block.block_id))
        for k in pool.cached_block_hashes_by_block.get(block.block_id, ()):
            assert block.block_hash is not None, f"block {block.block_id}: secondary, no primary"
            named.add((k, block.block_id))
    assert indexed == named, "index and block keys disagree"
    assert pool.null_block.block_hash is None


# --------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """A pool set up for one call site, the call, and what must hold afterwards."""

    pool: BlockPool
    act: Callable[[], Any]
    expected_log: list[Call]  # every callback due, in the reference's order
    check_outcome: Callable[[bool], None]  # argument: whether the call raised


def make_request(num_tokens: int = 16) -> Request:
    return Request("r", list(range(num_tokens)), block_hasher=get_request_block_hasher(HBS))


def make_pool(num_blocks: int, callbacks: Callbacks, caching: bool = True) -> BlockPool:
    return BlockPool(num_blocks, caching, HBS, enable_kv_cache_events=True,
                     metrics_collector=callbacks)


def allocation_scenario(cb: Callbacks, caching: bool = True) -> Scenario:
    """get_new_blocks(7) reuses watched, cached and plain blocks; block 6 stays watched."""
    pool = make_pool(12, cb, caching)
    blocks = {b.block_id: b for b in pool.get_new_blocks(9)}  # 1..9; 10, 11 stay free
    if caching:
        pool.cache_full_blocks(make_request(), [blocks[1], blocks[2], blocks[3]], 0, 3, BS, 0)
    pool.unpin_blocks([blocks[1]], cb.watcher)
    pool.unpin_blocks([blocks[4]], cb.watcher)
    pool.free_blocks([blocks[2]])
    pool.free_blocks([blocks[5]])
    pool.unpin_blocks([blocks[3]], cb.watcher)
    pool.unpin_blocks([blocks[6]], cb.watcher)
    held = Counter({7: 1, 8: 1, 9: 1})
    queue = free_ids(pool)
    taken = queue[:7]
    assert set(taken) == {1, 2, 3, 4, 5, 10, 11}
    # reference lines 686-702: watchers of the taken blocks first, then per block
    # on_block_evicted (only with caching, via _maybe_evict_cached_block) and on_block_allocated
    expected: list[Call] = [("watcher", b) for b in taken if b in (1, 3, 4)]
    for b in taken:
        expected += [("evicted", b), ("allocated", b)] if caching else [("allocated", b)]
    assert_consistent(pool, held)

    def check(raised: bool) -> None:
        assert watched(pool) == [6], "fired watchers are consumed, the others stay"
        if raised:  # undone: blocks back at the head, in order, and the pool usable
            assert free_ids(pool) == queue
            assert all(pool.blocks[b].ref_cnt == 0 for b in taken)
            assert_consistent(pool, held)
            cb.arm(None)
            retry = pool.get_new_blocks(7)
            assert [b.block_id for b in retry] == taken
            assert cb.log == [c for c in expected if c[0] != "watcher"], "watchers fire once"
        assert free_ids(pool) == queue[7:]
        assert_consistent(pool, held + Counter(taken))

    return Scenario(pool, lambda: pool.get_new_blocks(7), expected, check)


def allocation_without_caching_scenario(cb: Callbacks) -> Scenario:
    return allocation_scenario(cb, caching=False)


def touch_scenario(cb: Callbacks) -> Scenario:
    """touch() of idle cached, held and null blocks, one of them twice."""
    pool = make_pool(8, cb)
    b1, b2, b3, _b4 = pool.get_new_blocks(4)
    pool.cache_full_blocks(make_request(), [b1, b2, b3], 0, 3, BS, 0)
    pool.free_blocks([b1, b3])
    order = [b1, b2, pool.null_block, b3, b1]
    expected: list[Call] = [("accessed", b.block_id) for b in order]  # reference line 771
    assert free_ids(pool) == [5, 6, 7, 1, 3]
    assert_consistent(pool, Counter({2: 1, 4: 1}))

    def check(raised: bool) -> None:  # the touch stays done
        assert free_ids(pool) == [5, 6, 7]
        assert pool.null_block.ref_cnt == 1
        assert_consistent(pool, Counter({1: 2, 2: 2, 3: 1, 4: 1}))

    return Scenario(pool, lambda: pool.touch(order), expected, check)


def evict_scenario(cb: Callbacks) -> Scenario:
    """evict_blocks() of the null, a held cached (with secondary), an idle cached and a plain block."""
    pool = make_pool(8, cb)
    request = make_request()
    b1, b2, b3, _b4 = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, [b1, b2, b3], 0, 3, BS, 0)
    pool.cache_partial_block(request, b1, 2, 0, BS)
    pool.free_blocks([b2])
    pool.take_events()
    keys: list[bytes] = [b1.block_hash or b"", *pool.cached_block_hashes_by_block[1],
                         b2.block_hash or b""]
    kept = b3.block_hash
    ids = {0, 1, 2, 4}
    expected: list[Call] = [("evicted", i) for i in ids]  # reference lines 821-828
    queue = free_ids(pool)
    held = Counter({1: 1, 3: 1, 4: 1})
    assert_consistent(pool, held)

    def check(raised: bool) -> None:  # the eviction stays done
        assert b1.block_hash is None and b2.block_hash is None and b3.block_hash == kept
        assert pool.cached_block_hashes_by_block == {}
        assert list(pool.cached_block_hash_to_block.keys()) == [kept]
        assert free_ids(pool) == queue
        assert pool.take_events() == [
            BlockRemoved(block_hashes=[maybe_convert_block_hash(get_block_hash(k))],
                         medium="GPU", group_idx=0) for k in keys]
        assert_consistent(pool, held)

    return Scenario(pool, lambda: pool.evict_blocks(ids), expected, check)


def reset_scenario(cb: Callbacks) -> Scenario:
    """reset_prefix_cache() of an idle pool with cached blocks and three watched blocks."""
    pool = make_pool(8, cb)
    blocks = {b.block_id: b for b in pool.get_new_blocks(7)}
    pool.cache_full_blocks(make_request(), [blocks[1], blocks[2], blocks[3]], 0, 3, BS, 0)
    pool.cache_partial_block(make_request(), blocks[1], 2, 0, BS)
    for b in (3, 1, 5):
        pool.unpin_blocks([blocks[b]], cb.watcher)
    pool.free_blocks([blocks[2], blocks[4], blocks[6], blocks[7]])
    pool.take_events()
    queue = free_ids(pool)
    # reference lines 852-862: watchers in registration order, then metrics reset()
    expected: list[Call] = [("watcher", 3), ("watcher", 1), ("watcher", 5), ("reset", None)]
    assert_consistent(pool, Counter())

    def check(raised: bool) -> None:  # the reset stays done
        assert all(b.block_hash is None for b in pool.blocks)
        assert len(pool.cached_block_hash_to_block) == 0
        assert pool.cached_block_hashes_by_block == {}
        assert watched(pool) == []
        assert pool.take_events() == [AllBlocksCleared()]
        assert free_ids(pool) == queue
        assert_consistent(pool, Counter())

    return Scenario(pool, pool.reset_prefix_cache, expected, check)


@dataclass(frozen=True)
class Site:
    """One place where the pool calls user code, and the k values to fail at."""

    name: str
    kind: str  # which callback raises
    ks: tuple[int, ...]
    scenario: Callable[[Callbacks], Scenario]


SITES: list[Site] = [
    Site("get_new_blocks/watcher", "watcher", (1, 2, 3), allocation_scenario),
    Site("get_new_blocks/on_block_evicted", "evicted", (1, 4, 7), allocation_scenario),
    Site("get_new_blocks/on_block_allocated", "allocated", (1, 4, 7), allocation_scenario),
    Site("get_new_blocks(no caching)/on_block_allocated", "allocated", (1, 3, 7),
         allocation_without_caching_scenario),
    Site("touch/on_block_accessed", "accessed", (1, 3, 5), touch_scenario),
    Site("evict_blocks/on_block_evicted", "evicted", (1, 2, 4), evict_scenario),
    Site("reset_prefix_cache/watcher", "watcher", (1, 2, 3), reset_scenario),
    Site("reset_prefix_cache/reset", "reset", (1,), reset_scenario),
]

FAILURES = [pytest.param(site, k, id=f"{site.name}#{k}") for site in SITES for k in site.ks]


# ------------------------------------------------------------------------- tests


@pytest.mark.parametrize("site", [pytest.param(s, id=s.name) for s in SITES])
def test_callbacks_run_in_reference_order_when_none_raises(site: Site) -> None:
    cb = Callbacks()
    scenario = site.scenario(cb)
    cb.arm(None)
    scenario.act()
    assert cb.log == scenario.expected_log
    scenario.check_outcome(False)


@pytest.mark.parametrize(("site", "k"), FAILURES)
def test_callback_raising_on_kth_call_propagates_and_leaves_pool_consistent(
    site: Site, k: int
) -> None:
    cb = Callbacks()
    scenario = site.scenario(cb)
    assert sum(kind == site.kind for kind, _ in scenario.expected_log) >= k
    cb.arm(site.kind, k)
    with pytest.raises(Boom) as info:
        scenario.act()
    assert info.value is cb.raised[0]
    assert cb.log == scenario.expected_log, "every callback due is called once, in order"
    scenario.check_outcome(True)


def test_every_callback_call_site_is_covered() -> None:
    # Reference call sites: 687 (watchers via get_new_blocks), 696 and 702 (on_block_allocated
    # with and without caching), 745 via 692 (on_block_evicted in get_new_blocks), 771
    # (on_block_accessed in touch), 745 via 828 (on_block_evicted in evict_blocks), 853
    # (watchers via reset_prefix_cache), 862 (reset).
    assert len({site.name for site in SITES}) == len(SITES) == 8
    assert all(site.ks for site in SITES)
    assert len(FAILURES) == sum(len(site.ks) for site in SITES)


def test_later_callback_exceptions_are_attached_as_notes_to_the_first() -> None:
    cb = Callbacks()
    pool = make_pool(4, cb)
    a, b = pool.get_new_blocks(2)

    def first(block: KVCacheBlock) -> None:
        raise Boom("first")

    def second(block: KVCacheBlock) -> None:
        raise KeyError("second")

    pool.unpin_blocks([a], first)
    pool.unpin_blocks([b], second)
    with pytest.raises(Boom, match="first") as info:
        pool.reset_prefix_cache()
    assert any("second" in note for note in getattr(info.value, "__notes__", []))
    assert_consistent(pool, Counter())


class Interrupt(BaseException):
    """Like KeyboardInterrupt: not an Exception."""


def test_base_exception_from_a_callback_still_returns_blocks_to_the_free_queue() -> None:
    cb = Callbacks()
    scenario = allocation_scenario(cb)
    queue = free_ids(scenario.pool)
    cb.arm("allocated", 1, error=Interrupt)
    with pytest.raises(Interrupt):
        scenario.act()
    assert free_ids(scenario.pool) == queue
    assert_consistent(scenario.pool, Counter({7: 1, 8: 1, 9: 1}))
