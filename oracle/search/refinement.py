"""Bounded refinement: every call sequence of a small pool, run on a pool and the model side by side.

The lockstep campaigns (:mod:`.campaign`) and the state machine
(:mod:`.machine`) draw call sequences at random; this module runs *all* of
them, breadth first, up to a depth: from each model state reached, every call
of a finite domain is run through a :class:`~.lockstep.Lockstep` on a copy of
the pool that reached it, which compares the results and refusals, the whole
observation, the events, the reuse watchers' calls and the metrics
collector's calls, and checks every invariant of the model.

The domain is the caller's contract-respecting calls (passed in: the bounded
model checker's, :func:`kvpool.proofs.bmc.calls`, whose layer the oracle may
not import; ``kvpool verify`` joins the two) plus this module's own
:func:`queries` and :func:`misuse`.

How a model id reaches the pool: ids in ``[0, N)`` are the pool's blocks; in
an argument that names a block object, any other id stands for a block of no
pool (:class:`~.lockstep.Lockstep`'s ``foreign``), except ``N + 1``
(:data:`STRANGER_OFFSET`), which stands for block 1 of another pool built by
the same factory (which no call may change).  Ids passed as ids
(``evict_blocks``) reach the pool as they are.

Calls the model rejects as :class:`~kvpool.model.ContractBroken` are not
followed (the specification says nothing of the pool then); they are counted
per contract.  States are deduplicated by the *model's* state (``key``: by
default its exact variables, pending events and the logs of notices
excepted, as the BMC does); the pool is carried along from the first
(shortest) sequence that reached each state: the state's pool is pickled
once, and unpickled for each call from it (a deep copy, or a replay of the
sequence from a fresh pool, when a pool cannot be pickled).  A divergence is
replayed from a fresh pool along its sequence, so what is reported is the
shortest sequence found, as the lockstep prints it.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import (
    CALLER_ACTIONS,
    EVERYWHERE,
    OPERATIONS,
    Around,
    ContractBroken,
    Operation,
    Refusal,
    violated,
)
from kvpool.model.derived import domain_of
from kvpool.model.domains import Scope
from kvpool.model.levels import Stop, Stopwatch, breadth_first
from kvpool.model.state import NULL, PoolState

from ..core.lockstep import CallerBrokeContract, Divergence, Lockstep, Watcher
from ..core.observe import Observation, observe_pool

Call = tuple[str, tuple[Any, ...]]
"""An operation's name and its arguments, blocks named by id."""
CallDomain = Callable[[PoolState], Iterable[Call]]
"""The calls to run from a model state."""
StateKey = Callable[[PoolState], Hashable]
"""What identifies a model state for deduplication."""

STRANGER_OFFSET = 1
"""``N + 1`` names block 1 of another pool of the same kind (``N``: the pool's size)."""


# ---------------------------------------------------------------- the pool explored


@dataclass(frozen=True)
class Shape:
    """One pool configuration to explore."""

    blocks: int = 4
    hash_block_size: int = 1
    caching: bool = True
    events: bool = True
    metrics: bool = True
    """Whether the pool is built with a metrics collector (its calls are compared too)."""

    @property
    def name(self) -> str:
        return (f"{self.blocks} blocks, hash_block_size {self.hash_block_size}, "
                f"caching {'on' if self.caching else 'off'}, events {'on' if self.events else 'off'}")

    @property
    def slug(self) -> str:
        return (f"{self.blocks}-blocks-hbs-{self.hash_block_size}"
                f"{'' if self.caching else '-no-caching'}{'' if self.events else '-no-events'}")


@dataclass(eq=False)
class NamedWatcher(Watcher):
    """A reuse watcher the model can name (``__name__``), like the BMC's watcher functions."""

    def __post_init__(self) -> None:
        self.__name__ = self.name


_MODEL_WATCHERS: dict[str, NamedWatcher] = {}


def model_watcher(name: str) -> NamedWatcher:
    """The one watcher the model is given under ``name``, whichever copy of a pool runs.

    The model only keeps and names its watchers, so every copy can hand it the
    same object, which keeps equal states equal; the pool gets the copy's own,
    which writes down its calls (:meth:`Pair.named_watcher`).
    """
    return _MODEL_WATCHERS.setdefault(name, NamedWatcher(name, []))


