"""The actions of the specification: one pure transition per pool operation.

Each action takes a :class:`PoolState` and the operation's arguments and
returns ``(next_state, result)``.  It first checks every argument and raises
a :class:`~.refusals.Refusal` *before* computing any change, so a refused
call leaves the state as it was.  Queries return only the result.

Decisions the reference (vLLM 0.31.0) leaves open, and the choice made:

* A block listed ``k`` times in one ``free_blocks``/``unpin_blocks`` call
  drops ``k`` references; listing it more often than it is referenced is a
  double free and is refused (``NOT_IN_USE``), as is freeing a block
  whose count is already 0.  The reference would drive the count negative.
* ``free_blocks``/``touch`` of the null block stay legal (engines keep it in
  block tables); its counter moves as in vLLM 0.31 (0.33 leaves it alone and
  tells no metrics collector: ``null_counted=False``), it never enters the
  free queue and is never hashed.  ``unpin_blocks`` of it is refused.
* A partial entry must end inside a block, as vLLM 0.31 asserts; from 0.32 on
  it may end at a block boundary too (``boundary_partials=True``).
* A metrics collector is told, in vLLM's order, of every block handed out
  (evicted first when caching is on, then allocated), every block touched
  (accessed), every block listed to ``evict_blocks`` (evicted, hashed or
  not) and every successful reset (``told``).
* ``unpin_blocks`` of a hashed block is allowed: the block keeps its hash, is
  evicted last, can still be hit (``touch``); its watcher stays registered
  until ``get_new_blocks`` hands the block out or the cache is reset.
* ``cache_full_blocks``/``cache_partial_block`` on a pool built without
  caching are refused (``CACHING_DISABLED``): the reference would index
  blocks that ``get_new_blocks`` then hands out without evicting them.
* A block's secondary keys are kept in insertion order, so removal events
  and ``move_block_hashes`` are deterministic (the reference uses a ``set``).
* ``cache_full_blocks`` with ``num_cached_blocks >= num_full_blocks`` does
  nothing, as in the reference: vLLM's sparse-attention coordinator can ask
  for fewer ready blocks than are cached.

Misuse the reference does not catch is refused here: negative counts (vLLM's
``get_new_blocks(-1)`` would inflate the free count), ids outside
``[0, num_blocks)`` (``-1`` would silently mean the last block),
``num_full_blocks`` beyond the block list, request hashes or masks of the
wrong length, group ids that do not fit 32 bits, and moving hashes onto the
null block (which would index it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .contracts import ContractBroken, compatible
from .events import Cleared, Event, Hash, Removed, Stored
from .refusals import Refusal, RefusalKind
from .request import Content, chunk_keys, content, hashes_at, lora_of, prefix_key, untagged
from .state import NULL, BlockId, Key, PoolState, Primary, Watcher

MAX_GROUP_ID = 2**32 - 1
"""Group ids travel as four bytes in vLLM's index keys."""

Step = tuple[PoolState, Any]


# --------------------------------------------------------------------------
# A mutable scratch copy, so each action reads as a list of assignments.


@dataclass(slots=True)
class _Next:
    ref: list[int]
    free: list[BlockId]
    primary: list[Primary | None]
    secondary: list[tuple[Key, ...]]
    index: dict[Key, tuple[BlockId, ...]]
    watchers: dict[BlockId, Watcher]
    events: list[Event]
    fired: list[tuple[Watcher, BlockId]]
    told: list[tuple[str, BlockId | None]]
    holds: list[Content]
    names: dict[Key, Content]
    holders: list[int]
    announced: set[tuple[Key, BlockId]]


def _thaw(s: PoolState) -> _Next:
    return _Next(
        list(s.ref), list(s.free), list(s.primary), list(s.secondary), dict(s.index),
        dict(s.watchers), list(s.events), list(s.fired), list(s.told), list(s.holds), dict(s.names),
        list(s.holders), set(s.announced),
    )


