# crosshair: max_iterations=200
"""Contract-annotated wrappers around kvpool.impl, for ``crosshair check``.

impl must not depend on CrossHair or carry test code, and the oracle compares
pools through its own abstraction, so the contracts live with the tests
(``tests/test_crosshair.py`` runs them): each wrapper builds a small structure
from its (bounded) arguments, runs one operation and returns what the
postconditions need.  The contracts are PEP 316 docstrings
(``pre:``/``post:``), which CrossHair reads out of the box; CrossHair then
searches the argument space for a case where a precondition holds and a
postcondition fails (or anything raises).

    PYTHONHASHSEED=0 crosshair check --analysis_kind=PEP316 \
        --per_condition_timeout 1e6 --per_path_timeout 1e5 tests/crosshair_contracts.py

The directive on the first line bounds the search by work: at most 200 paths
per postcondition (crosshair-tool has no command-line flag for
``max_iterations``).  CrossHair's time limits are CPU seconds (z3's, wall-clock
seconds), so a search they cut would depend on the machine's load; the
command above sets them where they never bind, and the search, seeded and
deterministic, explores the same paths on every run.

Wrappers return plain tuples of ints so the postconditions stay readable
and cheap to evaluate on symbolic values.  Each pool wrapper has a single
postcondition: CrossHair gives every condition its own budget of paths, so
one conjunction explores deeper than several conjuncts in the same total
work.  Refusals are caught inside the wrapper (an escaping exception would be
reported as a counterexample) and returned as a flag, so "a refused call
leaves the pool unchanged" is a postcondition like any other.
"""

from __future__ import annotations

import pickle
from typing import Any

from kvpool.impl.block import KVCacheBlock
from kvpool.impl.errors import BlockPoolError
from kvpool.impl.free_queue import FreeKVCacheBlockQueue
from kvpool.impl.hash_index import BlockHashToBlockMap
from kvpool.impl.pool import BlockPool
from kvpool.model import ACTIONS, OPERATIONS, ContractBroken, Refusal, initial_state
from kvpool.model.operations import Translate
from kvpool.model.state import PoolState
from kvpool.oracle.core.abstraction import event_differences, refusal_kind
from kvpool.oracle.core.lockstep import MetricsRecorder
from kvpool.oracle.core.observe import Observation, observe_model, observe_pool
from kvpool.oracle.search.refinement import model_watcher, requests_for

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
        after, _ = ACTIONS[op](before.copy(), *args)
    except Refusal:
        return (True, tuple(before.ref), tuple(before.free), len(before.free))
    return (False, tuple(after.ref), tuple(after.free), len(after.free))


def _agrees(pool: BlockPool, state: PoolState, op: str, *args: object) -> bool:
    """Full observation of the pool equals the model's (keys, index, watchers too)."""
    try:
        after, _ = ACTIONS[op](state.copy(), *args)
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
        ok = [b.block_id for b in got] == state.free.first(k) and all(b.ref_cnt == 1 for b in got)
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


# ------------------------------------------------------- the pool, from reached states
#
# The wrappers above start from fresh pools.  These start from states the
# bounded refinement (:mod:`kvpool.oracle.search.refinement`) reaches on 4 blocks,
# hash_block_size 1, caching and events on: REACHED holds one call sequence
# per state, CrossHair picks one by a symbolic index, and the pool and the
# model are rebuilt by replaying it (once, at import; each call unpickles a
# copy).  Each wrapper then runs one operation with symbolic arguments on
# both and compares everything the lockstep compares: the result or the
# refusal's kind, the whole observation, the pending events, the watchers'
# and the metrics collector's calls.  A call that breaks a caller contract
# is outside the specification: no claim is made (the wrapper returns True).

