"""One observation of a whole pool, in the model's vocabulary, at the level the pool allows.

Black box, always: only what the reference API makes public — each block's
``ref_cnt`` and ``block_hash`` (and ``block_hash_num_tokens`` if the block has
it), the free queue through ``free_block_queue.get_all_free_blocks()`` and
``num_free_blocks``, and the index through ``get_cached_block`` for the keys
the caller asks about (:class:`Observer` ``probes``).  Watcher calls, events
and metrics-collector calls are compared by the lockstep as they happen.

API only, for a pool whose blocks do not show their counts (a pool in another
process or behind FFI, :mod:`kvpool.oracle.drive`): nothing but calls. The free
count comes from ``get_num_free_blocks()``, each block's "may its sole owner
write into it" from ``is_block_writable`` (ref count 1, no hash), and the index
from ``get_cached_block`` on the probed keys; the ref counts, the free queue's
order and the blocks' keys are ``None``: not observable, never compared.

White box, where the pool exposes vLLM's internals: the whole index
multimap (``cached_block_hash_to_block._cache``) with its per-key order, each
block's secondary keys (``cached_block_hashes_by_block``), the registered
watchers (``_reuse_watchers``), the free queue's links walked both ways
(``fake_free_list_head``/``tail``), kvpool's block holders, and the pending
events (``kv_event_queue``).  A check whose internals are missing is
reported as skipped, never failed.

Every walk of links is bounded by the pool's size: a cycle, such as a
block queued twice, is reported with the block it loops at.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from kvpool.model.state import Key, PoolState

from .abstraction import concrete_key, key_of, pool_event, short

API_ONLY = "api-only"
"""The level of a pool seen only through its calls."""
WHITE_BOX = ("free-queue links", "index multimap", "secondary keys", "registered watchers",
             "block holders", "pending events")
"""The checks that need a pool's internals, by the name a report shows."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the oracle saw of a pool, block ids for blocks; ``None``: not observable there."""

    ref: tuple[int, ...] | None
    free: tuple[int, ...] | None
    num_free: int
    primary: tuple[tuple[Key, int | None] | None, ...] | None
    """Per block: its primary key and the tokens it covers (``None`` if the block hides that)."""
    lookups: tuple[tuple[Key, int | None], ...] = ()
    """Probed keys and the block ``get_cached_block`` returns for each (``None``: a miss)."""
    secondary: tuple[tuple[Key, ...], ...] | None = None
    index: tuple[tuple[Key, tuple[int, ...]], ...] | None = None
    watched: tuple[int, ...] | None = None
    writable: tuple[bool, ...] | None = None
    """Per block, ``is_block_writable``: seen where nothing else of a block is (API only)."""

    def diff(self, other: Observation) -> list[str]:
        """Readable differences of the parts both observed, model side first (empty when equal)."""
        return [f"{name}: {_differing(name, getattr(self, name), getattr(other, name))}"
                for name in self.differing_parts(other)]

    def differing_parts(self, other: Observation) -> list[str]:
        """The names of the parts that differ."""
        return [f.name for f in fields(self)
                if None not in (getattr(self, f.name), getattr(other, f.name))
                and getattr(self, f.name) != getattr(other, f.name)]


def _differing(name: str, mine: Any, theirs: Any) -> str:
    """``model X | pool Y``, narrowed to the blocks or keys that differ when there are many."""
    if name in ("ref", "primary", "secondary", "writable") and len(mine) == len(theirs):
        at = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        return "; ".join(f"block {i}: model {short(mine[i])} | pool {short(theirs[i])}" for i in at)
    if name in ("index", "lookups"):
        a, b = dict(mine), dict(theirs)
        keys = sorted(set(a) | set(b), key=repr)
        return "; ".join(f"{short(k)}: model {short(a.get(k))} | pool {short(b.get(k))}"
                         for k in keys if a.get(k) != b.get(k))
    return f"model {short(mine)} | pool {short(theirs)}"


