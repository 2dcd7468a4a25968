"""One declaration per operation: the single source every other layer derives from.

An :class:`Operation` names everything known about one pool operation: its
arguments and their kinds, its result kind, its guard (the refusals, in
order: :mod:`.guards`), its caller contracts (:mod:`.contracts`), its update
(:mod:`.pool`), its footprint (:mod:`.footprints`), its split into per-block
z3 steps (:mod:`.split`), its calls on a small pool (:mod:`.domains`) and,
for the operations that move the free queue, the queue the eviction policy
prescribes (:mod:`.properties`).  The proofs' step table, the bounded model
checker's calls, the lockstep's argument mapping, the trace schema, the
reference API the oracle requires, the seeded-bug wrappers and the fuzzer's
operations are all read off :data:`OPERATIONS`; ``tests/test_registry.py``
fails when a table anywhere disagrees with it.

Adding an operation: its update in :mod:`.pool`, its guard in
:mod:`.guards`, what it requires in :mod:`.contracts` (if anything), its
footprint, split and domain, and one declaration below; then its z3 step in
``proofs/transitions.py`` and its place in ``impl/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import contracts, domains, footprints, guards, pool, split
from .footprints import Footprint
from .guards import Noop
from .properties import Transition, freed_queue, handed_out_queue, touched_queue, unpinned_queue
from .state import Output, PoolState

ArgKind = Literal["count", "block", "blocks", "block_ids", "request", "watcher", "hash", "group",
                  "groups", "size", "tokens", "tokens?", "flag", "mask?"]
"""What an argument is.  ``block``/``blocks`` are block ids the pool receives as its block objects;
``block_ids`` stay ids; ``count``, ``size`` (a block size) and ``tokens`` (a token count) are ints;
``group``/``groups`` KV-cache group ids; ``hash`` a block hash; ``mask?`` a list of bools or None."""
ResultKind = Literal["none", "blocks", "blocks?", "key?", "bool", "count", "fraction", "events"]
"""What an operation returns.  ``blocks`` are block ids (the pool returns its block objects);
``key?`` an index key (the pool returns its packed form) or None."""
Role = Literal["action", "query", "caller"]
"""``action``: a pool operation that may change the pool; ``query``: one that never does;
``caller``: what the caller does outside the pool (ghost only)."""

REQUIRED = object()
"""The default of an argument that has none."""


@dataclass(frozen=True)
class Arg:
    """One argument: its name (the model's parameter name, which traces use), its kind and its default."""

    name: str
    kind: ArgKind
    default: Any = REQUIRED

    @property
    def optional(self) -> bool:
        return self.default is not REQUIRED


class Translate:
    """How a caller of a real pool passes model values (the lockstep implements it)."""

    def block(self, block_id: Any) -> Any:
        raise NotImplementedError

    def key(self, request: Any, prefix_tokens: Any, group: int) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Operation:
    """Everything known about one operation."""

    name: str
    """Its name on the pool (``_insert_block_hash`` is a private member vLLM's engine calls)."""
    role: Role
    args: tuple[Arg, ...]
    result: ResultKind
    guard: Callable[..., guards.Verdict]
    requires: Callable[..., None]
    next: Callable[..., Any]
    footprint: Callable[..., Footprint]
    steps: tuple[str, ...]
    """The z3 steps its split uses (names in ``kvpool.proofs.transitions.STEPS``)."""
    split: Callable[..., split.Split]
    domain: Callable[[PoolState, domains.Scope], Iterator[tuple[Any, ...]]]
    queue: Callable[..., tuple[int, ...]] | None = None
    """The free queue the eviction policy prescribes after an accepted call (None: unchanged)."""
    pool_call: Callable[[Mapping[str, Any], Translate], tuple[Any, ...]] | None = None
    """How a real pool receives the arguments, when not argument for argument by kind."""

    @property
    def private(self) -> bool:
        return self.name.startswith("_")

    @property
    def doc(self) -> str:
        """The first line of its update's docstring."""
        return (self.next.__doc__ or "").strip().splitlines()[0]

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
        """The call's arguments in declared order, defaults filled in (a ``TypeError`` as Python's)."""
        kwargs = dict(kwargs or {})
        if len(args) > len(self.args):
            raise TypeError(f"{self.name}() takes {len(self.args)} arguments, {len(args)} given")
        out = list(args)
        for a in self.args[len(args):]:
            if a.name in kwargs:
                out.append(kwargs.pop(a.name))
            elif a.optional:
                out.append(a.default)
            else:
                raise TypeError(f"{self.name}() missing argument {a.name!r}")
        if kwargs:
            raise TypeError(f"{self.name}() got unexpected argument(s) {sorted(kwargs)}")
        return tuple(out)

    def named(self, args: Sequence[Any]) -> dict[str, Any]:
        """Bound arguments by name."""
        return dict(zip((a.name for a in self.args), self.bind(args), strict=True))

    def prepare(self, s: PoolState, args: Sequence[Any]) -> Noop | None:
        """The call's guard, then its contracts: a :class:`~.guards.Noop` if it changes nothing.

        Raises :class:`~.refusals.Refusal` or :class:`~.contracts.ContractBroken`
        having changed nothing; starts the call's :class:`~.state.Output`.
        """
        s.out = Output()
        verdict = self.guard(s, *args)
        if isinstance(verdict, Noop):
            return verdict
        self.requires(s, *args)
        return None

    def run(self, s: PoolState, args: Sequence[Any]) -> Any:
        """The call on ``s``, in place: guard, then contracts, then the update; the result.

        What the call told besides its result is ``s.out``.
        """
        noop = self.prepare(s, args)
        return noop.result if noop is not None else self.next(s, *args)

    def transition(self, before: PoolState, after: PoolState, args: Sequence[Any], result: Any = None,
                   refusal: str | None = None, out: Output | None = None) -> Transition:
        """One call as the step properties read it (its footprint computed on ``before``)."""
        bound = self.bind(args)
        fp = None if refusal is not None else self.footprint(before, *bound)
        return Transition(self.name, bound, before, after, result, refusal is not None, refusal,
                          dict(zip((a.name for a in self.args), bound, strict=True)), out or Output(),
                          self.queue, fp)

    def pool_args(self, args: Sequence[Any], to: Translate) -> tuple[Any, ...]:
        """The arguments as a real pool receives them: block ids as its blocks."""
        if self.pool_call is not None:
            return self.pool_call(self.named(args), to)
        out = list(args)
        for i, a in enumerate(self.args[:len(args)]):
            if a.kind == "block":
                out[i] = to.block(args[i])
            elif a.kind == "blocks":
                out[i] = [to.block(b) for b in args[i]]
        return tuple(out)


# --------------------------------------------------------------------------
# The declarations.

COUNT: ArgKind = "count"
BLOCK: ArgKind = "block"
BLOCKS: ArgKind = "blocks"
REQUEST: ArgKind = "request"
GROUP: ArgKind = "group"
SIZE: ArgKind = "size"
TOKENS: ArgKind = "tokens"
UNSPLIT = ("identity",)


def _insert_pool_call(a: Mapping[str, Any], to: Translate) -> tuple[Any, ...]:
    """vLLM's offload pool passes the key it copied, not the request that names it."""
    key = to.key(a["request"], a["prefix_tokens"], a["kv_cache_group_id"])
    return key, to.block(a["block_id"]), a["num_tokens"]


def _declare(*ops: Operation) -> dict[str, Operation]:
    return {op.name: op for op in ops}


OPERATIONS: dict[str, Operation] = _declare(
    Operation("get_new_blocks", "action", (Arg("num_blocks", COUNT),), "blocks",
              guards.get_new_blocks, contracts.nothing, pool.get_new_blocks, footprints.get_new_blocks,
              ("alloc",), split.get_new_blocks, domains.get_new_blocks, handed_out_queue),
    Operation("free_blocks", "action", (Arg("block_ids", BLOCKS),), "none",
              guards.free_blocks, contracts.nothing, pool.free_blocks, footprints.listed,
              ("release",), split.free_blocks, domains.free_blocks, freed_queue),
    Operation("touch", "action", (Arg("block_ids", BLOCKS),), "none",
              guards.touch, contracts.nothing, pool.touch, footprints.listed,
              ("touch",), split.touch, domains.free_blocks, touched_queue),
    Operation("unpin_blocks", "action", (Arg("block_ids", BLOCKS), Arg("on_reuse", "watcher")), "none",
              guards.unpin_blocks, contracts.nothing, pool.unpin_blocks, footprints.listed,
              ("unpin",), split.unpin_blocks, domains.unpin_blocks, unpinned_queue),
    Operation("evict_blocks", "action", (Arg("block_ids", "block_ids"),), "none",
              guards.evict_blocks, contracts.nothing, pool.evict_blocks, footprints.listed,
              ("evict",), split.evict_blocks, domains.single_lists),
    Operation("reset_prefix_cache", "action", (), "bool",
              guards.reset_prefix_cache, contracts.nothing, pool.reset_prefix_cache,
              footprints.reset_prefix_cache, ("reset",), split.reset_prefix_cache,
              domains.no_arguments),
    Operation("cache_full_blocks", "action",
              (Arg("request", REQUEST), Arg("block_ids", BLOCKS), Arg("num_cached_blocks", COUNT),
               Arg("num_full_blocks", COUNT), Arg("block_size", SIZE), Arg("kv_cache_group_id", GROUP),
               Arg("block_mask", "mask?", None)), "none",
              guards.cache_full_blocks, contracts.cache_full_blocks, pool.cache_full_blocks,
              footprints.cache_full_blocks, ("cache_full", "identity"), split.cache_full_blocks,
              domains.cache_full_blocks),
    Operation("cache_partial_block", "action",
              (Arg("request", REQUEST), Arg("block_id", BLOCK), Arg("num_tokens", TOKENS),
               Arg("kv_cache_group_id", GROUP), Arg("block_size", SIZE),
               Arg("replace_existing_hashes", "flag", False)), "key?",
              guards.cache_partial_block, contracts.cache_partial_block, pool.cache_partial_block,
              footprints.cache_partial_block, ("cache_partial", "identity"), split.cache_partial_block,
              domains.cache_partial_block),
    Operation("move_block_hashes", "action", (Arg("src_id", BLOCK), Arg("dst_id", BLOCK)), "none",
              guards.move_block_hashes, contracts.move_block_hashes, pool.move_block_hashes,
              footprints.move_block_hashes, ("move",), split.move_block_hashes, domains.move_block_hashes),
    Operation("emit_cached_block_events", "action",
              (Arg("request", REQUEST), Arg("num_cached_blocks", COUNT), Arg("block_size", SIZE),
               Arg("kv_cache_group_id", GROUP)), "none",
              guards.emit_cached_block_events, contracts.nothing, pool.emit_cached_block_events,
              footprints.nothing, UNSPLIT, split.unchanged, domains.emit_cached_block_events),
    Operation("take_events", "action", (), "events",
              guards.take_events, contracts.nothing, pool.take_events, footprints.nothing,
              UNSPLIT, split.unchanged, domains.no_arguments),
    Operation("_insert_block_hash", "action",
              (Arg("request", REQUEST), Arg("prefix_tokens", TOKENS), Arg("kv_cache_group_id", GROUP),
               Arg("block_id", BLOCK), Arg("num_tokens", "tokens?")), "none",
              guards.insert_block_hash, contracts.insert_block_hash, pool.insert_block_hash,
              footprints.insert_block_hash, ("insert",), split.insert_block_hash, domains.insert_block_hash,
              pool_call=_insert_pool_call),
    Operation("_maybe_evict_cached_block", "action", (Arg("block_id", BLOCK),), "bool",
              guards.maybe_evict_cached_block, contracts.nothing, pool.maybe_evict_cached_block,
              footprints.one_block, ("evict",), split.maybe_evict_cached_block,
              domains.maybe_evict_cached_block),
    Operation("get_cached_block", "query", (Arg("block_hash", "hash"), Arg("kv_cache_group_ids", "groups")),
              "blocks?", guards.get_cached_block, contracts.nothing, pool.get_cached_block,
              footprints.nothing, UNSPLIT, split.unchanged, domains.none),
    Operation("is_block_writable", "query", (Arg("block_id", BLOCK),), "bool",
              guards.is_block_writable, contracts.nothing, pool.is_block_writable, footprints.nothing,
              UNSPLIT, split.unchanged, domains.none),
    Operation("get_num_free_blocks", "query", (), "count",
              guards.get_num_free_blocks, contracts.nothing, pool.get_num_free_blocks, footprints.nothing,
              UNSPLIT, split.unchanged, domains.none),
    Operation("get_usage", "query", (), "fraction",
              guards.get_usage, contracts.nothing, pool.get_usage, footprints.nothing,
              UNSPLIT, split.unchanged, domains.none),
    Operation("write_block", "caller",
              (Arg("block_id", BLOCK), Arg("request", REQUEST), Arg("num_tokens", TOKENS)),
              "none", guards.write_block, contracts.write_block, pool.write_block, footprints.write_block,
              ("write",), split.write_block, domains.write_block),
)
"""Every operation, by its name on the pool (``write_block`` is the caller's)."""


def _functional(op: Operation) -> Callable[..., tuple[PoolState, Any]]:
    def action(s: PoolState, *args: Any, **kwargs: Any) -> tuple[PoolState, Any]:
        return s, op.run(s, op.bind(args, kwargs))

    action.__name__ = action.__qualname__ = op.next.__name__
    action.__doc__ = op.next.__doc__
    return action


def _query(op: Operation) -> Callable[..., Any]:
    def query(s: PoolState, *args: Any, **kwargs: Any) -> Any:
        return op.run(s, op.bind(args, kwargs))

    query.__name__ = query.__qualname__ = op.next.__name__
    query.__doc__ = op.next.__doc__
    return query


ACTIONS: dict[str, Callable[..., tuple[PoolState, Any]]] = {
    name: _functional(op) for name, op in OPERATIONS.items() if op.role == "action"}
"""Every state-changing operation as ``(state, *args) -> (state, result)``, by the pool's name.
The state is updated IN PLACE and returned (copy it first to keep the old one)."""
CALLER_ACTIONS: dict[str, Callable[..., tuple[PoolState, Any]]] = {
    name: _functional(op) for name, op in OPERATIONS.items() if op.role == "caller"}
"""What the pool's caller does to its blocks outside the pool (ghost-only transitions)."""
QUERIES: dict[str, Callable[..., Any]] = {
    name: _query(op) for name, op in OPERATIONS.items() if op.role == "query"}
"""Every read-only operation of the pool, by its public name."""
POOL_OPERATIONS: tuple[str, ...] = tuple(n for n, op in OPERATIONS.items() if op.role != "caller")
"""Every operation a pool has (public and the private ones vLLM's engine calls)."""
PUBLIC_OPERATIONS: tuple[str, ...] = tuple(n for n in POOL_OPERATIONS if not OPERATIONS[n].private)
"""The reference API every pool must have."""
