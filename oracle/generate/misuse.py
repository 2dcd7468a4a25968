"""The workload's deliberately wrong calls: one kind per refusal of the model.

A pool must refuse each the way the model does (the same error type) and
change nothing.  They live apart from the engine-like steps of
:mod:`.workload` because they follow no engine: each kind picks the one
fault it makes from the blocks the run holds now (idle, in use, hashed,
another pool's), so that the refusal a pool owes is not a matter of which
check it makes first.  The workload's ``misuse`` step draws one kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.impl.request import Request
from kvpool.model.state import NULL

from .requests import plain_request
from .two_pools import free_across

if TYPE_CHECKING:
    from .workload import Workload

MISUSES = ("free_idle", "over_free", "unpin_null", "touch_unknown", "bad_count", "mask_length",
           "evict_unknown", "move_onto_hashed", "partial_bad_tokens", "move_onto_null", "bad_group",
           "bad_block_size", "uncallable_watcher", "full_beyond_list", "full_too_few_hashes",
           "partial_too_few_hashes", "emit_too_many", "cache_conflict", "partial_at_block_end",
           "insert_bad", "other_over_free")
"""The kinds of deliberately wrong call, drawn uniformly."""
CACHE_ENTRY_MISUSES = frozenset({"move_onto_hashed", "move_onto_null", "cache_conflict",
                                 "partial_at_block_end", "insert_bad"})
"""Kinds that need a pool with caching; without it they become ``cache_disabled``."""


def wrong_call(work: Workload) -> None:
    """A deliberately wrong call; both sides must refuse it the same way (and change nothing).

    One per refusal of the model: unknown, idle, over-freed, null and
    foreign blocks; bad counts, group ids, block sizes, watchers, masks
    and lengths; hashes a request lacks; conflicting, disabled and
    misplaced cache entries.
    """
    rng, cfg, pair = work.rng, work.cfg, work.pair
    m = pair.model
    scope = work.scope()
    idle = [b for b in scope if b != NULL and m.ref[b] == 0]
    used = work._held()
    unhashed = [b for b in scope if b != NULL and m.primary[b] is None] or [NULL]
    hashed = [b for b in scope if b != NULL and m.primary[b] is not None]
    bs = cfg.block_sizes[0]
    cached_whole = [b for b in scope if (p := m.primary[b]) is not None and p.num_tokens >= bs]
    req = work._new_request()
    hbs = cfg.hash_block_size
    kind = rng.choice(MISUSES)
    if not cfg.caching and kind in CACHE_ENTRY_MISUSES:
        kind = "cache_disabled"  # a pool without caching refuses any cache entry as such
    call = pair.maybe  # a wrong call with something the pool lacks is not made
    if kind == "free_idle" and idle:
        call("free_blocks", [rng.choice(idle)])
    elif kind == "over_free" and used:
        b = rng.choice(used)
        call("free_blocks", [b] * (m.ref[b] + 1))
    elif kind == "unpin_null":
        call("unpin_blocks", [0], pair.watcher("bad"))
    elif kind == "touch_unknown":  # refused after taking earlier blocks: it must give them back
        call("touch", [*used[:1], *idle[-1:], m.num_blocks + rng.randint(0, 3)])
    elif kind == "bad_count":
        call("get_new_blocks", rng.choice([-1, len(m.free) + 1]))
    elif kind == "mask_length" and used:  # without caching: refused as disabled
        call("cache_full_blocks", req, [rng.choice(used)], 0, 1, bs, 0, [True, False])
    elif kind == "evict_unknown":
        call("evict_blocks", [rng.choice([-1, m.num_blocks])])
    elif kind == "move_onto_hashed" and used and hashed:
        call("move_block_hashes", rng.choice(used), rng.choice(hashed))
    elif kind == "partial_bad_tokens" and used:
        call("cache_partial_block", req, rng.choice(used), rng.choice([0, -hbs]), 0, bs * 2)
    elif kind == "move_onto_null" and hashed:
        call("move_block_hashes", rng.choice(hashed), NULL)
    elif kind == "bad_group":
        group, op = rng.choice([-1, 2**32]), rng.randrange(3)
        if op == 0:
            call("cache_full_blocks", req, used[:1], 0, 1, bs, group)
        elif op == 1:
            call("emit_cached_block_events", req, 0, bs, group)
        else:
            call("get_cached_block", b"\0" * 32, [0, group])
    elif kind == "bad_block_size":
        sizes = [0, -hbs] + ([hbs + 1] if hbs > 1 else [])  # not a positive multiple of hbs
        call("cache_full_blocks", req, used[:1], 0, 1, rng.choice(sizes), 0)
    elif kind == "uncallable_watcher" and used and not work.traceable_only:
        call("unpin_blocks", used[:1], None)
    elif kind == "full_beyond_list" and used:
        call("cache_full_blocks", req, used[:1], 0, 2, bs, 0)
    elif kind == "full_too_few_hashes":  # on an unhashed block: one fault per call
        call("cache_full_blocks", _plain(work, 0), [rng.choice(unhashed)], 0, 1, bs, 0)
    elif kind == "partial_too_few_hashes":
        call("cache_partial_block", _plain(work, 0), rng.choice(unhashed), hbs, 0, 2 * bs)
    elif kind == "emit_too_many":  # refused only with events on
        call("emit_cached_block_events", req, len(req.block_hashes) + 1, hbs, 0)
    elif kind == "cache_conflict" and cached_whole:  # cached again as a request's first block
        block = rng.choice(cached_whole)
        call("cache_full_blocks", _plain(work, bs), [block], 0, 1, bs, 0)
    elif kind == "partial_at_block_end" and not m.boundary_partials:  # refused before it writes
        call("cache_partial_block", _plain(work, bs), rng.randrange(1, m.num_blocks), bs, 0, bs)
    elif kind == "cache_disabled":  # both would be legal on a pool with caching
        block = rng.randrange(1, m.num_blocks)
        call("cache_full_blocks", _plain(work, bs), [block], 0, 1, bs, 0)
        call("cache_partial_block", _plain(work, hbs), block, hbs, 0, 2 * hbs)
        if pair.supports("_insert_block_hash"):
            call("_insert_block_hash", _plain(work, hbs), hbs, 0, block, hbs)
    elif kind == "insert_bad" and pair.supports("_insert_block_hash"):
        # the null block, a primary key without its token count, a key naming no prefix
        for target, upto, tokens in ((NULL, hbs, hbs), (rng.choice(unhashed), hbs, None),
                                     (rng.choice(used or unhashed), 0, hbs)):
            call("_insert_block_hash", _plain(work, hbs), upto, 0, target, tokens)
    elif kind == "other_over_free" and work.theirs and work.other is not None:
        other, b = work.other, work.theirs[0]
        once_too_often = [(other, b)] * (other.model.ref[b] + 1)
        free_across(pair, other, [(pair, a) for a in used[:1]] + once_too_often)


def _plain(work: Workload, num_tokens: int) -> Request:
    """A request reading the first ``num_tokens`` tokens of a document (none: no block hashes)."""
    work.counter += 1
    return plain_request(work.documents, work.hasher, f"r{work.counter}", num_tokens)