class Pair(Lockstep):
    """A :class:`Lockstep` that also runs the owner's writes and names a block of another pool.

    ``write_block`` (:data:`kvpool.model.CALLER_ACTIONS`) changes the model's
    ghost state only: the pool sees no writes, and is compared as after any
    call.  A broken contract is reported without a picture (it is counted,
    not shown).
    """

    spare: Callable[[], Any] | None = None
    """Builds another pool of the same kind, with two blocks (None: the factory cannot)."""
    other_seen: Observation | None = None
    """Such a pool as it is built: no call on this pool may change it."""
    other: Any = None
    """The other pool, built when a call first names its block."""
    named: dict[str, NamedWatcher]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.named = {}

    def named_watcher(self, name: str) -> NamedWatcher:
        """The one watcher called ``name`` on this side (the model holds it as it is)."""
        return self.named.setdefault(name, NamedWatcher(name, self.fired))

    def block(self, block_id: Any) -> Any:
        n = len(self.pool.blocks)
        if block_id == n + STRANGER_OFFSET and self.spare is not None:
            if self.other is None:
                self.other = self.spare()
            return self.other.blocks[1]
        return super().block(block_id)

    def _pool_args(self, decl: Operation, args: Sequence[Any]) -> tuple[Any, ...]:
        out = list(super()._pool_args(decl, args))
        if decl.name == "unpin_blocks" and len(out) > 1 and isinstance(out[1], NamedWatcher):
            out[1] = self.named_watcher(out[1].name)
        return tuple(out)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if op not in CALLER_ACTIONS:
            if op == "unpin_blocks" and len(args) > 1 and callable(args[1]):
                args = (args[0], model_watcher(getattr(args[1], "__name__", "watcher")), *args[2:])
            result = super().call(op, *args, **kwargs)
            if self.other is not None:  # this call named a block of the other pool
                now = observe_pool(self.other)
                self.other = None  # the next call gets a fresh one
                if now != self.other_seen:
                    assert self.other_seen is not None
                    raise self._diverged(op, "the other pool changed: "
                                         + "; ".join(self.other_seen.diff(now)), ["other pool"])
            return result
        self.steps += 1
        try:
            _state, result = CALLER_ACTIONS[op](self.model, *args, **kwargs)
        except ContractBroken as exc:
            raise CallerBrokeContract(str(exc), exc.contract, self.steps) from None
        except Refusal as exc:
            self._record(op, args, type(exc).__name__, type(exc).__name__)
            return exc
        self._record(op, args, repr(result), None)
        self.check()
        return result

    def _diverged(self, where: str, what: str, parts: list[str],
                  crash: BaseException | None = None, contract: str | None = None,
                  window: tuple[int, int] | None = None) -> Divergence:
        if contract is not None:  # counted by the exploration, never drawn
            return CallerBrokeContract(what, contract, self.steps)
        return super()._diverged(where, what, parts, crash, contract, window)


def fresh_pair(factory: Callable[..., Any], shape: Shape) -> Pair:
    """A new pool and the model configured alike, with a block of another pool at hand."""
    base = Lockstep.fresh(factory, shape.blocks, shape.caching, shape.hash_block_size, shape.events,
                          metrics=shape.metrics)
    pair = Pair(pool=base.pool, model=base.model, foreign=base.foreign, metrics=base.metrics)

    def spare() -> Any:
        return factory(2, shape.caching, shape.hash_block_size, enable_kv_cache_events=shape.events)

    try:
        pair.other_seen, pair.spare = observe_pool(spare()), spare
    except Exception:  # a pool that cannot be built that small: N + 1 is no pool's block
        pair.spare = None
    return pair


_CARRIED = ("pool", "foreign", "fired", "metrics", "known", "probed", "named")
"""What a copy of a pair carries besides the model's state (copied on its own)."""


@dataclass
class Carried:
    """A pair's pool and its mutable surroundings, kept once per state, copied per call."""

    how: str
    """``pickle``, ``deepcopy`` or ``replay``."""
    data: Any

    @classmethod
    def of(cls, pair: Pair) -> Carried:
        parts = tuple(getattr(pair, name) for name in _CARRIED)
        with contextlib.suppress(Exception):
            return cls("pickle", pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL))
        try:
            copy.deepcopy(parts)
            return cls("deepcopy", parts)
        except Exception:
            return cls("replay", None)

    def restore(self, model: PoolState, root: Pair, factory: Callable[..., Any], shape: Shape,
                path: Sequence[Call], invariants: Callable[[PoolState], list[str]]) -> Pair:
        """A pair in the state this was taken in, independent of every other copy.

        ``root`` is the pair the search started from: it lends the way to build another pool.
        """
        if self.how == "replay":
            pair = replay(factory, shape, path)
            pair.trace.clear()
            pair.steps, pair.last_full, pair.invariants = 0, 0, invariants
            return pair
        parts = pickle.loads(self.data) if self.how == "pickle" else copy.deepcopy(self.data)
        carried = dict(zip(_CARRIED, parts, strict=True))
        named = carried.pop("named")  # not a field: set after construction, which resets it
        pair = Pair(model=model.copy(), invariants=invariants, **carried)
        pair.spare, pair.other_seen, pair.named = root.spare, root.other_seen, named
        return pair


