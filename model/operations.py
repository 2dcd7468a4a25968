"""One declaration per operation: the single source every other layer derives from.

An :class:`Operation` names everything known about one pool operation: its
arguments and their kinds (:mod:`.kinds`), its result kind, its update
(:mod:`.pool`), its guard (the refusals, in order: :mod:`.guards`), its
caller contracts (:mod:`.contracts`), its footprint (:mod:`.footprints`),
its split into per-block z3 steps (:mod:`.split`), its calls on a small pool
(:mod:`.domains`) and, for the operations that move the free queue, the
queue the eviction policy prescribes (:mod:`.properties`).  The proofs' step
table, the bounded model checker's calls, the lockstep's argument mapping,
the trace schema, the reference API the oracle requires, the seeded-bug
wrappers and the fuzzer's operations are all read off :data:`OPERATIONS`;
``tests/test_registry.py`` fails when a table anywhere disagrees with it.
A part the declaration leaves out is what the arguments' kinds say (:mod:`.derived`).

Adding an operation: its update in :mod:`.pool` and one declaration below
(with its queue policy, if it moves the free queue); the parts its kinds
cannot say where they belong (:mod:`.guards`, :mod:`.contracts`, ...); its
z3 step in ``proofs/transitions.py`` if none of the steps fits; its place in
``impl/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import contracts, derived, domains, footprints, guards, pool, split
from .footprints import Footprint
from .guards import Noop
from .kinds import Arg
from .properties import Transition, freed_queue, handed_out_queue, touched_queue, unpinned_queue
from .state import Output, PoolState

ResultKind = Literal["none", "blocks", "blocks?", "key?", "bool", "count", "fraction", "events"]
"""What an operation returns.  ``blocks`` are block ids (the pool returns its block objects);
``key?`` an index key (the pool returns its packed form) or None."""
Role = Literal["action", "query", "caller"]
"""``action``: a pool operation that may change the pool; ``query``: one that never does;
``caller``: what the caller does outside the pool (ghost only)."""


class Translate:
    """How a caller of a real pool passes model values (the lockstep implements it)."""

    def block(self, block_id: Any) -> Any:
        raise NotImplementedError

    def key(self, request: Any, prefix_tokens: Any, group: int) -> Any:
        raise NotImplementedError


def _derived(*_args: Any) -> Any:
    """Stands for a part the declaration leaves out until it is derived from the arguments' kinds."""
    raise AssertionError("derived when the operation is declared")


@dataclass(frozen=True)
class Operation:
    """Everything known about one operation; a part left out is derived from the arguments' kinds."""

    name: str
    """Its name on the pool (``_insert_block_hash`` is a private member vLLM's engine calls)."""
    role: Role
    args: tuple[Arg, ...]
    result: ResultKind
    next: Callable[..., Any]
    """Its update (:mod:`.pool`): runs once the guard and the contracts let the call through."""
    steps: tuple[str, ...] = ("identity",)
    """The z3 steps its split uses (names in ``kvpool.proofs.transitions.STEPS``)."""
    guard: Callable[..., guards.Verdict] = _derived
    """Left out: each argument checked by its kind in declared order, then ``refuses``."""
    refuses: tuple[derived.Check, ...] = ()
    """For a guard left out: its refusals beyond the kinds, in order (:data:`.derived.REFUSALS`)."""
    requires: Callable[..., None] = contracts.nothing
    footprint: Callable[..., Footprint] = _derived
    """Left out: the blocks its block arguments name, with their keys (a query's: nothing)."""
    split: Callable[..., split.Split] = _derived
    """Left out: its one step per block its block arguments name (a query's: identity)."""
    domain: Callable[[PoolState, domains.Scope], Iterator[tuple[Any, ...]]] = _derived
    """Left out: every combination of a few values per argument kind (a query's: none)."""
    queue: Callable[..., tuple[int, ...]] | None = None
    """The free queue the eviction policy prescribes after an accepted call (None: unchanged)."""
    pool_call: Callable[[Mapping[str, Any], Translate], tuple[Any, ...]] | None = None
    """How a real pool receives the arguments, when not argument for argument by kind."""

    def __post_init__(self) -> None:
        if self.refuses and self.guard is not _derived:
            raise ValueError(f"{self.name}: refuses is for a guard derived from the kinds")
        if self.split is _derived and len(self.steps) != 1:
            raise ValueError(f"{self.name}: steps {self.steps} need a split written out")
        query = self.role == "query"
        parts = {"guard": derived.guard_of(self.name, self.args, self.refuses),
                 "footprint": footprints.nothing if query else derived.footprint_of(self.args),
                 "split": split.unchanged if query else derived.split_of(self.steps[0], self.args),
                 "domain": domains.none if query else derived.domain_of(self.args)}
        for part, value in parts.items():
            if getattr(self, part) is _derived:
                object.__setattr__(self, part, value)

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
            if a.name not in kwargs and not a.optional:
                raise TypeError(f"{self.name}() missing argument {a.name!r}")
            out.append(kwargs.pop(a.name, a.default))
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
                          self.named(bound), out or Output(), self.queue, fp)

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

