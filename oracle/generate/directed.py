"""Calls made with chosen features: the generator that makes every legal pair of features meet.

Random workloads make each feature often and most pairs of them, but not
all: a pair that needs two rare choices at once (a multimodal item spanning
a chunk boundary in a masked promotion, a reuse watcher firing on a block
listed twice) may never come.  :class:`Directed` makes one call of a chosen
operation with a chosen set of features (:mod:`.features`), on fresh pools
(caching, events and a metrics collector on; a block of three hash chunks,
so that partial entries have two boundaries inside a block), after the few
calls that set it up; every call goes through the lockstep, so the pool is
compared with the model on all of them.

The campaign aims each run at the legal pairs of its share that the run
itself missed (:func:`missed_share`: the pairs ``i`` with ``i % runs ==
run``, so a shard's runs are the whole run's); the state machine draws a
scenario (:data:`SCENARIOS`: each operation with a largest set of its
features that can meet) and features to leave out, so that a failure
shrinks to the few that matter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model.request import block_hash
from kvpool.model.state import NULL

from ..core.abstraction import same_refusal
from ..core.lockstep import Lockstep
from .capabilities import Unmakeable
from .features import (
    ALL,
    FEATURES,
    IMPOSSIBLE,
    IMPOSSIBLE_ON,
    FeatureLog,
    Pair,
    closed,
    legal_pairs,
    possible,
)

HBS, BS = 2, 6
"""The hash block size and the block size of directed calls (three chunks: two boundaries inside)."""
BLOCKS = 12
DOCUMENT = [(7 * i + 3) % 50 for i in range(24)]
"""The tokens every directed request reads (four blocks)."""
PREFERENCE = ("cache_full_blocks", "cache_partial_block", "touch", "get_new_blocks", "free_blocks",
              "unpin_blocks", "emit_cached_block_events", "_insert_block_hash", "get_cached_block",
              "evict_blocks", "_maybe_evict_cached_block", "move_block_hashes", "reset_prefix_cache",
              "take_events")
"""The operations in the order a pair's call is tried on (the richest first)."""


def _largest_sets(op: str, lacks: frozenset[str] = frozenset()) -> list[frozenset[str]]:
    """The largest sets of ``op``'s features (those the pool has) no two of which are impossible
    together."""
    base = frozenset(f for f in FEATURES if possible(f, op, lacks))
    clash = [p for p in (*IMPOSSIBLE, *IMPOSSIBLE_ON.get(op, ())) if p <= base]
    torn = sorted({f for p in clash for f in p})
    found: list[frozenset[str]] = []
    for k in range(len(torn) + 1):
        for out in combinations(torn, k):
            keep = base - frozenset(out)
            if not any(p <= keep for p in clash) and not any(keep < f for f in found):
                found.append(keep)
    return [s for s in found if not any(s < t for t in found)]


def scenarios(lacks: frozenset[str] = frozenset()) -> tuple[tuple[str, frozenset[str]], ...]:
    """Each operation the pool has with each largest set of its features that can meet in one call."""
    gone = closed(lacks)
    return tuple((op, s) for op in PREFERENCE if op not in gone for s in _largest_sets(op, gone))


SCENARIOS: tuple[tuple[str, frozenset[str]], ...] = scenarios()
"""Each operation with each largest set of its features that can meet in one call (a whole pool)."""


@dataclass
class Directed:
    """Makes calls with chosen features on fresh pools of one implementation."""

    factory: Callable[..., Any]
    reference: str = "0.31"
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal
    observe: Callable[..., Any] | None = None
    calls: int = 0
    """Calls made so far, setup included."""
    lacks: frozenset[str] = frozenset()
    """What the pool lacks (closed): no call with any of it, pools without events or metrics."""

    def __post_init__(self) -> None:
        self.lacks = closed(self.lacks)

    def _pair(self, which: int, log: FeatureLog | None) -> Lockstep:
        return Lockstep.fresh(self.factory, BLOCKS, True, HBS, "events" not in self.lacks, self.reference,
                              metrics="metrics" not in self.lacks, errors_match=self.errors_match,
                              observe=self.observe, which=which, features=log)

    def make(self, op: str, wanted: Iterable[str], log: FeatureLog | None = None) -> bool:
        """One call of ``op`` with the ``wanted`` features (as far as they go together), after
        its setup, on fresh pools; False when the pool lacks ``op``.  Raises
        :class:`~.lockstep.Divergence` as any lockstep call."""
        want = frozenset(wanted) - self.lacks
        if op in self.lacks:
            return False
        first = self._pair(0, log)
        if not first.supports(op):
            return False
        pool = self._pair(1, log) if "second_pool" in want and op in FEATURES["second_pool"][1] else first
        try:
            Scene(self, pool, want).play(op)
            if op != "take_events" and "take" not in self.lacks:  # a pool hiding pending events shows them
                pool.call("take_events")
        except Unmakeable:  # this scene needs what the pool lacks: no call of it was made
            return False
        finally:
            self.calls += first.steps + (pool.steps if pool is not first else 0)
        pool.check()
        return True

    def cover(self, pairs: Iterable[Pair], log: FeatureLog) -> None:
        """Make each of ``pairs`` that ``log`` lacks meet in one call (each call logged there): on
        each operation both features go with, until one does."""
        for pair in pairs:
            common = FEATURES[pair[0]][1] & FEATURES[pair[1]][1]
            for op in PREFERENCE:
                if pair in log.pairs:
                    break
                if op in common and op not in self.lacks:
                    made = FeatureLog()
                    self.make(op, pair, made)
                    log.update(made)  # every call made was compared, those of a scene cut short too