def _freeze(s: PoolState, n: _Next) -> PoolState:
    return replace(
        s, ref=tuple(n.ref), free=tuple(n.free), primary=tuple(n.primary),
        secondary=tuple(n.secondary), index=n.index, watchers=n.watchers,
        events=tuple(n.events), fired=tuple(n.fired), told=tuple(n.told), holds=tuple(n.holds),
        names=n.names, holders=tuple(n.holders), announced=frozenset(n.announced),
    )


def _drop_hashes(s: PoolState, n: _Next, b: BlockId) -> None:
    """Remove every index entry of ``b`` (primary first), emitting removals."""
    primary = n.primary[b]
    keys = ([primary.key] if primary else []) + list(n.secondary[b])
    for key in keys:
        rest = tuple(x for x in n.index.get(key, ()) if x != b)
        if rest:
            n.index[key] = rest
        else:
            n.index.pop(key, None)
        if s.events_on:
            n.events.append(Removed(key[0], key[1], s.medium))
            n.announced.discard((key, b))
    n.primary[b] = None
    n.secondary[b] = ()


def _add_key(n: _Next, key: Key, b: BlockId, num_tokens: int, names: Content) -> None:
    """Index ``b`` under ``key``: as its primary key if it has none."""
    primary = n.primary[b]
    if (primary and primary.key == key) or b in n.index.get(key, ()):
        return
    if primary is None:
        n.primary[b] = Primary(key, num_tokens)
    else:
        n.secondary[b] = n.secondary[b] + (key,)
    n.index[key] = (*n.index.get(key, ()), b)
    n.names[key] = names


def _write(held: Content, written: Content) -> Content:
    """Ghost: what a block holds after its owner wrote ``written`` into it."""
    return held if held[: len(written)] == written else written


def _hand(n: _Next, block_ids: Sequence[BlockId], delta: int) -> None:
    """Ghost: the caller gains (``+1``) or gives back (``-1``) a reference per real listing."""
    for b in block_ids:
        if b != NULL:
            n.holders[b] += delta


def _announce(n: _Next, entries: Sequence[tuple[Key, BlockId]]) -> None:
    """Ghost: the entries a ``BlockStored`` just announced are live."""
    n.announced.update(entries)


def _writable(s: PoolState, b: BlockId) -> bool:
    return b != NULL and s.ref[b] == 1 and s.primary[b] is None


def _require_write(s: PoolState, b: BlockId, written: Content) -> None:
    """Contract: a write extends what the block holds (either way), unless the block is writable."""
    if not compatible(s.holds[b], written) and not _writable(s, b):
        raise ContractBroken("writes_extend_unless_writable",
                             f"block {b} holds a prefix that {len(written)} written chunk(s) "
                             "do not extend, and it is not writable")


def _require_once(blocks: Sequence[BlockId]) -> None:
    """Contract: one ``cache_full_blocks`` call caches a block at one position."""
    if len(set(blocks)) != len(blocks):
        raise ContractBroken("cached_once_per_call",
                             f"blocks {list(blocks)} list one block at two positions")


def _require_one_prefix(s: PoolState, key: Key, prefix: Content) -> None:
    """Contract: a key in use names one prefix (the caller's hashes do not collide)."""
    if s.index.get(key) and s.names.get(key, prefix) != prefix:
        raise ContractBroken("hashes_name_one_prefix",
                             f"key …{key[0][-3:].hex()}/g{key[1]} already names another prefix")


def _stored(s: PoolState, request: Any, hashes: Sequence[Hash], parent: Hash | None,
            start: int, end: int, block_size: int, group: int,
            chunks: Sequence[tuple[int, int]]) -> Stored:
    """The announcement of ``request``'s tokens ``[start, end)`` stored under ``hashes``.

    ``chunks`` are the token ranges of the stored blocks, one per hash: the
    extra keys are published per block.
    """
    lora_id, lora_name = lora_of(request)
    return Stored(
        hashes=tuple(hashes), parent=parent, token_ids=tuple(request.all_token_ids[start:end]),
        block_size=block_size, lora_id=lora_id, lora_name=lora_name,
        extra_keys=tuple(untagged(chunk_keys(request, a, b)) for a, b in chunks) or None,
        group=group, medium=s.medium, session_id=request.session_id)