@dataclass(frozen=True, slots=True)
class BlockView:
    """One block as the oracle sees it; ``None`` in a part the pool does not show."""

    ref: int
    primary: tuple[Key, int | None] | None
    secondary: tuple[Key, ...] | None
    watched: bool | None
    links: tuple[int | None, int | None] | str | None
    """Its neighbours in the free queue (None at an end), ``"out"`` when not queued."""

    def agrees(self, other: BlockView) -> bool:
        """Whether every part both sides show is equal (cheap: no message is made)."""
        return self == other or not self.diff(other)

    def diff(self, other: BlockView) -> list[str]:
        """The parts both sides show that differ, model side first."""
        out = []
        for f in ("ref", "primary", "secondary", "watched", "links"):
            mine, theirs = getattr(self, f), getattr(other, f)
            if f == "primary" and mine is not None and theirs is not None and theirs[1] is None:
                mine = (mine[0], None)
            if f != "primary" and (mine is None or theirs is None):
                continue  # a part the pool does not show
            if mine != theirs:
                out.append(f"{f}: model {short(mine)} | pool {short(theirs)}")
        return out


def model_block_view(s: PoolState, b: int) -> BlockView:
    """Block ``b`` as the specification predicts it."""
    p = s.primary[b]
    links: tuple[int | None, int | None] | str = s.free.neighbours(b) if b in s.free else "out"
    return BlockView(s.ref[b], None if p is None else (p.key, p.num_tokens),
                     tuple(sorted(s.secondary[b])), b in s.watchers, links)


def model_entries(s: PoolState, key: Key, whole: bool) -> tuple[int, ...] | int | None:
    """The model's index entries of ``key`` (``whole``), or the block a lookup returns."""
    blocks = s.index.get(key, ())
    return blocks if whole else blocks[0] if blocks else None


def observe_model(s: PoolState, probes: Iterable[Key] = ()) -> Observation:
    """The observation the specification predicts (every part)."""
    return Observation(
        ref=tuple(s.ref),
        free=tuple(s.free),
        num_free=len(s.free),
        primary=tuple(None if p is None else (p.key, p.num_tokens) for p in s.primary),
        lookups=tuple((k, s.index[k][0] if s.index.get(k) else None) for k in probes),
        secondary=tuple(tuple(sorted(keys)) for keys in s.secondary),
        index=tuple(sorted(s.index.items())),
        watched=tuple(s.watchers),
    )


def comparable(model: Observation, pool: Observation) -> Observation:
    """The model's observation reduced to what the pool's observation shows."""
    primary = model.primary
    if pool.primary and primary and any(p is not None and p[1] is None for p in pool.primary):
        primary = tuple(None if p is None else (p[0], None) for p in primary)
    writable = None
    if pool.writable is not None and model.ref is not None and model.primary is not None:
        writable = tuple(b != 0 and r == 1 and p is None
                         for b, (r, p) in enumerate(zip(model.ref, model.primary, strict=True)))
    return replace(model, primary=primary,
                   secondary=None if pool.secondary is None else model.secondary,
                   index=None if pool.index is None else model.index,
                   watched=None if pool.watched is None else model.watched,
                   writable=writable)