REACHED: tuple[tuple[tuple[str, tuple[Any, ...]], ...], ...] = (
    (),
    (("get_new_blocks", (1,)),),
    (("get_new_blocks", (2,)),),
    (("get_new_blocks", (3,)),),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)),),
    (("cache_partial_block", ("r0", 2, 1, 0, 2, False)),),
    (("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None)),),
    (("cache_full_blocks", ("r0", [2], 0, 1, 2, 0, None)),),
    (("get_new_blocks", (1,)), ("touch", ([1],))),
    (("get_new_blocks", (1,)), ("unpin_blocks", ([1], "watcher_a"))),
    (("get_new_blocks", (1,)), ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
    (("get_new_blocks", (1,)), ("cache_partial_block", ("r0", 2, 1, 0, 2, False))),
    (("get_new_blocks", (1,)), ("cache_partial_block", ("r0", 3, 1, 0, 2, False))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [2], 0, 1, 2, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [3], 0, 1, 2, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [1, 2], 0, 2, 2, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [1, 3], 0, 2, 2, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [1, 2], 0, 2, 1, 0, None))),
    (("get_new_blocks", (1,)), ("cache_full_blocks", ("r0", [1, 3], 0, 2, 1, 0, None))),
    (("get_new_blocks", (2,)), ("touch", ([1],))),
    (("get_new_blocks", (2,)), ("unpin_blocks", ([1], "watcher_a"))),
    (("get_new_blocks", (2,)), ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
    (("get_new_blocks", (2,)), ("cache_partial_block", ("r0", 3, 1, 0, 2, False))),
    (("get_new_blocks", (2,)), ("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None))),
    (("get_new_blocks", (2,)), ("cache_full_blocks", ("r0", [3], 0, 1, 2, 0, None))),
    (("get_new_blocks", (2,)), ("cache_full_blocks", ("r0", [1, 3], 0, 2, 2, 0, None))),
    (("get_new_blocks", (2,)), ("cache_full_blocks", ("r0", [1, 3], 0, 2, 1, 0, None))),
    (("get_new_blocks", (3,)), ("touch", ([1],))),
    (("get_new_blocks", (3,)), ("unpin_blocks", ([1], "watcher_a"))),
    (("get_new_blocks", (3,)), ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
    (("get_new_blocks", (3,)), ("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)), ("cache_partial_block", ("r0", 2, 1, 0, 2, False))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)), ("cache_partial_block", ("r0", 3, 1, 0, 2, False))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)), ("cache_partial_block", ("r0", 1, 1, 1, 2, False))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)), ("cache_partial_block", ("r0", 1, 3, 1, 2, False))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)), ("cache_partial_block", ("r0", 3, 1, 1, 2, False))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)),
     ("cache_full_blocks", ("r0", [1], 0, 1, 2, 1, None))),
    (("cache_partial_block", ("r0", 1, 1, 0, 2, False)),
     ("cache_full_blocks", ("r0", [1, 3], 0, 2, 2, 1, None))),
    (("cache_partial_block", ("r0", 1, 3, 0, 2, False)), ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
    (("cache_partial_block", ("r0", 2, 1, 0, 2, False)), ("cache_partial_block", ("r0", 2, 1, 1, 2, False))),
    (("cache_partial_block", ("r0", 2, 3, 0, 2, False)), ("cache_partial_block", ("r0", 2, 1, 0, 2, False))),
    (("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None)),
     ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
    (("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None)),
     ("cache_full_blocks", ("r0", [2], 0, 1, 2, 0, None))),
    (("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None)),
     ("cache_full_blocks", ("r0", [3], 0, 1, 2, 0, None))),
    (("cache_full_blocks", ("r0", [1], 0, 1, 2, 0, None)),
     ("cache_partial_block", ("r0", 1, 1, 1, 2, False))),
    (("cache_full_blocks", ("r0", [2], 0, 1, 2, 0, None)),
     ("cache_partial_block", ("r0", 2, 1, 0, 2, False))),
    (("cache_full_blocks", ("r0", [2], 0, 1, 2, 0, None)),
     ("cache_partial_block", ("r0", 2, 1, 1, 2, False))),
    (("cache_full_blocks", ("r0", [1, 2], 0, 2, 1, 0, None)),
     ("cache_partial_block", ("r0", 2, 1, 0, 2, False))),
    (("cache_full_blocks", ("r0", [1, 3], 0, 2, 1, 0, None)),
     ("cache_partial_block", ("r0", 3, 1, 0, 2, False))),
    (("get_new_blocks", (1,)),
     ("unpin_blocks", ([1], "watcher_a")),
     ("cache_partial_block", ("r0", 1, 1, 0, 2, False))),
)
"""Call sequences from a fresh pool (requests and watchers by name), one per reached state.

Chosen from the refinement's sequences (every call is the BMC's domain, none
breaks a contract; ``tests/test_crosshair.py`` checks both): the first state,
in breadth-first order, of each combination of what a pool can hold (blocks
held; hashed blocks idle or held; secondary keys; watchers; shared blocks;
group-1 keys; partial entries; a key on two blocks; a hashed idle block
behind an unhashed one; a watched hashed block) among the 2,643 states of
depth 2, then the first one step further that adds a combination still
missing."""

_BLOCKS = 4
_HBS = 1
_REQUESTS = {r.request_id: r for r in requests_for(_HBS)}


def _named(arg: Any) -> Any:
    if isinstance(arg, str):
        return _REQUESTS[arg] if arg in _REQUESTS else model_watcher(arg)
    return arg


def _pool_arg(pool: BlockPool, arg: Any) -> Any:
    """A block id as the pool takes it: its block, or a block of no pool."""
    return pool.blocks[arg] if 0 <= arg < len(pool.blocks) else KVCacheBlock(len(pool.blocks))


class _Blocks(Translate):
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def block(self, block_id: Any) -> Any:
        return _pool_arg(self.pool, block_id)


def _pool_args(pool: BlockPool, op: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return OPERATIONS[op].pool_args(args, _Blocks(pool))


def _rebuild(sequence: tuple[tuple[str, tuple[Any, ...]], ...]) -> tuple[bytes, PoolState]:
    """Replay ``sequence`` on a fresh pool and the model, each on its own; the pool pickled."""
    pool = BlockPool(_BLOCKS, True, _HBS, enable_kv_cache_events=True,
                     metrics_collector=MetricsRecorder())
    state = initial_state(_BLOCKS, True, _HBS, True)
    for op, named in sequence:
        args = tuple(_named(a) for a in named)
        state, _ = ACTIONS[op](state, *args)
        getattr(pool, op)(*_pool_args(pool, op, args))
    return pickle.dumps(pool), state


_SNAPSHOTS = [_rebuild(sequence) for sequence in REACHED]


def _reached(index: int) -> tuple[BlockPool, PoolState]:
    """A copy of the pool in reached state ``index``, and the model's state."""
    blob, state = _SNAPSHOTS[index]
    return pickle.loads(blob), state.copy()


def _refines(pool: BlockPool, state: PoolState, op: str, *args: Any) -> bool:
    """One call on both sides: everything the lockstep compares agrees (or a contract broke)."""
    watchers = list(pool._reuse_watchers.values())
    recorder = pool.metrics_collector
    assert isinstance(recorder, MetricsRecorder)
    recorder.log.clear()
    pending = len(state.events)
    try:
        after, result = ACTIONS[op](state, *args)
        model_error: Refusal | None = None
    except ContractBroken:
        return True
    except Refusal as exc:
        after, result, model_error = state, None, exc
    try:
        got = getattr(pool, op)(*_pool_args(pool, op, args))
        pool_error: BlockPoolError | None = None
    except BlockPoolError as exc:
        got, pool_error = None, exc
    if model_error is not None or pool_error is not None:
        if model_error is None or refusal_kind(pool_error) is not model_error.kind:
            return False
    elif op == "get_new_blocks":
        if [b.block_id for b in got] != result:
            return False
    elif got != result:
        return False
    fired = [entry for w in dict.fromkeys(watchers) for entry in getattr(w, "log", ())]
    return (not observe_model(after).diff(observe_pool(pool))
            and not event_differences(after.events, pool.kv_event_queue)
            and (model_error is not None or len(after.events) - pending == len(after.out.events))
            and fired == [(w.name, b) for w, b in after.out.fired]
            and recorder.log == after.out.told)


def pool_get_new_blocks_reached(index: int, k: int) -> bool:
    """get_new_blocks from a reached state agrees with the model.

    pre: 0 <= index < len(REACHED)
    pre: -1 <= k <= 4
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "get_new_blocks", k)


def pool_free_blocks_reached(index: int, ids: list[int]) -> bool:
    """free_blocks from a reached state agrees with the model (ids -1 and 4: no pool's block).

    pre: 0 <= index < len(REACHED)
    pre: len(ids) <= 3
    pre: all(-1 <= i <= 4 for i in ids)
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "free_blocks", ids)


def pool_touch_reached(index: int, ids: list[int]) -> bool:
    """touch from a reached state agrees with the model.

    pre: 0 <= index < len(REACHED)
    pre: len(ids) <= 3
    pre: all(-1 <= i <= 4 for i in ids)
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "touch", ids)


def pool_unpin_blocks_reached(index: int, ids: list[int], second: bool) -> bool:
    """unpin_blocks from a reached state agrees with the model, with either watcher.

    pre: 0 <= index < len(REACHED)
    pre: len(ids) <= 3
    pre: all(-1 <= i <= 4 for i in ids)
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "unpin_blocks", ids,
                    model_watcher("watcher_b" if second else "watcher_a"))


def pool_evict_blocks_reached(index: int, ids: list[int]) -> bool:
    """evict_blocks from a reached state agrees with the model (ids as ids, -1 and 4 refused).

    pre: 0 <= index < len(REACHED)
    pre: len(ids) <= 3
    pre: all(-1 <= i <= 4 for i in ids)
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "evict_blocks", ids)


def pool_cache_full_blocks_reached(index: int, request: int, ids: list[int], num_cached: int,
                                   num_full: int, block_size: int, group: int,
                                   mask: list[bool] | None) -> bool:
    """cache_full_blocks from a reached state agrees with the model.

    pre: 0 <= index < len(REACHED)
    pre: 0 <= request <= 2
    pre: len(ids) <= 3
    pre: all(-1 <= i <= 4 for i in ids)
    pre: -1 <= num_cached <= 3 and -1 <= num_full <= 4
    pre: 1 <= block_size <= 3
    pre: 0 <= group <= 1
    pre: mask is None or len(mask) <= 3
    post: __return__
    """
    pool, state = _reached(index)
    return _refines(pool, state, "cache_full_blocks", _REQUESTS[f"r{request}"], ids, num_cached,
                    num_full, block_size, group, mask)