class Memo:
    """The model's broken invariants, computed once per exact state (many calls reach the same)."""

    def __init__(self) -> None:
        self.known: dict[Hashable, list[str]] = {}

    def __call__(self, s: PoolState, at: Around = EVERYWHERE) -> list[str]:
        if not at.whole:
            return violated(s, at)
        exact = s.variables()
        if exact not in self.known:
            self.known[exact] = violated(s)
        return self.known[exact]


def replay(factory: Callable[..., Any], shape: Shape, path: Sequence[Call]) -> Pair:
    """Run ``path`` from a fresh pool; raises the lockstep's :class:`Divergence` if it diverges."""
    pair = fresh_pair(factory, shape)
    pair.check()
    for op, args in path:
        pair.call(op, *args)
    return pair


# ---------------------------------------------------------------- the domain beyond the caller's


TOKENS = {"r0": [1, 1, 1, 1], "r1": [1, 1, 2, 2], "r2": [2, 2, 2, 2]}
"""The BMC's three requests: r0 and r1 share their first two tokens, r2 shares nothing."""


def requests_for(hash_block_size: int) -> list[Request]:
    """The requests the calls name: the BMC's token lists, hashed as vLLM hashes them.

    r2 carries every extra key an event publishes (a LoRA adapter, a
    multimodal item across its first two tokens, a cache salt, a session id),
    so that what a pool announces of them is compared too.
    """
    hasher = get_request_block_hasher(hash_block_size)
    extras: dict[str, Any] = {
        "lora_request": LoRARequest("adapter", 7, "/adapters/7"),
        "mm_features": [MultiModalFeature("image", PlaceholderRange(1, 2))],
        "cache_salt": "salt", "session_id": "session"}
    return [Request(name, tokens, block_hasher=hasher, **(extras if name == "r2" else {}))
            for name, tokens in TOKENS.items()]


def exact_key(s: PoolState) -> Hashable:
    """The model's variables, watchers by name; pending events and notice logs left out."""
    return (tuple(s.ref), tuple(s.free), tuple(s.primary), tuple(s.secondary), tuple(sorted(s.index.items())),
            tuple(sorted((b, getattr(w, "__name__", repr(w))) for b, w in s.watchers.items())),
            tuple(s.holds), tuple(sorted(s.names.items(), key=lambda kc: kc[0])), tuple(s.holders),
            tuple(sorted(s.announced)))


def queries(s: PoolState, requests: Sequence[Any], groups: Sequence[int] = (0, 1)) -> Iterator[Call]:
    """Every read-only call, each query with a few values per argument kind as the model gives them
    (:func:`kvpool.model.derived.domain_of`): lookups of every request hash in each group and in all,
    writability of every id, counts."""
    scope = Scope(requests, groups, ())
    for name, op in OPERATIONS.items():
        if op.role == "query":
            yield from ((name, args) for args in domain_of(op.args)(s, scope))