class Observer:
    """How the oracle sees one pool: the public surface always, vLLM's internals if present."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        queue = getattr(pool, "free_block_queue", None)
        self.api_only = queue is None or not all(hasattr(b, "ref_cnt") for b in pool.blocks[:1])
        """Whether the pool is seen only through its calls (see the module docstring)."""
        index = getattr(pool, "cached_block_hash_to_block", None)
        self.has = {
            "free-queue links": all(hasattr(queue, a) for a in ("fake_free_list_head",
                                                                "fake_free_list_tail")),
            "index multimap": isinstance(getattr(index, "_cache", None), dict),
            "secondary keys": isinstance(getattr(pool, "cached_block_hashes_by_block", None), dict),
            "registered watchers": isinstance(getattr(pool, "_reuse_watchers", None), dict),
            "block holders": getattr(queue, "owner", None) is pool,
            "pending events": isinstance(getattr(pool, "kv_event_queue", None), list),
        }
        self.num_tokens = all(hasattr(b, "block_hash_num_tokens") for b in pool.blocks[:1])
        self._batched: bool | None = None
        """Whether the pool answers a footprint's questions in one ``observe_calls`` (asked once)."""

    @property
    def level(self) -> str:
        """``white-box`` (every internal check runs), ``black-box`` (none), ``mixed``, or
        ``api-only`` (only calls: :data:`API_ONLY`)."""
        if self.api_only:
            return API_ONLY
        ran = sum(self.has.values())
        return "white-box" if ran >= len(WHITE_BOX) - 1 else "black-box" if not ran else "mixed"

    @property
    def black_box(self) -> bool:
        """Whether the index is seen only through lookups."""
        return not self.has["index multimap"]

    def observe(self, probes: Iterable[Key] = ()) -> Observation:
        """The pool now, probing ``get_cached_block`` with each of ``probes``."""
        pool = self.pool
        blocks = pool.blocks
        if self.api_only:
            return self._through_calls(probes)
        queue = pool.free_block_queue
        if self.has["free-queue links"]:
            free, _cut = free_queue_walk(queue, len(blocks) + 2)
        else:
            free = [b.block_id for b in queue.get_all_free_blocks()]
        probes = list(probes)
        return Observation(
            ref=tuple(b.ref_cnt for b in blocks),
            free=tuple(free),
            num_free=queue.num_free_blocks,
            primary=tuple(self._primary(b) for b in blocks),
            lookups=tuple(zip(probes, self._lookups(probes), strict=True)),
            secondary=(tuple(self._secondary(b.block_id) for b in blocks)
                       if self.has["secondary keys"] else None),
            index=self._index(),
            watched=tuple(pool._reuse_watchers) if self.has["registered watchers"] else None,
        )

    def _through_calls(self, probes: Iterable[Key]) -> Observation:
        """What the calls of the reference API show, and only that (API only).

        A pool may answer all these queries at once with ``observe_calls(probes)``
        (a pool in another process sends them in one go); it returns
        ``(num_free, writable per block, first block id or None per probe)``.
        """
        pool, probes = self.pool, list(probes)
        batch = getattr(pool, "observe_calls", None)
        if callable(batch):
            num_free, writable, hits = batch(probes)
        else:
            num_free = pool.get_num_free_blocks()
            writable = [pool.is_block_writable(b) for b in pool.blocks]
            hits = self._lookups(probes)
        return Observation(ref=None, free=None, num_free=num_free, primary=None,
                           lookups=tuple(zip(probes, hits, strict=True)),
                           writable=tuple(bool(w) for w in writable))

    def through_calls(self, blocks: list[int], probes: list[Key]) -> tuple[int, list[bool], list[int | None]]:
        """Part of a pool seen only through calls: the free count, ``is_block_writable`` of
        ``blocks`` and the first block ``get_cached_block`` returns for each of ``probes`` (what one
        call's footprint touched).  One ``observe_calls(probes, blocks)`` when the pool has it."""
        pool = self.pool
        batch = getattr(pool, "observe_calls", None)
        if self._batched is None:
            self._batched = callable(batch) and accepts(batch, "blocks")
        if self._batched and batch is not None:
            num_free, writable, hits = batch(probes, blocks=blocks)
            return num_free, [bool(w) for w in writable], list(hits)
        hits = self._lookups(probes)  # the lookups first: the order the pool is asked in
        return (pool.get_num_free_blocks(), [bool(pool.is_block_writable(pool.blocks[b])) for b in blocks],
                hits)

    def _index(self) -> tuple[tuple[Key, tuple[int, ...]], ...] | None:
        if not self.has["index multimap"]:
            return None
        entries = {key_of(key): entry_ids(entry)
                   for key, entry in self.pool.cached_block_hash_to_block._cache.items()}
        return tuple(sorted(entries.items()))

    def _lookups(self, probes: Iterable[Key]) -> list[int | None]:
        """The block ``get_cached_block`` returns for each probed key (``None``: a miss)."""
        get = self.pool.get_cached_block
        return [hit[0].block_id if (hit := get(h, [group])) else None for h, group in probes]

    # ------------------------------------------------------------ one block or key at a time

    def _primary(self, block: Any) -> tuple[Key, int | None] | None:
        if block.block_hash is None:
            return None
        return key_of(block.block_hash), block.block_hash_num_tokens if self.num_tokens else None

    def _secondary(self, b: int) -> tuple[Key, ...]:
        # a set in vLLM: the order of a block's partial-entry keys is no promise, so both
        # sides are shown sorted
        return tuple(sorted(key_of(k) for k in self.pool.cached_block_hashes_by_block.get(b, ())))

    def block_view(self, b: int) -> BlockView:
        """What the pool shows of block ``b``: count, primary, secondary keys, watched, queue links."""
        pool = self.pool
        block = pool.blocks[b]
        secondary = self._secondary(b) if self.has["secondary keys"] else None
        watched = (b in pool._reuse_watchers) if self.has["registered watchers"] else None
        return BlockView(block.ref_cnt, self._primary(block), secondary, watched, self._links(block))

    def _links(self, block: Any) -> tuple[int | None, int | None] | str | None:
        """``block``'s neighbours in the free queue (None at an end), ``"out"`` when it is not
        linked, ``None`` when the pool's links cannot be seen."""
        if not self.has["free-queue links"]:
            return None
        queue = self.pool.free_block_queue
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None and nxt is None:
            return "out"
        return (None if prev is None or prev is queue.fake_free_list_head else prev.block_id,
                None if nxt is None or nxt is queue.fake_free_list_tail else nxt.block_id)

    def entries(self, key: Key) -> tuple[int, ...] | int | None:
        """The blocks the index holds under ``key``, in order (white box); else the block a
        lookup returns (an id, or ``None`` for a miss)."""
        if self.has["index multimap"]:
            entry = self.pool.cached_block_hash_to_block._cache.get(concrete_key(key))
            return () if entry is None else entry_ids(entry)
        return self._lookups([key])[0]

    def num_free(self) -> int:
        return int(self.pool.free_block_queue.num_free_blocks)

    def link_errors(self) -> list[str]:
        """What is wrong with the free queue's links (empty when they cannot be seen)."""
        if not self.has["free-queue links"]:
            return []
        return free_queue_link_errors(self.pool.free_block_queue, len(self.pool.blocks) + 2)

    def pending_events(self) -> list[Any] | None:
        """The events queued and not yet taken, if the pool shows them."""
        return self.pool.kv_event_queue if self.has["pending events"] else None


