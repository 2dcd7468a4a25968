"""Contract-annotated wrappers around kvpool.impl, for ``crosshair check``.

impl must not depend on CrossHair or carry test code, so the contracts live
here: each wrapper builds a small structure from its (bounded) arguments,
runs one operation and returns what the postconditions need.  The
contracts are PEP 316 docstrings (``pre:``/``post:``), which CrossHair reads
out of the box; CrossHair then searches the argument space for a case
where a precondition holds and a postcondition fails (or anything raises).

    crosshair check --analysis_kind=PEP316 kvpool.oracle.contracts

Wrappers return plain tuples of ints so the postconditions stay readable
and cheap to evaluate on symbolic values.  Each pool wrapper has a single
postcondition: CrossHair gives every condition its own time budget, so one
conjunction explores deeper than several conjuncts in the same total time.  Refusals are caught inside the
wrapper (an escaping exception would be reported as a counterexample) and
returned as a flag, so "a refused call leaves the pool unchanged" is a
postcondition like any other.
"""

from __future__ import annotations

from kvpool.impl.block import KVCacheBlock
from kvpool.impl.errors import BlockPoolError
from kvpool.impl.free_queue import FreeKVCacheBlockQueue
from kvpool.impl.hash_index import BlockHashToBlockMap
from kvpool.impl.pool import BlockPool
from kvpool.model import ACTIONS, Refusal, initial_state
from kvpool.model.state import PoolState

from .observe import Observation, observe_model, observe_pool

QueueView = tuple[int, tuple[int, ...]]
"""(num_free_blocks, ids walked head to tail), or (-1, ()) when the links are broken."""


def _walk(queue: FreeKVCacheBlockQueue) -> QueueView:
    """The queue as the postconditions see it: the count and the forward walk.

    Every forward link must be mirrored by the backward link and no detached
    block may keep a link; otherwise the view is (-1, ()), which no
    postcondition accepts.
    """
    ids: list[int] = []
    prev = queue.fake_free_list_head
    block = prev.next_free_block
    while block is not None and block is not queue.fake_free_list_tail:
        if block.prev_free_block is not prev or len(ids) > 64:
            return (-1, ())
        ids.append(block.block_id)
        prev, block = block, block.next_free_block
    if block is None or block.prev_free_block is not prev:
        return (-1, ())
    return (queue.num_free_blocks, tuple(ids))