# --------------------------------------------------------------------------
# Argument checks shared by the actions (they never change anything).


def _check_ids(s: PoolState, ids: Sequence[Any]) -> None:
    for b in ids:
        if not isinstance(b, int) or not 0 <= b < s.num_blocks:
            raise Refusal(RefusalKind.UNKNOWN_BLOCK, f"block id {b!r} is not in [0, {s.num_blocks})")


def _check_releasable(s: PoolState, ids: Sequence[BlockId], what: str) -> None:
    """Each non-null block must hold at least as many references as listings."""
    _check_ids(s, ids)
    listed: dict[BlockId, int] = {}
    for b in ids:
        if b == NULL:
            continue
        listed[b] = listed.get(b, 0) + 1
        if listed[b] > s.ref[b]:
            raise Refusal(RefusalKind.NOT_IN_USE,
                f"{what} block {b}: {listed[b]} release(s) but ref count {s.ref[b]}")


def _check_count(name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 0:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"{name} must be a non-negative int, got {value!r}")


def _check_group(group_id: Any) -> None:
    if not isinstance(group_id, int) or not 0 <= group_id <= MAX_GROUP_ID:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"kv_cache_group_id {group_id!r} is not a 32-bit id")


def _check_block_size(s: PoolState, block_size: Any) -> None:
    if not isinstance(block_size, int) or block_size <= 0 or block_size % s.hash_block_size:
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
            f"block_size {block_size!r} is not a positive multiple of {s.hash_block_size}")


def _check_conflicts(s: PoolState, new_ids: Sequence[BlockId], chosen: Sequence[tuple[int, BlockId]],
                     block_size: int) -> None:
    """A chosen block may only be hashed at a shorter prefix (a partial entry being promoted)."""
    covered = {b: p.num_tokens for b in new_ids if (p := s.primary[b]) is not None}
    for i, b in chosen:
        if b in covered and covered[b] >= (i + 1) * block_size:
            raise Refusal(RefusalKind.HASH_CONFLICT, f"block {b} is already cached at a prefix this long")
        covered[b] = (i + 1) * block_size


# --------------------------------------------------------------------------
# Actions.


def get_new_blocks(s: PoolState, num_blocks: int) -> Step:
    """Hand out the first ``num_blocks`` free blocks; evict their hashes lazily."""
    _check_count("num_blocks", num_blocks)
    if num_blocks > len(s.free):
        raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                      f"Cannot get {num_blocks} free blocks from the pool")
    n = _thaw(s)
    taken, n.free = n.free[:num_blocks], n.free[num_blocks:]
    for b in taken:
        if b in n.watchers:
            n.fired.append((n.watchers.pop(b), b))
    for b in taken:
        if s.caching:
            _drop_hashes(s, n, b)
            n.told.append(("evicted", b))
        n.told.append(("allocated", b))
        n.ref[b] = 1
        n.holds[b] = ()
    _hand(n, taken, +1)
    return _freeze(s, n), taken


def free_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Drop one reference per listing; idle blocks rejoin the free queue.

    Unhashed blocks (or all, without caching) go to the head in the given
    order, to be reused first; hashed ones to the tail, evicted last (LRU).
    """
    _check_releasable(s, block_ids, "free")
    n = _thaw(s)
    _hand(n, block_ids, -1)
    first: list[BlockId] = []
    last: list[BlockId] = []
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        n.ref[b] -= 1
        if n.ref[b] == 0 and b != NULL:
            (last if s.caching and n.primary[b] else first).append(b)
    n.free = first + n.free + last
    return _freeze(s, n), None


def touch(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Take a reference on each block (a prefix hit); idle ones leave the queue."""
    _check_ids(s, block_ids)
    n = _thaw(s)
    _hand(n, block_ids, +1)
    for b in block_ids:
        if b == NULL and not s.null_counted:
            continue
        if n.ref[b] == 0 and b != NULL:
            n.free.remove(b)
        n.ref[b] += 1
        n.told.append(("accessed", b))
    return _freeze(s, n), None


