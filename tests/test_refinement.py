"""Bounded refinement (oracle/search/refinement.py): kvpool.impl beside the model on every call sequence.

The real pool agrees with the model on every sequence of small pools to a
small depth (the ``refinement`` phase of ``kvpool verify`` goes deeper);
every seeded pool bug is caught by the exhaustive search, at the depth
recorded here; misuse is reached; copies of a pool are independent.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

import pytest

from kvpool.bugs import BUGS
from kvpool.impl import BlockPool
from kvpool.model import ACTIONS, CALLER_ACTIONS, CONTRACTS, QUERIES, RefusalKind
from kvpool.oracle.core.lockstep import Divergence
from kvpool.oracle.core.observe import observe_pool
from kvpool.oracle.search.refinement import Carried, Memo, Shape, fresh_pair, model_watcher, requests_for
from kvpool.pictures import pictured_steps
from kvpool.verify import Budget, Progress, run_refinement
from kvpool.verify.phase_refinement import refine

HBS2 = Shape(4, 2)
HBS1 = Shape(4, 1)
NO_CACHING = Shape(4, 1, caching=False)
NO_EVENTS = Shape(4, 2, events=False)
SMALLEST = Shape(3, 2)
"""The null block and two real ones: enough for every bug that needs three calls, and cheap."""


# The cheapest search that still reaches two calls first: conftest.SAMPLED keeps it in the default run.
@pytest.mark.parametrize(("shape", "depth"), [(NO_CACHING, 2), (HBS2, 2), (HBS1, 1), (NO_EVENTS, 1)],
                         ids=lambda v: v.slug if isinstance(v, Shape) else f"depth-{v}")
def test_the_pool_refines_the_model(shape: Shape, depth: int) -> None:
    """Every sequence of ``depth`` calls: kvpool.impl and the model agree after each one."""
    out = refine(BlockPool, shape, depth)
    assert out.ok, out.summary()
    assert out.complete and out.depth == depth, out.summary()
    assert out.states > 1 and out.transitions > out.states
    assert out.copies == Counter(pickle=out.copies["pickle"]), out.copies  # every pool pickled


def test_misuse_is_reached_and_refused_alike() -> None:
    """Every operation runs, misuse of each kind is refused alike, breaches are counted, not run."""
    outs = [refine(BlockPool, SMALLEST, 2), refine(BlockPool, NO_CACHING, 2)]
    ops: Counter[str] = Counter()
    misuse: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    breaches: Counter[str] = Counter()
    for out in outs:
        assert out.ok, out.summary()
        ops += out.operations
        misuse += out.misuse
        refusals += out.refusals
        breaches += out.breaches
    assert set(ops) == set(ACTIONS) | set(QUERIES) | set(CALLER_ACTIONS), ops
    assert {"free_blocks", "touch", "unpin_blocks", "evict_blocks", "move_block_hashes",
            "cache_full_blocks", "cache_partial_block", "get_new_blocks", "emit_cached_block_events",
            "is_block_writable", "get_cached_block"} <= set(misuse), misuse
    assert set(refusals) == {k.name for k in RefusalKind}, refusals
    assert set(breaches) <= set(CONTRACTS) and len(breaches) >= 3, breaches


DEPTH_NEEDED: dict[str, tuple[Shape, int, bool]] = {
    # name: (pool, depth of the shortest diverging sequence, symmetry reduction)
    "free_without_refcount_check": (HBS2, 1, True), "free_same_block_twice": (HBS2, 1, True),
    "free_appends_listing_twice": (HBS2, 2, True), "free_hashed_not_queued": (HBS2, 2, True),
    "free_hashed_to_head": (SMALLEST, 3, True), "free_pushes_head_one_by_one": (HBS2, 2, True),
    "free_null_into_queue": (HBS2, 0, True), "counter_before_check": (HBS2, 1, True),
    "refused_free_keeps_partial_effect": (HBS2, 1, True), "touch_leaves_block_free": (HBS2, 1, True),
    "touch_swap_remove": (HBS2, 1, True), "refused_touch_keeps_partial_effect": (HBS2, 1, True),
    "alloc_keeps_old_hash": (HBS2, 1, True), "alloc_forgets_primary_only": (HBS2, 1, True),
    "alloc_pops_tail": (HBS2, 1, True), "reuse_notice_names_position": (SMALLEST, 3, True),
    "cache_full_hashes_null": (HBS2, 1, True), "unpin_null": (HBS2, 1, True),
    "move_onto_null": (HBS2, 2, True), "insert_indexes_null": (HBS2, 1, True),
    "insert_overwrites_primary": (SMALLEST, 3, True), "evict_forgets_index": (HBS2, 1, True),
    "evict_keeps_secondaries": (SMALLEST, 3, True), "partial_kept_after_promotion": (HBS2, 2, True),
    "cache_without_caching": (Shape(4, 2, caching=False), 1, True),
    "reset_while_in_use": (HBS2, 2, True), "unpin_keeps_reference": (HBS2, 2, True),
    "alloc_refuses_last_block": (HBS2, 1, True), "cache_full_without_conflict_check": (HBS2, 2, True),
    "evict_without_events": (HBS2, 2, True), "removed_event_drops_group": (HBS2, 2, True),
    "stored_event_when_disabled": (NO_EVENTS, 1, True), "stored_event_drops_lora": (HBS2, 1, True),
    "stored_tokens_one_short": (HBS2, 1, True), "stored_event_drops_session": (HBS2, 1, True),
    "event_hashes_masked_to_32_bits": (HBS2, 1, True), "event_extra_keys_keep_tags": (HBS2, 1, True),
    "coarse_hash_of_first_chunk": (HBS2, 1, True), "cache_salt_on_every_chunk": (HBS2, 1, True),
    "multimodal_offset_flipped": (HBS2, 1, True), "group_id_little_endian": (HBS2, 1, True),
    # reads group 1 as 16777216 and group 0 right: symmetric states (group 0 <-> 1) hide it
    # until a state holds both groups (depth 3); without the reduction, depth 2
    "removed_group_from_wrong_bytes": (SMALLEST, 2, False),
}
"""Each seeded pool bug: the pool searched, and the depth at which the search diverges.