def _queue(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def _detached(block: KVCacheBlock) -> bool:
    return block.prev_free_block is None and block.next_free_block is None


# ------------------------------------------------------------- free queue


def queue_remove(n: int, i: int) -> QueueView:
    """Remove block ``i`` from a queue of ``n``: the others stay, in order.

    pre: 0 <= i < n <= 5
    post: __return__ == (n - 1, tuple(k for k in range(n) if k != i))
    """
    blocks, queue = _queue(n)
    queue.remove(blocks[i])
    if not _detached(blocks[i]):
        return (-1, ())
    return _walk(queue)


def queue_remove_twice_refused(n: int, i: int) -> QueueView:
    """Removing a block that is not queued is refused and changes nothing.

    pre: 0 <= i < n <= 5
    post: __return__ == (n - 1, tuple(k for k in range(n) if k != i))
    """
    blocks, queue = _queue(n)
    queue.remove(blocks[i])
    try:
        queue.remove(blocks[i])
    except BlockPoolError:
        return _walk(queue)
    return (-1, ())


def queue_append(n: int, i: int) -> QueueView:
    """Remove block ``i`` and append it: it moves to the tail.

    pre: 0 <= i < n <= 5
    post: __return__ == (n, tuple(k for k in range(n) if k != i) + (i,))
    """
    blocks, queue = _queue(n)
    queue.remove(blocks[i])
    queue.append(blocks[i])
    return _walk(queue)


def queue_popleft_n(n: int, k: int) -> tuple[tuple[int, ...], QueueView]:
    """Take ``k`` from the head: the first ``k`` come out in order, detached.

    A request for more than are queued (or a negative count) is refused and
    leaves the queue as it was.

    pre: 0 <= n <= 5
    pre: -1 <= k <= n + 1
    post: __return__[0] == (tuple(range(k)) if 0 <= k <= n else ())
    post: __return__[1] == ((n - k, tuple(range(k, n))) if 0 <= k <= n else (n, tuple(range(n))))
    """
    _, queue = _queue(n)
    try:
        taken = queue.popleft_n(k)
    except BlockPoolError:
        return ((), _walk(queue))
    if not all(_detached(b) for b in taken):
        return ((-1,), _walk(queue))
    return (tuple(b.block_id for b in taken), _walk(queue))


def queue_prepend_n(n: int, k: int) -> QueueView:
    """Pop ``k`` from the head and prepend them: the queue is restored.

    pre: 0 <= k <= n <= 5
    post: __return__ == (n, tuple(range(n)))
    """
    _, queue = _queue(n)
    queue.prepend_n(queue.popleft_n(k))
    return _walk(queue)


def queue_append_n_order(n: int, k: int) -> QueueView:
    """Pop ``k`` from the head and append them: a rotation by ``k``.

    pre: 0 <= k <= n <= 5
    post: __return__ == (n, tuple(range(k, n)) + tuple(range(k)))
    """
    _, queue = _queue(n)
    queue.append_n(queue.popleft_n(k))
    return _walk(queue)


# ------------------------------------------------------------- hash index


def _key(k: int) -> bytes:
    return bytes([k % 256]) + b"\x00\x00\x00\x00"


def _index(entries: list[tuple[int, int]]) -> tuple[BlockHashToBlockMap, dict[int, KVCacheBlock]]:
    blocks: dict[int, KVCacheBlock] = {}
    index = BlockHashToBlockMap()
    for key, bid in entries:
        index.insert(_key(key), blocks.setdefault(bid, KVCacheBlock(bid)))
    return index, blocks


def index_insert_contains(entries: list[tuple[int, int]], key: int, bid: int) -> bool:
    """After insert(key, block) the index contains it, and every earlier entry.

    pre: len(entries) <= 3
    pre: all(0 <= k < 3 and 0 <= b < 4 for k, b in entries)
    pre: 0 <= key < 3 and 0 <= bid < 4
    post: __return__
    """
    index, blocks = _index(entries)
    index.insert(_key(key), blocks.setdefault(bid, KVCacheBlock(bid)))
    return index.contain(_key(key), bid) and all(index.contain(_key(k), b) for k, b in entries)


def index_pop_exact(entries: list[tuple[int, int]], key: int, bid: int) -> bool:
    """pop(key, bid) removes exactly that entry: it returns the block iff it was there.

    pre: len(entries) <= 3
    pre: all(0 <= k < 3 and 0 <= b < 4 for k, b in entries)
    pre: 0 <= key < 3 and 0 <= bid < 4
    post: __return__
    """
    index, _ = _index(entries)
    was_there = (key, bid) in entries
    got = index.pop(_key(key), bid)
    if was_there != (got is not None) or (got is not None and got.block_id != bid):
        return False
    if index.contain(_key(key), bid):
        return False
    others = [(k, b) for k, b in entries if (k, b) != (key, bid)]
    if not all(index.contain(_key(k), b) for k, b in others):
        return False
    # Every remaining key still has a first block, and no key is left empty.
    keys = list(index.keys())
    return all(index.get_one_block(k) is not None for k in keys) and len(keys) == len(
        {_key(k) for k, _ in others})


# ---------------------------------------------------------------- the pool


def _pair(n: int, held: int) -> tuple[BlockPool, PoolState]:
    """A pool of ``n`` blocks with ``held`` handed out, and the model in the same state."""
    pool = BlockPool(n, True, 16)
    state = initial_state(n, True, 16)
    if held:
        pool.get_new_blocks(held)
        state, _ = ACTIONS["get_new_blocks"](state, held)
    return pool, state


PoolView = tuple[bool, tuple[int, ...], tuple[int, ...], int]
"""(refused, ref counts, free queue, free count) of the pool after the call."""


def _view(pool: BlockPool, refused: bool) -> PoolView:
    return (refused, tuple(b.ref_cnt for b in pool.blocks),
            _walk(pool.free_block_queue)[1], pool.get_num_free_blocks())


def _model_view(before: PoolState, op: str, *args: object) -> PoolView:
    """What the model says the view is after ``op`` (refused: the state before)."""
    try:
        after, _ = ACTIONS[op](before, *args)
    except Refusal:
        return (True, before.ref, before.free, len(before.free))
    return (False, after.ref, after.free, len(after.free))


def _agrees(pool: BlockPool, state: PoolState, op: str, *args: object) -> bool:
    """Full observation of the pool equals the model's (keys, index, watchers too)."""
    try:
        after, _ = ACTIONS[op](state, *args)
    except Refusal:
        after = state
    mine: Observation = observe_model(after)
    return not mine.diff(observe_pool(pool))


def _counts_ok(view: PoolView, n: int, held: int, k: int) -> bool:
    """Refused exactly when ``k`` is negative or above the free count; else ``k`` fewer free."""
    refused, _, _, num_free = view
    if refused != (k < 0 or k > n - 1 - held):
        return False
    return refused or num_free == n - 1 - held - k


def pool_get_new_blocks(n: int, held: int, k: int) -> tuple[PoolView, PoolView, bool]:
    """get_new_blocks(k) moves ref counts and the free count as the model says.

    pre: 2 <= n <= 5
    pre: 0 <= held < n
    pre: -1 <= k <= n
    post: __return__[0] == __return__[1] and __return__[2] and _counts_ok(__return__[0], n, held, k)
    """
    pool, state = _pair(n, held)
    before_free = len(state.free)
    refused = False
    try:
        got = pool.get_new_blocks(k)
        ok = [b.block_id for b in got] == list(state.free[:k]) and all(b.ref_cnt == 1 for b in got)
    except BlockPoolError:
        refused, ok = True, len(pool.free_block_queue.get_all_free_blocks()) == before_free
    return (_view(pool, refused), _model_view(state, "get_new_blocks", k),
            ok and _agrees(pool, state, "get_new_blocks", k))


def pool_free_blocks(n: int, held: int, ids: list[int]) -> tuple[PoolView, PoolView, bool]:
    """free_blocks moves ref counts and the queue as the model says; a refusal changes nothing.

    Freeing a block more often than it is held, or a free block, is refused.

    pre: 2 <= n <= 4
    pre: 0 <= held < n
    pre: len(ids) <= 3
    pre: all(0 <= i < n for i in ids)
    post: __return__[0] == __return__[1] and __return__[2]
    """
    pool, state = _pair(n, held)
    blocks = [pool.blocks[i] for i in ids]
    refused = False
    try:
        pool.free_blocks(blocks)
    except BlockPoolError:
        refused = True
    return (_view(pool, refused), _model_view(state, "free_blocks", ids),
            _agrees(pool, state, "free_blocks", ids))


def pool_touch(n: int, held: int, ids: list[int], foreign_at: int) -> tuple[PoolView, PoolView, bool]:
    """touch takes one reference per listing; idle blocks leave the queue.

    With a foreign block spliced in at ``foreign_at`` (when in range) the call
    is refused, and the pool, free queue order included, is left as it was.

    pre: 2 <= n <= 4
    pre: 0 <= held < n
    pre: len(ids) <= 3
    pre: all(0 <= i < n for i in ids)
    pre: -1 <= foreign_at <= len(ids)
    post: __return__[0] == __return__[1] and __return__[2]
    """
    pool, state = _pair(n, held)
    blocks = [pool.blocks[i] for i in ids]
    model_ids: list[int] = list(ids)
    if 0 <= foreign_at <= len(ids):
        blocks.insert(foreign_at, KVCacheBlock(n))
        model_ids.insert(foreign_at, n)
    refused = False
    try:
        pool.touch(blocks)
    except BlockPoolError:
        refused = True
    return (_view(pool, refused), _model_view(state, "touch", model_ids),
            _agrees(pool, state, "touch", model_ids))


def pool_free_after_touch(n: int, held: int, ids: list[int]) -> tuple[int, tuple[int, ...]]:
    """touch then free of the same blocks restores the ref counts and the free count.

    (The queue order may change: blocks touched out of the queue rejoin at its head.)

    pre: 2 <= n <= 4
    pre: 0 <= held < n
    pre: len(ids) <= 3
    pre: all(1 <= i < n for i in ids)
    post: __return__ == (n - 1 - held, tuple([0] + [1] * held + [0] * (n - 1 - held)))
    """
    pool, _ = _pair(n, held)
    blocks = [pool.blocks[i] for i in ids]
    pool.touch(blocks)
    pool.free_blocks(blocks)
    return (pool.get_num_free_blocks(), tuple(b.ref_cnt for b in pool.blocks))