def _insert_pool_call(a: Mapping[str, Any], to: Translate) -> tuple[Any, ...]:
    """vLLM's offload pool passes the key it copied, not the request that names it."""
    key = to.key(a["request"], a["prefix_tokens"], a["kv_cache_group_id"])
    return key, to.block(a["block_id"]), a["num_tokens"]


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation("get_new_blocks", "action", (Arg("num_blocks", "count"),), "blocks", pool.get_new_blocks,
              steps=("alloc",), guard=guards.get_new_blocks, footprint=footprints.get_new_blocks,
              split=split.get_new_blocks, queue=handed_out_queue),
    Operation("free_blocks", "action", (Arg("block_ids", "blocks"),), "none", pool.free_blocks,
              steps=("release",), guard=guards.free_blocks, domain=domains.free_blocks, queue=freed_queue),
    Operation("touch", "action", (Arg("block_ids", "blocks"),), "none", pool.touch, steps=("touch",),
              guard=guards.touch, split=split.touch, domain=domains.free_blocks, queue=touched_queue),
    Operation("unpin_blocks", "action", (Arg("block_ids", "blocks"), Arg("on_reuse", "watcher")), "none",
              pool.unpin_blocks, steps=("unpin",), guard=guards.unpin_blocks, domain=domains.unpin_blocks,
              queue=unpinned_queue),
    Operation("evict_blocks", "action", (Arg("block_ids", "block_ids"),), "none", pool.evict_blocks,
              steps=("evict",), guard=guards.evict_blocks),
    Operation("reset_prefix_cache", "action", (), "bool", pool.reset_prefix_cache,
              steps=("reset",), guard=guards.reset_prefix_cache, footprint=footprints.reset_prefix_cache,
              split=split.reset_prefix_cache),
    Operation("cache_full_blocks", "action",
              (Arg("request", "request"), Arg("block_ids", "blocks"), Arg("num_cached_blocks", "count"),
               Arg("num_full_blocks", "count"), Arg("block_size", "size"), Arg("kv_cache_group_id", "group"),
               Arg("block_mask", "mask?", None)), "none", pool.cache_full_blocks,
              steps=("cache_full", "identity"), guard=guards.cache_full_blocks,
              requires=contracts.cache_full_blocks, footprint=footprints.cache_full_blocks,
              split=split.cache_full_blocks, domain=domains.cache_full_blocks),
    Operation("cache_partial_block", "action",
              (Arg("request", "request"), Arg("block_id", "block"), Arg("num_tokens", "tokens"),
               Arg("kv_cache_group_id", "group"), Arg("block_size", "size"),
               Arg("replace_existing_hashes", "flag", False)), "key?", pool.cache_partial_block,
              steps=("cache_partial", "identity"), guard=guards.cache_partial_block,
              requires=contracts.cache_partial_block, footprint=footprints.cache_partial_block,
              split=split.cache_partial_block, domain=domains.cache_partial_block),
    Operation("move_block_hashes", "action", (Arg("src_id", "block"), Arg("dst_id", "block")), "none",
              pool.move_block_hashes, steps=("move",), guard=guards.move_block_hashes,
              requires=contracts.move_block_hashes, split=split.move_block_hashes),
    Operation("emit_cached_block_events", "action",
              (Arg("request", "request"), Arg("num_cached_blocks", "count"), Arg("block_size", "size"),
               Arg("kv_cache_group_id", "group")), "none", pool.emit_cached_block_events,
              guard=guards.emit_cached_block_events, domain=domains.emit_cached_block_events),
    Operation("take_events", "action", (), "events", pool.take_events, guard=guards.take_events),
    Operation("_insert_block_hash", "action",
              (Arg("request", "request"), Arg("prefix_tokens", "tokens"), Arg("kv_cache_group_id", "group"),
               Arg("block_id", "block"), Arg("num_tokens", "tokens?")), "none", pool.insert_block_hash,
              steps=("insert",), guard=guards.insert_block_hash, requires=contracts.insert_block_hash,
              footprint=footprints.insert_block_hash, split=split.insert_block_hash,
              domain=domains.insert_block_hash, pool_call=_insert_pool_call),
    Operation("_maybe_evict_cached_block", "action", (Arg("block_id", "block"),), "bool",
              pool.maybe_evict_cached_block, steps=("evict",), guard=guards.maybe_evict_cached_block),
    Operation("get_cached_block", "query", (Arg("block_hash", "hash"), Arg("kv_cache_group_ids", "groups")),
              "blocks?", pool.get_cached_block, guard=guards.get_cached_block),
    Operation("is_block_writable", "query", (Arg("block_id", "block"),), "bool", pool.is_block_writable,
              guard=guards.is_block_writable),
    Operation("get_num_free_blocks", "query", (), "count", pool.get_num_free_blocks,
              guard=guards.get_num_free_blocks),
    Operation("get_usage", "query", (), "fraction", pool.get_usage, guard=guards.get_usage),
    Operation("write_block", "caller",
              (Arg("block_id", "block"), Arg("request", "request"), Arg("num_tokens", "tokens")), "none",
              pool.write_block, steps=("write",), guard=guards.write_block, requires=contracts.write_block,
              split=split.write_block, domain=domains.write_block),
)}
"""Every operation, by its name on the pool (``write_block`` is the caller's)."""