def unpin_blocks(s: PoolState, block_ids: Sequence[BlockId], on_reuse: Watcher) -> Step:
    """Drop references but keep the contents readable until reuse or reset."""
    if not callable(on_reuse):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, "on_reuse must be callable")
    _check_ids(s, block_ids)
    if NULL in block_ids:
        raise Refusal(RefusalKind.NULL_BLOCK, "the null block cannot be unpinned")
    _check_releasable(s, block_ids, "unpin")
    n = _thaw(s)
    _hand(n, block_ids, -1)
    released = []
    for b in block_ids:
        n.ref[b] -= 1
        n.watchers[b] = on_reuse
        if n.ref[b] == 0:
            released.append(b)
    n.free = n.free + released
    return _freeze(s, n), None


def evict_blocks(s: PoolState, block_ids: Sequence[BlockId]) -> Step:
    """Remove the blocks' index entries; ref counts and queue places stay."""
    _check_ids(s, block_ids)
    n = _thaw(s)
    for b in block_ids:
        n.told.append(("evicted", b))
        _drop_hashes(s, n, b)
    return _freeze(s, n), None


def reset_prefix_cache(s: PoolState) -> Step:
    """Forget every hash, only when no block but the null block is in use."""
    if s.num_blocks - len(s.free) != 1:
        return s, False
    n = _thaw(s)
    n.fired += [(w, b) for b, w in n.watchers.items()]
    n.watchers = {}
    n.index = {}
    n.primary = [None] * s.num_blocks
    n.secondary = [()] * s.num_blocks
    if s.events_on:
        n.events.append(Cleared())
        n.announced = set()
    n.told.append(("reset", None))
    return _freeze(s, n), True


def cache_full_blocks(
    s: PoolState, request: Any, block_ids: Sequence[BlockId], num_cached_blocks: int,
    num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    block_mask: Sequence[bool] | None = None,
) -> Step:
    """Index ``block_ids[num_cached:num_full]`` under the request's block hashes.

    Null and masked-out blocks are skipped.  A block that already has a hash
    must be a partial entry being promoted (its prefix is shorter); its old
    entries are removed first.  One ``BlockStored`` covers the whole range.
    """
    _check_count("num_cached_blocks", num_cached_blocks)
    _check_count("num_full_blocks", num_full_blocks)
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if num_cached_blocks >= num_full_blocks:
        return s, None
    if not s.caching:
        raise Refusal(RefusalKind.CACHING_DISABLED, "cache_full_blocks on a pool without prefix caching")
    if num_full_blocks > len(block_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_full_blocks {num_full_blocks} > {len(block_ids)} blocks")
    new_ids = block_ids[num_cached_blocks:num_full_blocks]
    _check_ids(s, new_ids)
    if block_mask is not None and len(block_mask) != len(new_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"block_mask has {len(block_mask)} entries, want {len(new_ids)}")
    hashes = hashes_at(request, s.hash_block_size, block_size)
    chosen = [
        (num_cached_blocks + i, b) for i, b in enumerate(new_ids)
        if b != NULL and (block_mask is None or block_mask[i])
    ]
    needed = max([i + 1 for i, _ in chosen] + [num_cached_blocks if s.events_on else 0])
    if len(hashes) < needed:
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"request has {len(hashes)} block hashes, want {needed}")
    _check_conflicts(s, new_ids, chosen, block_size)
    _require_once([b for _i, b in chosen])
    prefixes = {i: content(request, (i + 1) * block_size, s.hash_block_size) for i, _b in chosen}
    for i, b in chosen:
        _require_one_prefix(s, (hashes[i], kv_cache_group_id), prefixes[i])
        _require_write(s, b, prefixes[i])

    n = _thaw(s)
    for i, b in chosen:
        if n.primary[b] is not None:
            _drop_hashes(s, n, b)
        n.holds[b] = _write(n.holds[b], prefixes[i])
        _add_key(n, (hashes[i], kv_cache_group_id), b, (i + 1) * block_size, prefixes[i])
    if s.events_on:
        _announce(n, [((hashes[i], kv_cache_group_id), b) for i, b in chosen])
        parent = hashes[num_cached_blocks - 1] if num_cached_blocks else None
        n.events.append(_stored(
            s, request, [hashes[i] for i, _b in chosen], parent,
            num_cached_blocks * block_size, num_full_blocks * block_size, block_size,
            kv_cache_group_id, [(i * block_size, (i + 1) * block_size) for i, _b in chosen]))
    return _freeze(s, n), None


