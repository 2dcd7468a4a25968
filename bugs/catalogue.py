"""Every seeded bug of the project: its story, and its form at each layer that can catch it.

A check that cannot fail proves nothing.  Each entry is one classic
block-pool mistake, told once, and written as it would appear in each layer:

* ``z3`` — a broken per-block step: some invariant's preservation proof must
  find a counterexample (:mod:`kvpool.proofs.inductive`);
* ``queue`` — a broken step of the free queue with places: some order
  property must find a counterexample (:mod:`kvpool.proofs.order`);
* ``action`` — a broken model action: the bounded model checker must reach a
  state that breaks an invariant or a step property (:mod:`kvpool.proofs.bmc`);
* ``pool`` — a broken pool: the lockstep against the model must diverge
  (:mod:`kvpool.oracle.search.campaign`).

:mod:`.check` runs each form; ``kvpool verify``'s ``seeded-bugs`` phase runs
them all, and the tests check that every invariant and every step property
refutes at least one bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.proofs.symbolic import Block
from kvpool.proofs.transitions import StepSpec

from . import actions as act
from . import pools
from . import z3_steps as z3s
from .z3_steps import queue_step, step


@dataclass(frozen=True)
class SeededBug:
    """One mistake, its story, and its form per layer (None where it has none)."""

    name: str
    story: str
    z3: StepSpec | None = None
    queue: Any = None
    """A broken queue step (:data:`kvpool.proofs.order.QSpec`)."""
    action: tuple[str, act.Action] | None = None
    """The model action replaced, and its broken form."""
    bmc: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of the BMC's default pool in which the action form shows."""
    pool: type | None = None


def _bug(name: str, story: str, **forms: Any) -> SeededBug:
    return SeededBug(name, story, **forms)