def missed_share(log: FeatureLog, run: int, runs: int, ops: Iterable[str] = ALL,
                 lacks: Iterable[str] = ()) -> list[Pair]:
    """The legal pairs of run ``run``'s share (index ``i % runs == run``) it did not make."""
    return [p for i, p in enumerate(legal_pairs(ops, lacks)) if i % runs == run % runs and p not in log.pairs]


@dataclass
class Scene:
    """The setup and the call of one directed scenario.

    Blocks are three hash chunks (two boundaries inside for partial entries),
    or one when the pool lacks big blocks; a block gains a secondary key from a
    shorter partial entry, or, in a pool without partial entries, from a key
    copied in (``_insert_block_hash``)."""

    directed: Directed
    pair: Lockstep
    want: frozenset[str]
    counter: int = 0

    def __post_init__(self) -> None:
        self.hasher = get_request_block_hasher(HBS)
        self.group = 1 if "group1" in self.want else 0
        self.bs = HBS if "big_block" in self.directed.lacks else BS

    def call(self, op: str, *args: Any) -> Any:
        return self.pair.call(op, *args)

    def optional(self, op: str, *args: Any) -> None:
        """A setup call the scene can do without: left out when it has something the pool lacks."""
        with contextlib.suppress(Unmakeable):
            self.pair.call(op, *args)

    def request(self, lo: int, plain: bool = False) -> Request:
        """A request with the wanted extra keys, its items placed around the chunks from ``lo``
        (``plain``: none)."""
        w = frozenset() if plain else self.want
        spans = "mm_spans_chunk" in w
        several = "mm_several" in w
        items = [item for item, on in (((0, 1), "mm_before_chunk" in w and lo >= 2),
                                       ((lo, 1), several or ("mm" in w and not spans)),
                                       ((lo + 1, 2), spans), ((lo + 1, 1), several and not spans)) if on]
        self.counter += 1
        return Request(
            f"d{self.counter}", list(DOCUMENT), block_hasher=self.hasher,
            lora_request=LoRARequest("lora1", 1, "/a") if "lora" in w else None,
            cache_salt="s1" if "salt" in w else None, session_id="sess" if "session" in w else None,
            mm_features=[MultiModalFeature(f"img{k}", PlaceholderRange(a, n))
                         for k, (a, n) in enumerate(items)])

    def second_key(self, req: Request, block: int, index: int) -> None:
        """Give ``block`` (cached as table entry ``index`` of ``req``) a secondary key."""
        bs = self.bs
        if "partial" not in self.directed.lacks:  # a shorter partial entry beside its own
            self.call("cache_partial_block", req, block, index * bs + HBS, self.group, bs)
            return
        # the key of another prefix of the request, copied in: a block shorter (it holds the start
        # of its own), or for the first block one chunk longer
        prefix = index * bs if index else bs + HBS
        self.call("_insert_block_hash", req, prefix, self.group, block, None)

    def held(self, cached: bool = True) -> int:
        """A block (cached under a request, with a secondary key when wanted), held by the caller."""
        req = self.request(0, plain=True)  # the calls it sets up for are not the request's
        (block,) = self.call("get_new_blocks", 1)
        if cached:
            self.call("cache_full_blocks", req, [block], 0, 1, self.bs, self.group)
            if "secondary" in self.want:
                self.second_key(req, block, 0)
        return int(block)

    def idle(self, cached: bool = True) -> int:
        """A block nobody holds (cached unless not ``cached``); unpinned for a watcher when a
        reuse is wanted."""
        block = self.held(cached)
        if "reuse_fired" in self.want:
            self.call("unpin_blocks", [block], self.pair.watcher("reader"))
        else:
            self.call("free_blocks", [block])
        return block

    def listed(self, block: int, null: bool = True) -> list[int]:
        twice = [block] if "listed_twice" in self.want else []
        return [NULL] * (null and "null_block" in self.want) + [block] + twice

    def play(self, op: str) -> None:
        getattr(self, "_" + op.lstrip("_"))(op)

    # ------------------------------------------------------------ one per operation

    def _cache_full_blocks(self, op: str) -> None:
        w, g, bs = self.want, self.group, self.bs
        entry = bool(w & {"promotion", "secondary"})  # items in the partial entry's chunk too
        req = self.request(bs + HBS if entry else bs)  # the call caches block 1: tokens [bs, 2 bs)
        blocks = self.call("get_new_blocks", 3)
        table = [NULL if "null_block" in w else blocks[0], blocks[1], blocks[2]]
        self.optional(op, req, table, 0, 1, bs, g)
        if "sparse" in w:
            self.call(op, req, table, 1, 2, bs, g)
            self.call(op, req, table, 2, 1, bs, g)
            return
        if entry:  # a partial entry, and a shorter one beside it
            self.call("cache_partial_block", req, table[1], bs + 2 * HBS, g, bs)
            if "secondary" in w:
                self.call("cache_partial_block", req, table[1], bs + HBS, g, bs)
        self.call(op, req, table, 1, 2, bs, g, *([[True]] if "mask" in w else []))

    def _cache_partial_block(self, op: str) -> None:
        """At a chunk boundary inside block 1; in a pool without partial entries at its end, as a
        rewrite (vLLM 0.31), or on the null block when rewrites are lacked too."""
        w, g, bs, lacks = self.want, self.group, self.bs, self.directed.lacks
        inside = "partial" not in lacks
        end = bs + 2 * HBS if inside else 2 * bs
        rewrite = not inside and not self.pair.model.boundary_partials
        req = self.request(end - HBS)  # the entry's chunk is [end - hbs, end)
        table = self.call("get_new_blocks", 2)
        self.optional("cache_full_blocks", req, table, 0, 1, bs, g)
        if "secondary" in w:
            self.call(op, req, table[1], end, g, bs, *([True] if rewrite else []))
            self.second_key(req, table[1], 1)
        null = ("null_block" in w and "partial" not in w) or (rewrite and "replace" in lacks)
        flag = [True] if "replace" in w or rewrite else []
        self.call(op, req, NULL if null else table[1], end, g, bs, *flag)

    def _emit_cached_block_events(self, op: str) -> None:
        req = self.request(0)
        table = self.call("get_new_blocks", 2)
        self.optional("cache_full_blocks", req, table, 0, 2, self.bs, self.group)
        self.call(op, req, 2, self.bs, self.group)

    def _insert_block_hash(self, op: str) -> None:
        bs = self.bs
        req = self.request(bs + HBS)  # the key of the first bs + 2 hbs tokens: its chunk is [bs + hbs, ...)
        (block,) = self.call("get_new_blocks", 1)
        if "secondary" in self.want:
            self.call(op, req, 2 * bs + 2 * HBS, self.group, block, 2 * bs + 2 * HBS)
            self.call(op, req, bs + 2 * HBS, self.group, block, None)
            self.call(op, req, bs + 2 * HBS, self.group, block, None)  # again: no change
        else:
            self.call(op, req, bs + 2 * HBS, self.group, block, bs + 2 * HBS)

    def _get_cached_block(self, op: str) -> None:
        req = self.request(0)
        (block,) = self.call("get_new_blocks", 1)
        self.call("cache_full_blocks", req, [block], 0, 1, self.bs, self.group)
        self.call("free_blocks", [block])
        self.call(op, block_hash(req, HBS, self.bs, 0), [self.group])

    def _touch(self, op: str) -> None:
        self.call(op, self.listed(self.idle("idle_hit" not in self.directed.lacks)))

    def _get_new_blocks(self, op: str) -> None:
        self.idle("evicting_alloc" not in self.directed.lacks)
        free = len(self.pair.model.free)
        self.call(op, free + 1 if "out_of_blocks" in self.want else free)

    def _free_blocks(self, op: str) -> None:
        """Also ``unpin_blocks``, which names a watcher and no null block."""
        block = self.held()
        if "listed_twice" in self.want:
            self.call("touch", [block])
        unpin = op == "unpin_blocks"
        self.call(op, self.listed(block, null=not unpin), *([self.pair.watcher("reader")] if unpin else []))

    _unpin_blocks = _free_blocks

    def _evict_blocks(self, op: str) -> None:
        """Also ``_maybe_evict_cached_block``, which takes the block alone, not a list."""
        block = self.held()
        self.call("free_blocks", [block])
        self.call(op, [block] if op == "evict_blocks" else block)

    _maybe_evict_cached_block = _evict_blocks

    def _move_block_hashes(self, op: str) -> None:
        block = self.held()
        (copy,) = self.call("get_new_blocks", 1)
        self.call(op, block, copy)

    def _reset_prefix_cache(self, op: str) -> None:
        self.call("free_blocks", [self.held()])
        self.call(op)

    def _take_events(self, op: str) -> None:
        self.held()
        self.call(op)


__all__ = ["BS", "HBS", "SCENARIOS", "Directed", "Scene", "missed_share", "scenarios"]