def misuse(s: PoolState, requests: Sequence[Any]) -> Iterator[Call]:
    """Calls a caller must not make, which both sides must refuse alike.

    Each wrong argument alone, and, where the specification says which
    refusal comes first, two at once: a block that is wrong in its own way
    (free, the null block, cached already) listed before one of no pool.
    """
    n, hbs = s.num_blocks, s.hash_block_size
    ids, real = range(n), range(1, n)
    outside = (-1, n, n + STRANGER_OFFSET)  # out of range; no pool's block; another pool's block
    r = requests[0]
    w = model_watcher("watcher_a")
    yield from (("get_new_blocks", (k,)) for k in (-1, 0, n))
    for op in ("free_blocks", "touch"):
        yield op, ([],)
        # free_blocks hands a block of another pool back to that pool: not misuse, and
        # beyond one model (the state machine's second pool checks it), so not here
        for x in outside if op == "touch" else outside[:2]:
            yield op, ([x],)
        for a in ids:  # refused at its second listing: the first must be undone
            yield op, ([a, n],)
    for a in ids:
        for b in ids:
            yield "free_blocks", ([a, b, a],)  # a triple listing
    for x in outside:
        yield "unpin_blocks", ([x], w)
        yield "evict_blocks", ([x],)
        yield "is_block_writable", (x,)
    for a in ids:
        yield "unpin_blocks", ([a, n], w)
        yield "evict_blocks", ([a, n],)
    for a in real:
        yield "unpin_blocks", ([a, a], w)
        yield "unpin_blocks", ([a, NULL], w)
    yield "unpin_blocks", ([1], None)  # a watcher that cannot be called
    yield "evict_blocks", ([],)
    for x in (-1, n):
        for a in ids:
            yield "move_block_hashes", (x, a)
            yield "move_block_hashes", (a, x)
    # cache_full_blocks: bad counts, sizes, groups, masks, lists
    few = hbs * (len(r.block_hashes) // 2 + 1)  # a block size at which ``r`` has one hash
    bad = [(-1, 1, hbs, 0), (0, -1, hbs, 0), (0, 1, 0, 0), *[(0, 1, hbs + 1, 0)] * (hbs > 1),
           (0, 1, hbs, -1), (0, 1, hbs, 2**32)]  # (num_cached, num_full, block size, group)
    yield from (("cache_full_blocks", (r, [1], *tail)) for tail in bad)
    for a in real:
        yield "cache_full_blocks", (r, [a], 0, 2, hbs, 0)  # num_full beyond the list
        yield "cache_full_blocks", (r, [a], 0, 1, hbs, 0, [True, False])  # a mask too long
        yield "cache_full_blocks", (r, [a, a % (n - 1) + 1], 0, 2, few, 0)  # beyond the hashes
    for a in ids:
        yield "cache_full_blocks", (r, [a, n], 0, 2, hbs, 0)
    for x in outside:
        yield "cache_full_blocks", (r, [x], 0, 1, hbs, 0)
    yield "cache_full_blocks", (r, [n], 0, 1, hbs, 0, [True, False])
    # cache_partial_block: bad token counts, sizes, groups, blocks
    for a in real:
        for nt in (0, -hbs, len(r.all_token_ids) + hbs) + ((1,) if hbs > 1 else ()):
            yield "cache_partial_block", (r, a, nt, 0, 2 * hbs)
    yield "cache_partial_block", (r, 1, hbs, -1, 2 * hbs)
    yield "cache_partial_block", (r, 1, hbs, 0, 0)
    for x in outside:
        yield "cache_partial_block", (r, x, hbs, 0, 2 * hbs)
    for tail in ((-1, hbs, 0), (1, hbs, -1), (1, 0, 0), (len(r.block_hashes) + 1, hbs, 0)):
        yield "emit_cached_block_events", (r, *tail)
    yield from (("get_cached_block", (r.block_hashes[0], groups)) for groups in ([-1], [0, 2**32]))


# ---------------------------------------------------------------- the search


@dataclass
class Refinement:
    """What one exploration ran and found."""

    shape: Shape
    depth_target: int
    depth: int = 0
    """Levels fully explored."""
    complete: bool = False
    states: int = 1
    """Distinct model states reached (the initial one included), by ``key``."""
    transitions: int = 0
    """Calls run on both sides and compared: one per explored sequence."""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """CPU time of this process (on a shared machine the wall clock says little)."""
    operations: Counter[str] = field(default_factory=Counter)
    misuse: Counter[str] = field(default_factory=Counter)
    """Of ``operations``, the calls from :func:`misuse`."""
    refusals: Counter[str] = field(default_factory=Counter)
    """Refused calls (both sides alike), by the model's refusal kind."""
    breaches: Counter[str] = field(default_factory=Counter)
    """Calls not followed: the model says the caller broke this contract."""
    copies: Counter[str] = field(default_factory=Counter)
    """How each kept state's pool was carried: pickle, deepcopy or replay."""
    divergence: BaseException | None = None
    """The first difference (a :class:`Divergence`, or the pool's crash)."""
    sequence: list[Call] = field(default_factory=list)
    """The calls leading to it, from a fresh pool: the shortest found."""
    reproduced: bool = True
    """Whether replaying ``sequence`` from a fresh pool diverged again."""

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        head = (f"{self.shape.name}: depth {self.depth}/{self.depth_target}"
                f"{'' if self.complete or not self.ok else ' (time out)'}, {self.states:,} states, "
                f"{self.transitions:,} sequences, {sum(self.breaches.values()):,} contract breaches "
                f"skipped, {self.seconds:.1f}s ({self.cpu_seconds:.1f}s CPU)")
        if self.ok:
            return head
        calls = "\n".join(f"  {i}. {show_call(c)}" for i, c in enumerate(self.sequence, start=1))
        return f"{head}\nDIVERGED after {len(self.sequence)} call(s):\n{calls}\n{self.divergence}"


def show_call(call: Call) -> str:
    """One call as a line (hashes and requests shortened)."""
    op, args = call
    return f"{op}({', '.join(_shown(a) for a in args)})"


def _shown(arg: Any) -> str:
    if hasattr(arg, "request_id"):
        return f"<request {arg.request_id}>"
    if isinstance(arg, bytes):
        return "…" + arg[-3:].hex()
    return getattr(arg, "__name__", repr(arg)) if callable(arg) else repr(arg)


_Node = tuple[PoolState, Carried, tuple[Call, ...]]
"""A state kept, its pool carried along, and the calls that reached it."""


def explore(
    factory: Callable[..., Any], shape: Shape, depth: int, calls: CallDomain, requests: Sequence[Any],
    *, key: StateKey = exact_key, seconds: float = 600.0,
) -> Refinement:
    """Every sequence of up to ``depth`` calls from a fresh pool, breadth first, within ``seconds``.

    ``calls`` is the caller's domain from a model state; :func:`queries` and :func:`misuse` over
    ``requests`` are added.  Stops at the first divergence, which is replayed from a fresh pool.
    """
    watch = Stopwatch()
    out = Refinement(shape, depth)

    def finish() -> Refinement:
        out.states = len(seen)
        out.seconds, out.cpu_seconds = watch.seconds(), watch.cpu_seconds()
        return out

    seen: set[Hashable] = set()
    try:
        root = replay(factory, shape, [])
    except Exception as exc:  # diverged as built, or could not be built
        out.divergence = exc
        return finish()

    def domain(s: PoolState) -> Iterator[tuple[bool, Call]]:
        yield from ((False, c) for c in calls(s))
        yield from ((False, c) for c in queries(s, requests))
        yield from ((True, c) for c in misuse(s, requests))

    def expand(node: _Node, level: int) -> list[_Node]:
        model, kept, path = node
        nxt: list[_Node] = []
        for is_misuse, (op, args) in domain(model):
            pair = kept.restore(model, root, factory, shape, path, invariants)
            try:
                result = pair.call(op, *args)
            except CallerBrokeContract as exc:
                out.breaches[exc.contract] += 1
                continue
            except Exception as exc:
                _diverged(out, factory, shape, [*path, (op, args)], exc)
                raise Stop from None
            out.transitions += 1
            out.operations[op] += 1
            if is_misuse:
                out.misuse[op] += 1
            if isinstance(result, Refusal):
                out.refusals[result.kind.name] += 1
            k = key(pair.model)
            if k in seen:
                continue
            seen.add(k)
            if level < depth:
                pair.trace.clear()
                pair.steps, pair.last_full = 0, 0
                nxt.append((pair.model, carry(pair), (*path, (op, args))))
        return nxt

    def carry(pair: Pair) -> Carried:
        carried = Carried.of(pair)
        out.copies[carried.how] += 1
        return carried

    invariants = Memo()
    seen.add(key(root.model))
    first: _Node = (root.model, carry(root), ())
    levels = breadth_first([first], depth, expand, over_budget=watch.past(seconds))
    out.depth, out.complete = levels.depth, levels.complete
    return finish()


def _diverged(out: Refinement, factory: Callable[..., Any], shape: Shape, path: list[Call],
              seen: BaseException) -> None:
    """Record a divergence, as a replay of its sequence from a fresh pool reports it."""
    out.sequence = path
    try:
        replay(factory, shape, path)
    except Exception as exc:  # a broken contract cannot be: the exploration skipped breaches
        out.divergence, out.reproduced = exc, not isinstance(exc, CallerBrokeContract)
    else:
        out.divergence, out.reproduced = seen, False


__all__ = ["TOKENS", "Call", "CallDomain", "Carried", "Memo", "NamedWatcher", "Pair", "Refinement", "Shape",
           "StateKey", "exact_key", "explore", "fresh_pair", "misuse", "model_watcher", "queries", "replay",
           "requests_for", "show_call"]
