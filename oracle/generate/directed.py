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

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model.request import block_hash
from kvpool.model.state import NULL

from ..core.abstraction import same_refusal
from ..core.lockstep import Lockstep
from .features import ALL, FEATURES, IMPOSSIBLE, FeatureLog, Pair, legal_pairs

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


def _largest_sets(op: str) -> list[frozenset[str]]:
    """The largest sets of ``op``'s features no two of which are impossible together."""
    base = frozenset(f for f, (_what, ops) in FEATURES.items() if op in ops)
    clash = [p for p in IMPOSSIBLE if p <= base]
    torn = sorted({f for p in clash for f in p})
    found: list[frozenset[str]] = []
    for k in range(len(torn) + 1):
        for out in combinations(torn, k):
            keep = base - frozenset(out)
            if not any(p <= keep for p in clash) and not any(keep < f for f in found):
                found.append(keep)
    return [s for s in found if not any(s < t for t in found)]


SCENARIOS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (op, s) for op in PREFERENCE for s in _largest_sets(op))
"""Each operation with each largest set of its features that can meet in one call."""


@dataclass
class Directed:
    """Makes calls with chosen features on fresh pools of one implementation."""

    factory: Callable[..., Any]
    reference: str = "0.31"
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal
    observe: Callable[..., Any] | None = None
    calls: int = 0
    """Calls made so far, setup included."""
    made: int = field(default=0, init=False)

    def _pair(self, which: int, log: FeatureLog | None) -> Lockstep:
        pair = Lockstep.fresh(self.factory, BLOCKS, True, HBS, True, self.reference, metrics=True)
        pair.errors_match, pair.observe, pair.which, pair.features = (
            self.errors_match, self.observe, which, log)
        return pair

    def make(self, op: str, wanted: Iterable[str], log: FeatureLog | None = None) -> bool:
        """One call of ``op`` with the ``wanted`` features (as far as they go together), after
        its setup, on fresh pools; False when the pool lacks ``op``.  Raises
        :class:`~.lockstep.Divergence` as any lockstep call."""
        want = frozenset(wanted)
        first = self._pair(0, log)
        if not first.supports(op):
            return False
        pool = self._pair(1, log) if "second_pool" in want and op in FEATURES["second_pool"][1] else first
        try:
            Scene(self, pool, want).play(op)
            if op != "take_events":  # a pool that hides its pending events shows them when taken
                pool.call("take_events")
        finally:
            self.calls += first.steps + (pool.steps if pool is not first else 0)
        pool.check()
        return True

    def aim(self, pair: Pair, log: FeatureLog) -> None:
        """Make ``pair`` meet in one call: on each operation both features go with, until one does."""
        common = FEATURES[pair[0]][1] & FEATURES[pair[1]][1]
        for op in PREFERENCE:
            if op not in common:
                continue
            made = FeatureLog()
            if self.make(op, pair, made):
                log.update(made)
            if pair in made.pairs:
                return

    def cover(self, pairs: Iterable[Pair], log: FeatureLog) -> None:
        """Make each of ``pairs`` that ``log`` lacks meet (each call logged there)."""
        for pair in pairs:
            if pair not in log.pairs:
                self.aim(pair, log)


def missed_share(log: FeatureLog, run: int, runs: int, ops: Iterable[str] = ALL) -> list[Pair]:
    """The legal pairs of run ``run``'s share (index ``i % runs == run``) it did not make."""
    return [p for i, p in enumerate(legal_pairs(ops)) if i % runs == run % runs and p not in log.pairs]