def cache_partial_block(
    s: PoolState, request: Any, block_id: BlockId, num_tokens: int, kv_cache_group_id: int,
    block_size: int, replace_existing_hashes: bool = False,
) -> Step:
    """Make ``block_id`` reachable from a prefix boundary inside it.

    The key becomes the block's primary key if it has none, else a secondary
    one.  Entries covering a shorter prefix are dropped first (the block grew);
    with ``replace_existing_hashes`` all are (its contents were replaced).
    Returns the key, or ``None`` for the null block.
    """
    _check_ids(s, [block_id])
    if block_id == NULL:
        return s, None
    hbs = s.hash_block_size
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if not isinstance(num_tokens, int) or num_tokens <= 0 or num_tokens % hbs:
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_tokens {num_tokens!r} is not a positive multiple of {hbs}")
    if not (replace_existing_hashes or s.boundary_partials
            or (block_size > hbs and num_tokens % block_size)):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, "a partial entry must end inside a block")
    num_hash_blocks = num_tokens // hbs
    if num_hash_blocks > len(request.block_hashes):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"request has only {len(request.block_hashes)} block hashes")
    if not s.caching:
        raise Refusal(RefusalKind.CACHING_DISABLED, "cache_partial_block on a pool without prefix caching")

    key: Key = prefix_key(request, num_tokens, hbs, kv_cache_group_id)
    prefix = content(request, num_tokens, hbs)
    _require_one_prefix(s, key, prefix)
    if not replace_existing_hashes:
        _require_write(s, block_id, prefix)
    elif s.ref[block_id] != 1:
        raise ContractBroken("replaced_by_its_sole_owner",
                             f"block {block_id} has {s.ref[block_id]} references, not one")

    n = _thaw(s)
    primary = n.primary[block_id]
    already = (primary is not None and primary.key == key) or block_id in n.index.get(key, ())
    if replace_existing_hashes:
        _drop_hashes(s, n, block_id)
        already = False
        n.holds[block_id] = prefix
    else:
        if not already and primary is not None and primary.num_tokens < num_tokens:
            _drop_hashes(s, n, block_id)
        n.holds[block_id] = _write(n.holds[block_id], prefix)
    _add_key(n, key, block_id, num_tokens, prefix)
    if s.events_on and not already:
        start = (num_hash_blocks - 1) * hbs
        parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
        n.events.append(_stored(s, request, [key[0]], parent, start, num_tokens,
                                num_tokens - start, kv_cache_group_id, [(start, num_tokens)]))
        _announce(n, [(key, block_id)])
    return _freeze(s, n), key


