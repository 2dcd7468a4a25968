"""One observation of a whole pool, in the model's vocabulary.

Two pools agree when their observations are equal: ref counts, the free
queue in order, each block's keys, the index with its per-key order,
the blocks with reuse watchers, and the free count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool.model.state import Key, PoolState

from .abstraction import key_of, pool_event


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything a caller of the pool could see, block ids for blocks."""

    ref: tuple[int, ...]
    free: tuple[int, ...]
    primary: tuple[tuple[Key, int] | None, ...]
    secondary: tuple[tuple[Key, ...], ...]
    index: tuple[tuple[Key, tuple[int, ...]], ...]
    watched: tuple[int, ...]
    num_free: int

    def diff(self, other: Observation) -> list[str]:
        """Readable differences, field by field (empty when equal)."""
        out = []
        for name in self.__slots__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name}: {mine!r} != {theirs!r}")
        return out


def observe_model(s: PoolState) -> Observation:
    """The observation the specification predicts."""
    return Observation(
        ref=s.ref,
        free=s.free,
        primary=tuple(None if p is None else (p.key, p.num_tokens) for p in s.primary),
        secondary=s.secondary,
        index=tuple(sorted(s.index.items())),
        watched=tuple(s.watchers),
        num_free=len(s.free),
    )


def observe_pool(pool: Any) -> Observation:
    """Observe a kvpool or vLLM ``BlockPool`` through its public attributes."""
    blocks = pool.blocks
    by_block = pool.cached_block_hashes_by_block
    index = pool.cached_block_hash_to_block
    entries: dict[Key, tuple[int, ...]] = {}
    for key, entry in index._cache.items():
        ids = tuple(entry) if isinstance(entry, dict) else (entry.block_id,)
        entries[key_of(key)] = ids
    return Observation(
        ref=tuple(b.ref_cnt for b in blocks),
        free=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        primary=tuple(
            None if b.block_hash is None else (key_of(b.block_hash), b.block_hash_num_tokens)
            for b in blocks
        ),
        secondary=tuple(tuple(key_of(k) for k in by_block.get(b.block_id, ())) for b in blocks),
        index=tuple(sorted(entries.items())),
        watched=tuple(pool._reuse_watchers),
        num_free=pool.get_num_free_blocks(),
    )


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


def free_queue_link_errors(queue: Any, limit: int | None = None) -> list[str]:
    """What is wrong with a free queue's links (empty when nothing is).

    Walking forward and backward must give the same blocks, each once, and
    ``num_free_blocks`` must count them.  Every walk stops after ``limit``
    blocks (by default: more than the pool has), so a cycle, such as a block
    queued twice, is reported rather than walked forever.  For kvpool's
    queue, every block of its pool must name the queue as holder exactly when
    it is linked.
    """
    owner = getattr(queue, "owner", None)
    if limit is None:
        limit = max(queue.num_free_blocks, len(owner.blocks) if owner is not None else 0) + 2
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    forward, cut_forward = _walk(head.next_free_block, "next_free_block", tail, limit)
    backward, cut_backward = _walk(tail.prev_free_block, "prev_free_block", head, limit)
    errors = []
    for cut, direction, ids in ((cut_forward, "forward", forward), (cut_backward, "backward", backward)):
        if cut:
            again = next((b for i, b in enumerate(ids) if b in ids[:i]), None)
            errors.append(f"the free queue's {direction} links loop (at block {again}): "
                          f"walked {limit} blocks")
    if backward[::-1] != forward:
        errors.append(f"forward {forward} != reversed backward {backward[::-1]}")
    twice = sorted({b for b in forward if forward.count(b) > 1})
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
    indexed = {
        (key, bid)
        for key, entry in pool.cached_block_hash_to_block._cache.items()
        for bid in (entry if isinstance(entry, dict) else (entry.block_id,))
    }
    if own != indexed:
        errors.append(f"index and block keys differ on {len(own ^ indexed)} entries")
    return errors