def entry_ids(entry: Any) -> tuple[int, ...]:
    """The block ids of one entry of vLLM's index multimap: a block, or a dict of them by id."""
    return tuple(entry) if isinstance(entry, dict) else (entry.block_id,)


def accepts(fn: Any, keyword: str) -> bool:
    """Whether ``fn`` takes ``keyword`` (or any keyword): an ``observe_calls`` that takes
    ``blocks`` (a footprint's), a constructor that takes ``metrics_collector``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def observe_pool(pool: Any, probes: Iterable[Key] = ()) -> Observation:
    """Observe any pool with the reference API, as far as it allows (see :class:`Observer`)."""
    return Observer(pool).observe(probes)


def free_queue_walk(queue: Any, limit: int) -> tuple[list[int], bool]:
    """The free queue's block ids, head to tail; (ids, True) if cut at ``limit``."""
    return _walk(queue.fake_free_list_head.next_free_block, "next_free_block", queue.fake_free_list_tail,
                 limit)


def _walk(start: Any, step: str, stop: Any, limit: int) -> tuple[list[int], bool]:
    """Block ids from ``start`` along ``step`` links until ``stop``; (ids, True) if cut at ``limit``."""
    out: list[int] = []
    node = start
    while node is not None and node is not stop:
        if len(out) >= limit:
            return out, True
        out.append(node.block_id)
        node = getattr(node, step)
    return out, False