def move_block_hashes(s: PoolState, src_id: BlockId, dst_id: BlockId) -> Step:
    """Re-point ``src``'s entries at ``dst``, a private copy; no events.

    The caller copied ``src``'s contents into ``dst`` (ghost: ``dst`` now
    holds what ``src`` held) and keeps writing into ``src``.
    """
    _check_ids(s, [src_id, dst_id])
    if s.primary[dst_id] is not None or s.secondary[dst_id]:
        raise Refusal(RefusalKind.HASH_CONFLICT, f"block {dst_id} already has hashes")
    if dst_id == NULL and s.primary[src_id] is not None:
        raise Refusal(RefusalKind.NULL_BLOCK, "hashes cannot be moved onto the null block")
    primary = s.primary[src_id]
    if primary is None:
        return s, None
    if s.ref[dst_id] != 1:
        raise ContractBroken("moves_onto_the_callers_copy",
                             f"block {dst_id} has {s.ref[dst_id]} references: it is not the "
                             "caller's own copy")
    n = _thaw(s)
    keys = [primary.key, *n.secondary[src_id]]
    names = [n.names[k] for k in keys]
    _drop_hashes(replace(s, events_on=False), n, src_id)
    n.holds[dst_id] = n.holds[src_id]
    for key, name in zip(keys, names, strict=True):
        _add_key(n, key, dst_id, primary.num_tokens, name)
    # Each live announcement of a moved entry stands: it now names the copy.
    moved = {(key, src_id) for key in keys} & n.announced
    n.announced -= moved
    _announce(n, [(key, dst_id) for key, _src in moved])
    return _freeze(s, n), None


def insert_block_hash(
    s: PoolState, request: Any, prefix_tokens: int, kv_cache_group_id: int, block_id: BlockId,
    num_tokens: int | None,
) -> Step:
    """Index ``block_id`` under a key of another pool, whose KV the caller copied into it.

    vLLM's CPU offload pool does this (``_insert_block_hash``) with the keys of
    a GPU block it copied.  The key is ``request``'s hash of its first
    ``prefix_tokens`` tokens in ``kv_cache_group_id`` (what the pool receives
    is that key alone; the request is the ghost of what it names).  The key
    becomes the block's primary key, covering ``num_tokens`` tokens, if the
    block has none, else a secondary one.  No event: the caller announces the
    entry (ghost ``announced``), as vLLM's offload manager emits its own
    ``BlockStored``.
    """
    _check_ids(s, [block_id])
    hbs = s.hash_block_size
    if (not isinstance(prefix_tokens, int) or prefix_tokens <= 0 or prefix_tokens % hbs
            or prefix_tokens // hbs > len(request.block_hashes)):
        raise Refusal(RefusalKind.INVALID_ARGUMENT, f"no key names the first {prefix_tokens!r} tokens")
    _check_group(kv_cache_group_id)
    if block_id == NULL:
        raise Refusal(RefusalKind.NULL_BLOCK, "the null block cannot be indexed")
    if not s.caching:
        raise Refusal(RefusalKind.CACHING_DISABLED, "_insert_block_hash on a pool without prefix caching")
    if s.primary[block_id] is None and not (
            isinstance(num_tokens, int) and num_tokens > 0 and num_tokens % hbs == 0):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_tokens {num_tokens!r} of a primary key is not a positive multiple of {hbs}")
    key: Key = prefix_key(request, prefix_tokens, hbs, kv_cache_group_id)
    prefix = content(request, prefix_tokens, hbs)
    _require_one_prefix(s, key, prefix)
    if s.ref[block_id] < 1:
        raise ContractBroken("writes_extend_unless_writable",
                             f"block {block_id} has no holder to copy KV into it")
    _require_write(s, block_id, prefix)
    n = _thaw(s)
    primary = n.primary[block_id]
    already = (primary is not None and primary.key == key) or block_id in n.index.get(key, ())
    n.holds[block_id] = _write(n.holds[block_id], prefix)
    _add_key(n, key, block_id, num_tokens or 0, prefix)
    if s.events_on and not already:
        _announce(n, [(key, block_id)])
    return _freeze(s, n), None


def maybe_evict_cached_block(s: PoolState, block_id: BlockId) -> Step:
    """``evict_blocks`` of one block that says whether it had any entry (vLLM's checkpoint path)."""
    nxt, _ = evict_blocks(s, [block_id])
    return nxt, s.primary[block_id] is not None


def write_block(s: PoolState, block_id: BlockId, request: Any, num_tokens: int) -> Step:
    """The caller, not the pool: a holder writes ``request``'s first ``num_tokens`` tokens' KV.

    Ghost only (the pool sees no writes): the block then holds that prefix,
    or keeps the longer prefix it held if the write is a prefix of it.
    Writing anything else is the owner's right only while the block is
    writable; that is how a stale entry would come to point at foreign KV.
    """
    _check_ids(s, [block_id])
    hbs = s.hash_block_size
    if not isinstance(num_tokens, int) or num_tokens <= 0 or num_tokens % hbs:
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"num_tokens {num_tokens!r} is not a positive multiple of {hbs}")
    if num_tokens > len(request.all_token_ids):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"request has only {len(request.all_token_ids)} tokens")
    if block_id == NULL or s.ref[block_id] < 1:
        raise ContractBroken("writes_extend_unless_writable",
                             f"block {block_id} has no holder to write into it")
    written = content(request, num_tokens, hbs)
    _require_write(s, block_id, written)
    n = _thaw(s)
    n.holds[block_id] = _write(n.holds[block_id], written)
    return _freeze(s, n), None