Measured on 4 blocks without symmetry reduction (``docs/verification.md``),
every bug diverges within 3 calls, at the depth given here; the bugs that
need 3 are searched here on the smallest pool, which has the same shortest
sequences at a tenth of the cost.
"""


def test_every_seeded_pool_bug_has_its_depth() -> None:
    assert set(DEPTH_NEEDED) == {name for name, bug in BUGS.items() if bug.pool is not None}


@pytest.mark.parametrize("name", sorted(DEPTH_NEEDED))
def test_every_seeded_pool_bug_is_caught_by_exhaustive_exploration(name: str) -> None:
    """The search diverges on the broken pool, with a sequence as short as recorded, and a
    replay of that sequence from a fresh pool diverges again."""
    shape, depth, symmetry = DEPTH_NEEDED[name]
    pool = BUGS[name].pool
    assert pool is not None
    out = refine(pool, shape, max(depth, 1), symmetry=symmetry)
    assert not out.ok, f"{name} not caught: {out.summary()}"
    assert len(out.sequence) == depth, out.summary()
    assert out.reproduced and isinstance(out.divergence, Divergence), out.summary()


def test_a_divergence_is_the_shortest_sequence_printed_as_the_lockstep_prints_it() -> None:
    out = refine(BUGS["free_pushes_head_one_by_one"].pool, HBS2, 3)  # type: ignore[arg-type]
    assert [(op, args) for op, args in out.sequence] == [("get_new_blocks", (2,)),
                                                           ("free_blocks", ([1, 2],))]
    exc = out.divergence
    # the freed blocks' footprint (their queue links) is compared before the whole pool: the call is named
    assert isinstance(exc, Divergence) and exc.parts == ["links"]
    assert "observation after free_blocks: block 1 links: model (None, 2) | pool (2, 3)" in str(exc)
    text = str(exc)
    assert "last steps:" in text and "step 2: free_blocks([1, 2])" in text
    steps = pictured_steps(exc)
    assert [s["call"] for s in steps] == ["get_new_blocks(2)", "free_blocks([1, 2])"]
    assert steps[-1]["pool_picture"] and steps[-1]["differs"]
    assert "DIVERGED after 2 call(s)" in out.summary()


def test_copies_of_a_pool_are_independent_and_keep_their_watchers() -> None:
    """A kept state's pool, unpickled twice, gives two pools each with its own watchers."""
    pair = fresh_pair(BlockPool, HBS1)
    r0 = requests_for(1)[0]
    pair.call("get_new_blocks", 2)
    pair.call("cache_full_blocks", r0, [1, 2], 0, 2, 1, 0)
    pair.call("unpin_blocks", [1], model_watcher("watcher_a"))
    kept = Carried.of(pair)
    assert kept.how == "pickle"
    a, b = (kept.restore(pair.model, pair, BlockPool, HBS1, [], Memo()) for _ in range(2))
    assert observe_pool(a.pool) == observe_pool(b.pool) == observe_pool(pair.pool)
    assert a.pool is not b.pool and a.pool.blocks[1] is not b.pool.blocks[1]
    assert a.pool._reuse_watchers[1] is a.named["watcher_a"] and a.named["watcher_a"].log is a.fired
    assert b.pool._reuse_watchers[1] is not a.pool._reuse_watchers[1]
    a.call("get_new_blocks", 2)  # hands out 3 and 1: watcher_a fires in a, compared by the lockstep
    assert observe_pool(b.pool) == observe_pool(pair.pool) != observe_pool(a.pool)
    assert a.model.out.fired and not b.model.out.fired