BUGS: dict[str, SeededBug] = {b.name: b for b in [
    # ------------------------------------------------------------ freeing
    _bug("free_without_refcount_check",
         "double free: vLLM's free_blocks decrements without checking, the count goes negative",
         z3=step("release", z3s.free_without_refcount_check),
         action=("free_blocks", act.free_without_refcount_check),
         pool=pools.FreeWithoutRefcountCheck),
    _bug("free_same_block_twice",
         "the same block listed twice in one free_blocks call: the check counts it once",
         z3=step("release", z3s.free_same_block_twice),
         action=("free_blocks", act.free_same_block_twice),
         pool=pools.FreeSameBlockTwice),
    _bug("free_appends_listing_twice",
         "vLLM's regression: every listing of a block that reached 0 is queued, so a block "
         "listed twice (two references) is queued twice and handed to two requests",
         action=("free_blocks", act.free_appends_listing_twice),
         pool=pools.FreeAppendsListingTwice),
    _bug("free_hashed_not_queued",
         "idle cached blocks leak: never returned to the free queue, never evicted",
         z3=step("release", z3s.free_hashed_not_queued),
         pool=pools.FreeHashedNotQueued),
    _bug("free_hashed_to_head",
         "cached blocks freed to the head like unhashed ones: the hottest prefix is evicted first",
         queue=queue_step("release", z3s.release_cached_to_head),
         action=("free_blocks", act.free_hashed_to_head),
         pool=pools.FreeHashedToHead),
    _bug("free_pushes_head_one_by_one",
         "freed unhashed blocks pushed onto the head one at a time: a block table freed in "
         "reverse lands reversed, and the pool silently undoes the engine's order",
         action=("free_blocks", act.free_pushes_head_one_by_one),
         pool=pools.FreePushesHeadOneByOne),
    _bug("free_null_into_queue",
         "the null block freed into the queue, then handed out as a real block",
         z3=step("release", z3s.free_null_into_queue),
         action=("free_blocks", act.free_null_into_queue),
         pool=pools.NullBlockHandedOut),
    _bug("counter_before_check",
         "a counter moved before a refused check: the refused call changes the pool",
         action=("get_new_blocks", act.counter_before_check),
         pool=pools.CounterBeforeCheck),
    _bug("refused_free_keeps_partial_effect",
         "a refused free keeps the references it dropped before finding the bad block",
         pool=pools.RefusedFreeKeepsPartialEffect),
    # ------------------------------------------------------------ hits
    _bug("touch_leaves_block_free",
         "a prefix-cache hit does not remove the block from the free queue: it is evicted in use",
         z3=step("touch", z3s.touch_leaves_block_free),
         action=("touch", act.touch_leaves_block_free),
         pool=pools.TouchLeavesBlockFree),
    _bug("touch_swap_remove",
         "a hit removed from an array-backed free list by swap-with-last: the tail jumps ahead",
         queue=queue_step("touch", z3s.touch_swap_remove, (("b", Block), ("t", Block))),
         action=("touch", act.touch_swap_remove),
         pool=pools.TouchSwapRemove),
    _bug("refused_touch_keeps_partial_effect",
         "a refused touch keeps the blocks it took out of the free queue before the bad one",
         pool=pools.RefusedTouchKeepsPartialEffect),
    # ------------------------------------------------------------ allocation
    _bug("alloc_keeps_old_hash",
         "allocation without lazy eviction: the old hash still serves the new owner's block",
         z3=step("alloc", z3s.alloc_keeps_old_hash),
         action=("get_new_blocks", act.alloc_keeps_old_hash),
         pool=pools.AllocKeepsOldHash),
    _bug("alloc_forgets_primary_only",
         "allocation clears block_hash but leaves the index pointing at the block",
         z3=step("alloc", z3s.alloc_forgets_primary_only),
         pool=pools.AllocForgetsPrimaryOnly),
    _bug("alloc_takes_any_free_block",
         "allocation takes any free block rather than the queue's head: the eviction order "
         "(least recently freed first) is lost",
         queue=queue_step("alloc", z3s.alloc_takes_any_free_block)),
    _bug("alloc_pops_tail",
         "the free list used as a stack: allocation evicts the most recently freed prefixes",
         action=("get_new_blocks", act.alloc_pops_tail),
         pool=pools.AllocPopsTail),
    _bug("reuse_notice_names_position",
         "the reuse callback is told the block's position in the batch, not its id: the engine "
         "keeps reading an overwritten block",
         action=("get_new_blocks", act.reuse_notice_names_position),
         pool=pools.ReuseNoticeNamesPosition),
    # ------------------------------------------------------------ the null block
    _bug("cache_full_hashes_null",
         "the null block (sliding-window placeholder) gets hashed",
         z3=step("cache_full", z3s.cache_full_hashes_null),
         action=("cache_full_blocks", act.cache_full_hashes_null),
         pool=pools.NullBlockHashed),
    _bug("unpin_null",
         "a reuse watcher registered on the null block",
         z3=step("unpin", z3s.unpin_null),
         pool=pools.UnpinNull),
    _bug("insert_indexes_null",
         "vLLM's _insert_block_hash has no null-block check: an offloaded key indexes the null "
         "block, which every request's table shares",
         z3=step("insert", z3s.insert_indexes_null),
         action=("_insert_block_hash", act.insert_indexes_null),
         pool=pools.InsertIndexesNull),
    _bug("insert_into_unheld_block",
         "a contract too weak: _insert_block_hash into a block nobody holds is accepted, so the "
         "index names KV no caller copied there (the step writes the ghost itself: soundness holds)",
         z3=step("insert", z3s.insert_into_unheld_block),
         action=("_insert_block_hash", act.insert_into_unheld_block)),
    _bug("replace_by_a_sharer",
         "a contract too weak: replace_existing_hashes by a holder who shares the block, so the "
         "other holders' KV is replaced under them",
         z3=step("cache_partial", z3s.replace_by_a_sharer),
         action=("cache_partial_block", act.replace_by_a_sharer),
         bmc={"blocks": 3, "hash_block_size": 2}),  # three calls: a tenth of the 4-block search
    _bug("move_onto_a_shared_block",
         "a contract too weak: move_block_hashes onto a block other requests hold too, so the "
         "copy overwrites their KV",
         z3=step("move", z3s.move_onto_a_shared_block),
         action=("move_block_hashes", act.move_onto_a_shared_block)),
    _bug("insert_overwrites_primary",
         "_insert_block_hash makes a copied key the block's primary even when it has one: the "
         "old primary stays in the index, naming a block that no longer carries it",
         z3=step("insert", z3s.insert_overwrites_primary),
         action=("_insert_block_hash", act.insert_overwrites_primary),
         pool=pools.InsertOverwritesPrimary),
    _bug("move_onto_null",
         "hashes moved onto the null block",
         z3=step("move", z3s.move_onto_null),
         pool=pools.MoveOntoNull),
    # ------------------------------------------------------------ the prefix cache
    _bug("evict_forgets_index",
         "eviction resets the block's hash but not cached_block_hash_to_block",
         z3=step("evict", z3s.evict_forgets_index),
         action=("evict_blocks", act.evict_forgets_index),
         pool=pools.EvictForgetsIndex),
    _bug("evict_spares_blocks_in_use",
         "evict_blocks skips a block a request still holds: the block the caller evicted to "
         "rewrite stays reachable from the index",
         z3=step("evict", z3s.evict_spares_blocks_in_use),
         action=("evict_blocks", act.evict_spares_blocks_in_use)),
    _bug("evict_keeps_secondaries",
         "partial-prefix entries not removed with the primary hash",
         z3=step("evict", z3s.evict_keeps_secondaries),
         pool=pools.EvictKeepsSecondaries),
    _bug("partial_kept_after_promotion",
         "a partial entry kept after its block is promoted to a full hash",
         z3=step("cache_full", z3s.partial_kept_after_promotion),
         action=("cache_full_blocks", act.partial_kept_after_promotion),
         pool=pools.PartialKeptAfterPromotion),
    _bug("partial_not_whole_chunks",
         "a partial entry at a boundary that is not a hash-chunk multiple",
         z3=step("cache_partial", z3s.partial_not_whole_chunks)),
    _bug("cache_without_caching",
         "blocks indexed in a pool built with enable_caching=False",
         z3=step("cache_full", z3s.cache_without_caching),
         pool=pools.CacheWithoutCaching),
    _bug("reset_while_in_use",
         "reset while blocks are in use, rebuilding the free queue as at start",
         z3=step("reset", z3s.reset_requeues_everything),
         action=("reset_prefix_cache", act.reset_while_in_use),
         pool=pools.ResetWhileInUse),
    _bug("reset_forgets_blocks_in_use",
         "reset with no in-use guard: the hashes and watchers of blocks in use are forgotten, "
         "though the free queue stays right",
         z3=step("reset", z3s.reset_while_in_use)),
    # ------------------------------------------------------------ liveness and leaks
    _bug("unpin_keeps_reference",
         "unpin_blocks registers the reuse watcher but keeps the reference: the block is never "
         "evictable, a leak that shrinks the pool for the life of the engine",
         z3=step("unpin", z3s.unpin_keeps_reference),
         action=("unpin_blocks", act.unpin_keeps_reference),
         pool=pools.UnpinKeepsReference),
    _bug("alloc_refuses_last_block",
         "get_new_blocks checks num_blocks >= free (off by one): the last free block is never "
         "handed out, and a full batch is refused",
         z3=step("alloc", z3s.alloc_refuses_last_block),
         action=("get_new_blocks", act.alloc_refuses_last_block),
         pool=pools.AllocRefusesLastBlock),
    _bug("cache_full_without_conflict_check",
         "cache_full_blocks re-caches a block already cached at a prefix as long: it re-indexes "
         "the block and announces the key again",
         z3=step("cache_full", z3s.cache_full_without_conflict_check),
         action=("cache_full_blocks", act.cache_full_without_conflict_check),
         pool=pools.CacheFullWithoutConflictCheck),
    # ------------------------------------------------------------ caller contracts accepted
    _bug("partial_write_over_hashed_block",
         "cache_partial_block(b[:1]) on a block with a[:3]'s entry, no replace: the entry stays "
         "and a hit on a[:3] serves b's KV",
         z3=step("cache_partial", z3s.partial_write_over_hashed_block),
         action=("cache_partial_block", act.partial_write_over_hashed_block)),
    _bug("owner_overwrites_hashed_block",
         "the owner of a hashed block writes new KV into it: the entry goes stale",
         z3=step("write", z3s.owner_overwrites_hashed_block),
         action=("write_block", act.owner_overwrites_hashed_block)),
    _bug("collisions_accepted",
         "a key already naming one prefix is indexed for another: a hit serves the wrong KV",
         z3=step("cache_full", z3s.collisions_accepted)),
    _bug("cache_full_listing_twice",
         "a block listed twice in one cache_full_blocks: vLLM removes the first position's key, "
         "then announces it in the BlockStored, and a router counts a copy the pool lacks",
         action=("cache_full_blocks", act.cache_full_listing_twice)),
    _bug("unpin_reuses_tail_place",
         "an unpinned block appended at the old tail's place: two blocks, one place",
         queue=queue_step("unpin", z3s.unpin_reuses_tail_place)),
    # ------------------------------------------------------------ events
    _bug("evict_without_events",
         "eviction that tells no event consumer: a router's view of the cache goes stale",
         z3=step("evict", z3s.evict_without_events),
         action=("evict_blocks", act.evict_without_events),
         pool=pools.EvictWithoutEvents),
    _bug("evict_removes_stale_key",
         "eviction publishes a BlockRemoved for the key a stale hash field names, hashed or not: "
         "a router drops a copy some other block still holds",
         z3=step("evict", z3s.evict_removes_stale_key)),
    _bug("removed_event_drops_group",
         "eviction's BlockRemoved leaves out the KV-cache group: a router keeping one view per "
         "group removes the entry from group 0 and keeps serving the evicted one",
         action=("evict_blocks", act.removed_event_drops_group), bmc={"symmetry": False},
         pool=pools.RemovedEventDropsGroup),
    _bug("stored_event_when_disabled",
         "BlockStored queued without checking that events are enabled: nobody takes them, and "
         "the queue grows with every cached block for the life of the engine",
         action=("cache_full_blocks", act.stored_event_when_disabled), bmc={"events_on": False},
         pool=pools.StoredEventWhenDisabled),
    # ------------------------------------------------------------ shared code: events, hashing
    _bug("stored_event_drops_lora",
         "BlockStored leaves out the LoRA adapter id: a router serves one adapter's KV to another",
         pool=pools.StoredEventDropsLora),
    _bug("stored_tokens_one_short",
         "BlockStored's token ids end one token early (a slice bound off by one)",
         pool=pools.StoredTokensOneShort),
    _bug("stored_event_drops_session",
         "BlockStored leaves out the session id",
         pool=pools.StoredEventDropsSession),
    _bug("event_hashes_masked_to_32_bits",
         "event hashes published as their low 32 bits: a router sees collisions",
         pool=pools.EventHashesMaskedTo32Bits),
    _bug("event_extra_keys_keep_tags",
         "events publish extra keys with their internal tags, which consumers cannot parse",
         pool=pools.EventExtraKeysKeepTags),
    _bug("coarse_hash_of_first_chunk",
         "a block coarser than the hash chunk takes its first chunk's hash, naming a shorter prefix",
         pool=pools.CoarseHashOfFirstChunk),
    _bug("cache_salt_on_every_chunk",
         "the cache salt enters every chunk's extra keys, not the first chunk's only",
         pool=pools.CacheSaltOnEveryChunk),
    _bug("multimodal_offset_flipped",
         "a multimodal item's offset measured from the item instead of the chunk",
         pool=pools.MultimodalOffsetFlipped),
    _bug("group_id_little_endian",
         "index keys pack the KV-cache group id little-endian, unlike vLLM",
         pool=pools.GroupIdLittleEndian),
    _bug("removed_group_from_wrong_bytes",
         "BlockRemoved reads the group id from the key's bytes little-endian",
         pool=pools.RemovedGroupFromWrongBytes),
]}
"""Every seeded bug, by name."""

SHARED_CODE = ("stored_event_drops_lora", "stored_tokens_one_short", "event_hashes_masked_to_32_bits",
               "stored_event_drops_session", "event_extra_keys_keep_tags", "coarse_hash_of_first_chunk",
               "cache_salt_on_every_chunk", "multimodal_offset_flipped", "group_id_little_endian",
               "removed_group_from_wrong_bytes")
"""Mutants of the pool's event and hashing code: invisible while the model shared that code."""


def forms(bug: SeededBug) -> list[str]:
    """The layers at which ``bug`` has a form."""
    return [f for f in ("z3", "queue", "action", "pool") if getattr(bug, f) is not None]