@dataclass
class Scene:
    """The setup and the call of one directed scenario."""

    directed: Directed
    pair: Lockstep
    want: frozenset[str]
    counter: int = 0

    def __post_init__(self) -> None:
        self.hasher = get_request_block_hasher(HBS)
        self.group = 1 if "group1" in self.want else 0

    def call(self, op: str, *args: Any) -> Any:
        return self.pair.call(op, *args)

    def request(self, lo: int) -> Request:
        """A request with the wanted extra keys, its items placed around the chunks from ``lo``."""
        w = self.want
        items: list[tuple[int, int]] = []
        if "mm_before_chunk" in w and lo >= 2:
            items.append((0, 1))
        if "mm_several" in w:
            items.append((lo, 1))
        if "mm_spans_chunk" in w:
            items.append((lo + 1, 2))
        elif "mm_several" in w:
            items.append((lo + 1, 1))
        self.counter += 1
        return Request(
            f"d{self.counter}", list(DOCUMENT), block_hasher=self.hasher,
            lora_request=LoRARequest("lora1", 1, "/a") if "lora" in w else None,
            cache_salt="s1" if "salt" in w else None, session_id="sess" if "session" in w else None,
            mm_features=[MultiModalFeature(f"img{k}", PlaceholderRange(a, n))
                         for k, (a, n) in enumerate(items)])

    def held(self) -> int:
        """A block cached under a request (with a secondary key when wanted), held by the caller."""
        req = self.request(0)
        (block,) = self.call("get_new_blocks", 1)
        self.call("cache_full_blocks", req, [block], 0, 1, BS, self.group)
        if "secondary" in self.want:
            self.call("cache_partial_block", req, block, 2 * HBS, self.group, BS)  # shorter: secondary
        return int(block)

    def idle(self) -> int:
        """A cached block nobody holds; unpinned for a watcher when a reuse is wanted."""
        block = self.held()
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
        w, g = self.want, self.group
        req = self.request(BS)  # the call caches block 1: tokens [6, 12)
        blocks = self.call("get_new_blocks", 3)
        table = [NULL if "null_block" in w else blocks[0], blocks[1], blocks[2]]
        self.call(op, req, table, 0, 1, BS, g)
        if "sparse" in w:
            self.call(op, req, table, 1, 2, BS, g)
            self.call(op, req, table, 2, 1, BS, g)
            return
        if w & {"promotion", "secondary"}:  # a partial entry, and a shorter one beside it
            self.call("cache_partial_block", req, table[1], BS + 2 * HBS, g, BS)
            if "secondary" in w:
                self.call("cache_partial_block", req, table[1], BS + HBS, g, BS)
        self.call(op, req, table, 1, 2, BS, g, *([[True]] if "mask" in w else []))

    def _cache_partial_block(self, op: str) -> None:
        w, g = self.want, self.group
        req = self.request(BS + HBS)  # the entry ends at 10: its chunk is [8, 10)
        table = self.call("get_new_blocks", 2)
        self.call("cache_full_blocks", req, table, 0, 1, BS, g)
        if "secondary" in w:
            self.call(op, req, table[1], BS + 2 * HBS, g, BS)
            self.call(op, req, table[1], BS + HBS, g, BS)
        target = NULL if "null_block" in w and "partial" not in w else table[1]
        self.call(op, req, target, BS + 2 * HBS, g, BS, *([True] if "replace" in w else []))

    def _emit_cached_block_events(self, op: str) -> None:
        req = self.request(0)
        table = self.call("get_new_blocks", 2)
        self.call("cache_full_blocks", req, table, 0, 2, BS, self.group)
        self.call(op, req, 2, BS, self.group)

    def _insert_block_hash(self, op: str) -> None:
        req = self.request(BS + HBS)  # the key of the first 10 tokens: its chunk is [8, 10)
        (block,) = self.call("get_new_blocks", 1)
        if "secondary" in self.want:
            self.call(op, req, 2 * BS, self.group, block, 2 * BS)
            self.call(op, req, BS + 2 * HBS, self.group, block, None)
            self.call(op, req, BS + 2 * HBS, self.group, block, None)  # again: no change
        else:
            self.call(op, req, BS + 2 * HBS, self.group, block, BS + 2 * HBS)

    def _get_cached_block(self, op: str) -> None:
        req = self.request(0)
        (block,) = self.call("get_new_blocks", 1)
        self.call("cache_full_blocks", req, [block], 0, 1, BS, self.group)
        self.call("free_blocks", [block])
        self.call(op, block_hash(req, HBS, BS, 0), [self.group])

    def _touch(self, op: str) -> None:
        self.call(op, self.listed(self.idle()))

    def _get_new_blocks(self, op: str) -> None:
        self.idle()
        free = len(self.pair.model.free)
        self.call(op, free + 1 if "out_of_blocks" in self.want else free)

    def _free_blocks(self, op: str) -> None:
        block = self.held()
        if "listed_twice" in self.want:
            self.call("touch", [block])
        self.call(op, self.listed(block))

    def _unpin_blocks(self, op: str) -> None:
        block = self.held()
        if "listed_twice" in self.want:
            self.call("touch", [block])
        self.call(op, self.listed(block, null=False), self.pair.watcher("reader"))

    def _evict_blocks(self, op: str) -> None:
        block = self.held()
        self.call("free_blocks", [block])
        self.call(op, [block])

    def _maybe_evict_cached_block(self, op: str) -> None:
        block = self.held()
        self.call("free_blocks", [block])
        self.call(op, block)

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


__all__ = ["BS", "HBS", "SCENARIOS", "Directed", "Scene", "missed_share"]