class Unpicklable(BlockPool):
    """A pool holding a lambda: pickle refuses it, a deep copy does not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hook = lambda: None


class Uncopyable(BlockPool):
    """A pool holding a lock: neither pickled nor deep-copied, so its sequences are replayed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()


@pytest.mark.parametrize(("pool", "how"), [(Unpicklable, "deepcopy"), (Uncopyable, "replay")])
def test_pools_that_cannot_be_pickled_are_copied_or_replayed(pool: type[BlockPool], how: str) -> None:
    reference = refine(BlockPool, NO_CACHING, 2)
    out = refine(pool, NO_CACHING, 2)
    assert out.ok, out.summary()
    assert set(out.copies) == {how}
    assert (out.states, out.transitions, out.operations) == (
        reference.states, reference.transitions, reference.operations)


def test_the_phase_reports_what_it_covered() -> None:
    budget = Budget(refinement_pools=((4, 2, True, True, 1), (4, 1, False, True, 1)))
    phase = run_refinement(budget, Progress(open(os.devnull, "w")))  # noqa: SIM115
    assert phase.ok and [c.id for c in phase.cases] == [
        "refinement/4-blocks-hbs-2", "refinement/4-blocks-hbs-1-no-caching"]
    runs = phase.extra["runs"]
    assert [(r["depth"], r["depth_target"], r["complete"]) for r in runs] == [(1, 1, True)] * 2
    assert all(r["states"] > 1 and r["sequences"] > 100 and r["misuse"] and r["refusals"]
               and r["contract_breaches"] for r in runs), runs
    assert phase.extra["sequences"] == sum(r["sequences"] for r in runs)


def test_a_broken_pool_fails_the_phase_with_its_pictured_sequence() -> None:
    budget = Budget(refinement_pools=((4, 2, True, True, 2),))
    pool = BUGS["free_pushes_head_one_by_one"].pool
    phase = run_refinement(budget, Progress(open(os.devnull, "w")), pool,  # noqa: SIM115
                           "kvpool.bugs.pools:FreePushesHeadOneByOne")
    (case,) = phase.cases
    assert not case.ok and case.failure is not None
    assert case.failure["kind"] == "divergence"
    assert case.failure["details"].startswith("after 2 call(s) from a fresh pool:\n"
                                              "1. get_new_blocks(2)\n2. free_blocks([1, 2])")
    assert case.failure["trace"][-1]["pool_picture"]