def take_events(s: PoolState) -> Step:
    """Hand over the emitted events and clear the log."""
    return replace(s, events=()), list(s.events)


def emit_cached_block_events(
    s: PoolState, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int,
) -> Step:
    """Announce prefix-cache hits to event consumers; the pool is unchanged."""
    _check_count("num_cached_blocks", num_cached_blocks)
    _check_block_size(s, block_size)
    _check_group(kv_cache_group_id)
    if not s.events_on or num_cached_blocks == 0:
        return s, None
    hashes = hashes_at(request, s.hash_block_size, block_size)
    if num_cached_blocks > len(hashes):
        raise Refusal(RefusalKind.INVALID_ARGUMENT,
                      f"request has {len(hashes)} block hashes, want {num_cached_blocks}")
    event = _stored(s, request, hashes[:num_cached_blocks], None, 0, num_cached_blocks * block_size,
                    block_size, kv_cache_group_id,
                    [(i * block_size, (i + 1) * block_size) for i in range(num_cached_blocks)])
    return replace(s, events=(*s.events, event)), None


# --------------------------------------------------------------------------
# Queries.


def get_cached_block(
    s: PoolState, block_hash: Hash, kv_cache_group_ids: Sequence[int]
) -> list[BlockId] | None:
    """The first block indexed under the hash in every group, or ``None``."""
    for g in kv_cache_group_ids:
        _check_group(g)
    found = []
    for g in kv_cache_group_ids:
        blocks = s.index.get((block_hash, g))
        if not blocks:
            return None
        found.append(blocks[0])
    return found


def is_block_writable(s: PoolState, block_id: BlockId) -> bool:
    """Only a sole owner of an unhashed, non-null block may write into it."""
    _check_ids(s, [block_id])
    return block_id != NULL and s.ref[block_id] == 1 and s.primary[block_id] is None


def get_num_free_blocks(s: PoolState) -> int:
    """How many blocks the free queue holds."""
    return len(s.free)


def get_usage(s: PoolState) -> float:
    """Fraction of the real (non-null) blocks in use."""
    real = s.num_blocks - 1
    return 1.0 - len(s.free) / real if real else 0.0


ACTIONS: dict[str, Callable[..., Step]] = {
    f.__name__: f
    for f in (
        get_new_blocks, free_blocks, touch, unpin_blocks, evict_blocks, reset_prefix_cache,
        cache_full_blocks, cache_partial_block, move_block_hashes, emit_cached_block_events,
        take_events,
    )
} | {"_insert_block_hash": insert_block_hash, "_maybe_evict_cached_block": maybe_evict_cached_block}
"""Every state-changing operation of the pool, by the pool's name (two private ones that
vLLM's own engine code calls: its CPU offload pool and its checkpointed-state manager)."""

CALLER_ACTIONS: dict[str, Callable[..., Step]] = {f.__name__: f for f in (write_block,)}
"""What the pool's caller does to its blocks outside the pool (ghost-only transitions)."""

QUERIES: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (get_cached_block, is_block_writable, get_num_free_blocks, get_usage)
}
"""Every read-only operation of the pool, by its public name."""