def _callable(op: Operation) -> Callable[..., Any]:
    """``op`` as a function of a state and its arguments: ``(state, result)``, a query's result alone."""
    query = op.role == "query"

    def call(s: PoolState, *args: Any, **kwargs: Any) -> Any:
        result = op.run(s, op.bind(args, kwargs))
        return result if query else (s, result)

    call.__name__ = call.__qualname__ = op.next.__name__
    call.__doc__ = op.next.__doc__
    return call


ACTIONS: dict[str, Callable[..., tuple[PoolState, Any]]] = {
    name: _callable(op) for name, op in OPERATIONS.items() if op.role == "action"}
"""Every state-changing operation as ``(state, *args) -> (state, result)``, by the pool's name.
The state is updated IN PLACE and returned (copy it first to keep the old one)."""
CALLER_ACTIONS: dict[str, Callable[..., tuple[PoolState, Any]]] = {
    name: _callable(op) for name, op in OPERATIONS.items() if op.role == "caller"}
"""What the pool's caller does to its blocks outside the pool (ghost-only transitions)."""
QUERIES: dict[str, Callable[..., Any]] = {
    name: _callable(op) for name, op in OPERATIONS.items() if op.role == "query"}
"""Every read-only operation of the pool, by its public name."""
POOL_OPERATIONS: tuple[str, ...] = tuple(n for n, op in OPERATIONS.items() if op.role != "caller")
"""Every operation a pool has (public and the private ones vLLM's engine calls)."""
PUBLIC_OPERATIONS: tuple[str, ...] = tuple(n for n in POOL_OPERATIONS if not OPERATIONS[n].private)
"""The reference API every pool must have."""
