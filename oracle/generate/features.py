"""The shape features of a call, and which pairs of them met in one call: feature-interaction coverage.

Branch coverage of the model says which branches a phase reached, not
whether features met in one call; bugs live where they meet (a partial
entry's ``BlockStored`` whose chunk overlaps a multimodal item that is not
the request's last, with events on).  Each call the lockstep makes is
described by the features it has (:func:`call_features`, read off its
arguments and the model's state before it); a :class:`FeatureLog` keeps the
pairs that met in one call.

A pair is *legal* when one operation can have both features
(:data:`FEATURES` names each feature's operations; ``events`` and
``metrics``, the pool's configuration, go with every call) and it is not
in :data:`IMPOSSIBLE`, each with its reason.  :mod:`.directed` makes a call
for any legal set of features of one operation, so that every legal pair
occurs in each phase, misuse on or off.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from kvpool.model import OPERATIONS, Refusal, RefusalKind
from kvpool.model.request import prefix_key
from kvpool.model.state import NULL, PoolState

Pair = tuple[str, str]

CACHE = frozenset({"cache_full_blocks", "cache_partial_block"})
REQUEST_OPS = CACHE | {"emit_cached_block_events", "_insert_block_hash"}
EVICT = frozenset({"evict_blocks", "_maybe_evict_cached_block"})
ALL = frozenset(n for n, op in OPERATIONS.items() if op.role == "action")
ONE = frozenset

FEATURES: dict[str, tuple[str, frozenset[str]]] = {
    "lora": ("the request has a LoRA adapter", REQUEST_OPS),
    "salt": ("the request has a cache salt", REQUEST_OPS),
    "session": ("the request has a session id", REQUEST_OPS),
    "mm": ("the chunks the call hashes overlap a multimodal item", REQUEST_OPS),
    "mm_several": ("the chunks the call hashes overlap a multimodal item that is not the request's last",
                   REQUEST_OPS),
    "mm_spans_chunk": ("a multimodal item the call's chunks overlap spans a hash-chunk boundary",
                       REQUEST_OPS),
    "mm_before_chunk": ("a multimodal item lies wholly before the chunks the call hashes",
                        CACHE | {"_insert_block_hash"}),
    "group1": ("KV-cache group 1 (a second group)", REQUEST_OPS),
    "big_block": ("a block size above the hash block size", REQUEST_OPS - {"_insert_block_hash"}),
    "partial": ("a partial entry at a chunk boundary inside a real block", ONE({"cache_partial_block"})),
    "replace": ("a partial entry with replace_existing_hashes", frozenset({"cache_partial_block"})),
    "promotion": ("a block holding a partial entry cached whole", frozenset({"cache_full_blocks"})),
    "mask": ("a block mask", frozenset({"cache_full_blocks"})),
    "sparse": ("fewer full blocks asked for than are cached (a no-op)", frozenset({"cache_full_blocks"})),
    "null_block": ("the null block among the blocks (a sliding-window table)",
                   CACHE | {"free_blocks", "touch"}),
    "listed_twice": ("a block listed twice in one call", frozenset({"free_blocks", "touch", "unpin_blocks"})),
    "watcher": ("blocks unpinned for a reuse watcher", frozenset({"unpin_blocks"})),
    "reuse_fired": ("a watched block taken again (its watcher fires)", ONE({"get_new_blocks", "touch"})),
    "idle_hit": ("a prefix hit on an idle cached block", frozenset({"get_cached_block", "touch"})),
    "evicting_alloc": ("an allocation that evicts a cached block", frozenset({"get_new_blocks"})),
    "secondary": ("a block of the call has secondary (partial-prefix) keys",
                  CACHE | EVICT | {"free_blocks", "touch", "unpin_blocks", "move_block_hashes",
                                   "_insert_block_hash", "get_new_blocks"}),
    "move": ("a hashed block's keys moved to a copy", frozenset({"move_block_hashes"})),
    "insert": ("a key copied from another pool (_insert_block_hash)", frozenset({"_insert_block_hash"})),
    "evict": ("a cached block evicted by the caller", EVICT),
    "reset": ("the prefix cache reset", frozenset({"reset_prefix_cache"})),
    "emit": ("hits announced (emit_cached_block_events)", frozenset({"emit_cached_block_events"})),
    "take": ("pending events taken", frozenset({"take_events"})),
    "second_pool": ("a call on a second pool of the same implementation",
                    CACHE - {"cache_partial_block"} | {"get_new_blocks", "touch", "free_blocks"}),
    "out_of_blocks": ("an allocation refused for lack of blocks", frozenset({"get_new_blocks"})),
    "events": ("KV events on", ALL),
    "metrics": ("a metrics collector attached", ALL),
}
"""Each feature: what it is, and the operations a call with it can be."""

IMPOSSIBLE: dict[frozenset[str], str] = {
    frozenset({"partial", "null_block"}): "a partial entry on the null block registers nothing",
    **{frozenset({"sparse", f}): "a call asking for fewer blocks than are cached caches none"
       for f in ("promotion", "mask", "secondary", "mm", "mm_several", "mm_spans_chunk", "mm_before_chunk")},
    **{frozenset({"out_of_blocks", f}): "a refused allocation takes no block"
       for f in ("evicting_alloc", "reuse_fired", "secondary")},
}
"""Pairs that share an operation but cannot meet in one legal call, each with the reason."""


SHAPES: dict[str, str] = {
    "several_groups": "several KV-cache groups (a group id other than 0)",
    "caching_off": "a pool built without prefix caching",
    "misuse": "deliberately wrong calls, refused with the model's error names",
}
"""What a pool may lack besides operations and call features: shapes of the pool itself."""

NEEDS: dict[str, tuple[frozenset[str], ...]] = {
    "group1": (ONE({"several_groups"}),),
    **{f: (ONE({"mm"}),) for f in ("mm_several", "mm_spans_chunk", "mm_before_chunk")},
    "partial": (ONE({"big_block"}),),
    "promotion": (ONE({"partial"}),),
    "secondary": (ONE({"partial", "insert"}),),
    "reuse_fired": (ONE({"watcher"}),),
    "take": (ONE({"events"}),),
    "emit": (ONE({"events"}),),
}
"""What a feature cannot be without: each group names alternatives, one of which the pool must have
(a partial entry inside a block needs a block size above the hash block size; a secondary key comes
from a partial entry or an inserted key)."""

ON_NEEDS: dict[tuple[str, str], tuple[frozenset[str], ...]] = {
    ("secondary", "cache_full_blocks"): (ONE({"promotion"}),),
    ("secondary", "cache_partial_block"): (ONE({"partial", "replace"}),),
}
"""What a feature cannot be without on one operation: a block cached whole that has a secondary key
is being promoted; a partial entry on a block with keys needs one inside it, or a rewrite."""

IMPOSSIBLE_ON: dict[str, tuple[frozenset[str], ...]] = {
    "cache_partial_block": (frozenset({"null_block", "secondary"}),),
}
"""Pairs that cannot meet in one call of one operation (they may in another's): a partial entry
offered on the null block touches no block, so none of its keys."""

ALWAYS: dict[str, str] = {"unpin_blocks": "watcher", "_insert_block_hash": "insert"}
"""Operations every call of which has a feature: lacking the feature is lacking the operation."""

CORE: tuple[str, ...] = ("get_new_blocks", "free_blocks", "touch", "cache_full_blocks", "get_cached_block",
                         "get_num_free_blocks", "is_block_writable")
"""The operations every pool has: blocks handed out, cached, hit, released; what a caller sees of them."""
DECLARABLE: tuple[str, ...] = (
    *sorted(n for n, op in OPERATIONS.items() if op.role != "caller" and n not in CORE),
    *sorted(FEATURES), *sorted(SHAPES))
"""Every name a pool may declare it lacks: operations (but :data:`CORE`), call features, pool shapes."""


def closed(lacks: Iterable[str]) -> frozenset[str]:
    """``lacks`` with everything it implies: the features that need them, the operations whose
    every call has one, the features no operation the pool has can have.

    Raises ``ValueError`` naming a name that is none of :data:`DECLARABLE`.
    """
    out = set(lacks)
    core = sorted(out & set(CORE))
    if core:
        raise ValueError(f"{', '.join(core)}: every pool has these ({', '.join(CORE)}); a pool may lack "
                         "another operation, a feature or a shape")
    unknown = sorted(out - set(DECLARABLE))
    if unknown:
        close = [m for n in unknown for m in difflib.get_close_matches(n, DECLARABLE, 1)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown name(s) {', '.join(map(repr, unknown))}{hint}: a pool may lack an "
                         f"operation, a feature or a shape ({', '.join(DECLARABLE)})")
    while True:
        more = {f for f, groups in NEEDS.items() if any(g <= out for g in groups)}
        more |= {op for op, f in ALWAYS.items() if f in out}
        more |= {f for f, (_what, ops) in FEATURES.items() if ops & ALL and ops & ALL <= out}
        if more <= out:
            return frozenset(out)
        out |= more


def legal_pairs(ops: Iterable[str] = ALL, lacks: Iterable[str] = ()) -> list[Pair]:
    """Every legal pair among the operations ``ops`` (those a pool has) and the features it has."""
    gone = closed(lacks)
    have = frozenset(ops) - gone
    out = []
    for a, b in combinations(sorted(FEATURES), 2):
        if a in gone or b in gone or frozenset({a, b}) in IMPOSSIBLE:
            continue
        shared = FEATURES[a][1] & FEATURES[b][1] & have
        if any(possible(a, op, gone) and possible(b, op, gone)
               and frozenset({a, b}) not in IMPOSSIBLE_ON.get(op, ()) for op in shared):
            out.append((a, b))
    return out


def possible(feature: str, op: str, lacks: frozenset[str]) -> bool:
    """Whether a call of ``op`` can have ``feature`` in a pool lacking ``lacks`` (closed)."""
    return (op in FEATURES[feature][1] and feature not in lacks
            and not any(g <= lacks for g in ON_NEEDS.get((feature, op), ())))


# ------------------------------------------------------------------ one call


def call_features(s: PoolState, op: str, bound: Sequence[Any], *, second: bool = False,
                  metrics: bool = False) -> set[str]:
    """The features a call of ``op`` with ``bound`` arguments has, on the model's state before it."""
    named = dict(zip((a.name for a in OPERATIONS[op].args), bound, strict=False))
    hbs, size, tokens = s.hash_block_size, named.get("block_size"), named.get("num_tokens")
    ids = [b for b in _ids(named) if isinstance(b, int) and 0 <= b < s.num_blocks]
    real = [b for b in ids if b != NULL]
    touched = real  # the blocks whose keys the call reaches
    if op == "get_new_blocks":
        count = named.get("num_blocks")
        touched = list(s.free)[:count] if isinstance(count, int) and 0 <= count <= len(s.free) else []
    elif op == "cache_full_blocks":
        touched = [b for _i, b in _indexed(named)]
    h, groups = named.get("block_hash"), named.get("kv_cache_group_ids") or ()
    hits = [s.index.get((h, g), ()) for g in groups] if isinstance(h, bytes) else []
    full, partial = op == "cache_full_blocks", op == "cache_partial_block"
    has = {
        "events": s.events_on, "metrics": metrics, "second_pool": second, "null_block": NULL in ids,
        "listed_twice": len(real) != len(set(real)),
        "group1": named.get("kv_cache_group_id") == 1 or 1 in groups,
        "big_block": isinstance(size, int) and size > hbs,
        "evicting_alloc": op == "get_new_blocks" and any(s.primary[b] is not None for b in touched),
        "reuse_fired": op in ("get_new_blocks", "touch") and any(b in s.watchers for b in touched),
        "promotion": full and any(_partial_of(s, b, (i + 1) * (size or 0)) for i, b in _indexed(named)),
        "mask": full and named.get("block_mask") is not None,
        "sparse": full and (named.get("num_full_blocks") or 0) < (named.get("num_cached_blocks") or 0),
        "secondary": (any(s.secondary[b] for b in touched if 0 <= b < s.num_blocks)
                      or _gains_secondary(s, op, named, real)),
        "partial": (partial and real and isinstance(size, int) and isinstance(tokens, int) and size
                    and tokens % size),
        "replace": partial and named.get("replace_existing_hashes"),
        "idle_hit": ((op == "touch" and any(s.ref[b] == 0 and s.primary[b] is not None for b in real))
                     or (op == "get_cached_block" and any(hit and s.ref[hit[0]] == 0 for hit in hits))),
        "move": op == "move_block_hashes" and real and s.primary[real[0]] is not None,
        "evict": op in EVICT and any(s.primary[b] is not None for b in real),
        "reset": op == "reset_prefix_cache" and not any(s.ref[b] for b in range(1, s.num_blocks)),
        "emit": op == "emit_cached_block_events" and (named.get("num_cached_blocks") or 0) > 0,
        "take": op == "take_events" and s.events,
        **{f: ALWAYS.get(op) == f for f in ALWAYS.values()},
    }
    out = {f for f, on in has.items() if on}
    out |= _request_features(named.get("request"), _span(op, named, hbs), hbs)
    return {f for f in out if op in FEATURES[f][1]}


def _gains_secondary(s: PoolState, op: str, named: dict[str, Any], real: list[int]) -> bool:
    """Whether the call gives a hashed block a second key (a shorter partial entry, a copied key)."""
    if op not in ("cache_partial_block", "_insert_block_hash") or not real:
        return False
    if named.get("replace_existing_hashes"):
        return False
    p = s.primary[real[0]]
    tokens = named.get("num_tokens" if op == "cache_partial_block" else "prefix_tokens")
    if p is None or (op == "cache_partial_block" and (not isinstance(tokens, int) or p.num_tokens < tokens)):
        return False
    hbs, request = s.hash_block_size, named.get("request")
    if not (isinstance(tokens, int) and tokens > 0 and not tokens % hbs
            and tokens // hbs <= len(getattr(request, "block_hashes", ()))):
        return False  # refused: no key is added
    key = prefix_key(request, tokens, hbs, named.get("kv_cache_group_id", 0))
    return key != p.key and real[0] not in s.index.get(key, ())


def _ids(named: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for name in ("block_ids", "block_id", "src_id"):
        value = named.get(name)
        out += value if isinstance(value, list) else [value] if value is not None else []
    return out


def _indexed(named: dict[str, Any]) -> list[tuple[int, int]]:
    """The (table index, block) pairs a ``cache_full_blocks`` call caches (unmasked, real)."""
    blocks = named.get("block_ids") or []
    lo, hi = named.get("num_cached_blocks"), named.get("num_full_blocks")
    if not isinstance(lo, int) or not isinstance(hi, int):
        return []
    mask = named.get("block_mask")
    return [(i, blocks[i]) for i in range(max(lo, 0), min(hi, len(blocks)))
            if blocks[i] != NULL and (mask is None or (i - lo < len(mask) and mask[i - lo]))]


def _partial_of(s: PoolState, b: Any, full: int) -> bool:
    """Whether block ``b`` holds a partial entry (a prefix shorter than the block's end)."""
    p = s.primary[b] if isinstance(b, int) and 0 <= b < s.num_blocks else None
    return p is not None and p.num_tokens < full


def _span(op: str, named: dict[str, Any], hbs: int) -> tuple[int, int]:
    """The tokens of the chunks the call hashes (empty when none)."""
    size = named.get("block_size") or 0
    if op == "cache_full_blocks":
        return (named.get("num_cached_blocks") or 0) * size, (named.get("num_full_blocks") or 0) * size
    if op == "cache_partial_block" or op == "_insert_block_hash":
        end = named.get("num_tokens") if op == "cache_partial_block" else named.get("prefix_tokens")
        return (end - hbs, end) if isinstance(end, int) and end > 0 else (0, 0)
    if op == "emit_cached_block_events":
        return 0, (named.get("num_cached_blocks") or 0) * size
    return 0, 0


def _request_features(request: Any, span: tuple[int, int], hbs: int) -> set[str]:
    """The features of the call's request (None: none): its extra keys, where its items lie."""
    lo, hi = span
    items = [(f.mm_position.offset, f.mm_position.offset + f.mm_position.length)
             for f in getattr(request, "mm_features", ())] if hi > lo else []
    over = [(k, a, b) for k, (a, b) in enumerate(items) if a < hi and b > lo]
    has = {"lora": getattr(request, "lora_request", None) is not None,
           "salt": getattr(request, "cache_salt", None), "session": getattr(request, "session_id", None),
           "mm": over, "mm_several": any(k < len(items) - 1 for k, _a, _b in over),
           "mm_spans_chunk": any(a // hbs != (b - 1) // hbs for _k, a, b in over),
           "mm_before_chunk": any(b <= lo for _a, b in items)}
    return {f for f, on in has.items() if on}


# ------------------------------------------------------------------ a phase's pairs


@dataclass
class FeatureLog:
    """The features of the calls made, and the pairs that met in one call."""

    pairs: set[Pair] = field(default_factory=set)
    features: set[str] = field(default_factory=set)

    def add(self, features: set[str]) -> None:
        self.features |= features
        self.pairs.update(combinations(sorted(features), 2))

    def update(self, other: FeatureLog) -> None:
        self.pairs |= other.pairs
        self.features |= other.features


def kept(features: set[str], op: str, error: BaseException | None) -> set[str]:
    """The features a call made counts for: its own if accepted; if refused, only an allocation
    refused for lack of blocks counts (``out_of_blocks``), a misuse none."""
    if error is None:
        return features
    if (op == "get_new_blocks" and isinstance(error, Refusal)
            and error.kind is RefusalKind.NOT_ENOUGH_FREE_BLOCKS):
        return features | {"out_of_blocks"}
    return set()


@dataclass(frozen=True)
class PairCoverage:
    """The legal pairs of features one phase made meet in one call."""

    phase: str
    misuse: bool
    met: int
    legal: int
    missed: tuple[Pair, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "missed": ["+".join(p) for p in self.missed]}


def pair_coverage(log: FeatureLog, phase: str, misuse: bool, ops: Iterable[str] = ALL,
                  lacks: Iterable[str] = ()) -> PairCoverage:
    legal = legal_pairs(ops, lacks)
    missed = tuple(p for p in legal if p not in log.pairs)
    return PairCoverage(phase, misuse, len(legal) - len(missed), len(legal), missed)


__all__ = ["ALWAYS", "CORE", "DECLARABLE", "FEATURES", "IMPOSSIBLE", "IMPOSSIBLE_ON", "NEEDS", "ON_NEEDS",
           "SHAPES",
           "FeatureLog", "Pair", "PairCoverage", "call_features", "closed", "kept", "legal_pairs",
           "pair_coverage", "possible"]