def free_queue_link_errors(queue: Any, limit: int | None = None,
                           forward_walk: tuple[list[int], bool] | None = None) -> list[str]:
    """What is wrong with a free queue's links (empty when nothing is).

    Walking forward and backward must give the same blocks, each once, and
    ``num_free_blocks`` must count them (``forward_walk``: the forward walk, already
    made to ``limit``, not made again).  Every walk stops after ``limit``
    blocks (by default: more than the pool has), so a cycle, such as a block
    queued twice, is reported rather than walked forever.  For kvpool's
    queue, every block of its pool must name the queue as holder exactly when
    it is linked.
    """
    owner = getattr(queue, "owner", None)
    if limit is None:
        limit = max(queue.num_free_blocks, len(owner.blocks) if owner is not None else 0) + 2
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    forward, cut_forward = forward_walk or _walk(head.next_free_block, "next_free_block", tail, limit)
    backward, cut_backward = _walk(tail.prev_free_block, "prev_free_block", head, limit)
    errors = []
    for cut, direction, ids in ((cut_forward, "forward", forward), (cut_backward, "backward", backward)):
        if cut:
            again = next((b for i, b in enumerate(ids) if b in ids[:i]), None)
            errors.append(f"the free queue's {direction} links loop (at block {again}): "
                          f"walked {limit} blocks")
    if backward[::-1] != forward:
        errors.append(f"forward {forward} != reversed backward {backward[::-1]}")
    twice = sorted(b for b, n in Counter(forward).items() if n > 1)
    if twice:
        errors.append(f"blocks {twice} are queued twice: {forward}")
    if queue.num_free_blocks != len(forward):
        errors.append(f"num_free_blocks {queue.num_free_blocks} != {len(forward)} linked")
    if owner is not None:
        linked = set(forward)
        wrong = [b.block_id for b in owner.blocks
                 if b._holder is not (queue if b.block_id in linked else owner)]
        if wrong:
            errors.append(f"blocks {wrong} name the wrong holder")
    return errors


def snapshot(pool: Any) -> tuple[Observation, list[dict[str, Any]], list[tuple[int, int]]]:
    """Observation plus pending events and watcher identities: 'exactly as it was'."""
    return (
        observe_pool(pool),
        [pool_event(e) for e in pool.kv_event_queue],
        [(b, id(w)) for b, w in pool._reuse_watchers.items()],
    )


def pool_invariant_errors(pool: Any) -> list[str]:
    """The model's structural invariants, checked directly on a concrete pool.

    For long runs where stepping the model alongside would be too slow: the
    free queue holds exactly the idle real blocks, the null block is inert,
    counts are non-negative, and the index matches every block's own keys.
    """
    errors = free_queue_link_errors(pool.free_block_queue)
    blocks = pool.blocks
    queued = {b.block_id for b in pool.free_block_queue.get_all_free_blocks()}
    idle = {b.block_id for b in blocks[1:] if b.ref_cnt == 0}
    if queued != idle:
        errors.append(f"queued {sorted(queued ^ idle)} differ from idle blocks")
    if any(b.ref_cnt < 0 for b in blocks[1:]):
        errors.append("a real block has a negative ref count")
    if 0 in queued or blocks[0].block_hash is not None:
        errors.append("the null block is queued or hashed")
    by_block = pool.cached_block_hashes_by_block
    own = {(b.block_hash, b.block_id) for b in blocks if b.block_hash is not None}
    own |= {(k, bid) for bid, keys in by_block.items() for k in keys}
    indexed = {(key, bid) for key, entry in pool.cached_block_hash_to_block._cache.items()
               for bid in entry_ids(entry)}
    if own != indexed:
        errors.append(f"index and block keys differ on {len(own ^ indexed)} entries")
    return errors
