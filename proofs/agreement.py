"""Does the z3 encoding compute what the model computes?  Checked exhaustively on small pools.

The proofs (:mod:`.inductive`) are about the z3 encoding; they are about the
pool only if the encoding says what :mod:`kvpool.model` says.  This module
checks that on every state the bounded model checker keeps (:mod:`.bmc`: the
same breadth-first search, the same argument domains, the same symmetry
reduction) and on every call it makes from them:

* **invariants, both ways**: each z3 invariant and lemma
  (:data:`~.invariants.SYM_INVARIANTS`, :data:`~.invariants.SYM_LEMMAS`),
  evaluated on the encoded state, equals the model's predicate of the same
  name.  Reachable states satisfy every invariant, so each state is also
  *perturbed* (:func:`perturbations`: an index entry flipped, a queue member
  dropped, a count changed, a key put on the null block, ...) to get states
  where the model's predicate is false; an invariant that is never false
  on some checked state fails the check.
* **steps**: each call is run on the model and, through the per-block
  decomposition of :mod:`.transitions` (a batch is a sequence of steps), on
  the z3 steps.  The steps must be enabled exactly when the model accepts
  the call (a :class:`~kvpool.model.ContractBroken` or a refusal that depends
  on the state means a precondition is false), the z3 result must equal the
  model's next state on every field, and each step's ``removed``/``stored``
  entries must be the model's ``Removed``/``Stored`` events, attributed to
  the blocks the call processes (in a pool that emits events: the encoding
  reads those sets only under ``events``, :mod:`.step_properties`).

z3 itself is not called per state: the terms are compiled once into Python
(:mod:`.evaluate`), which a test checks against z3 on a sample.

What the encoding cannot represent is said, not hidden: a state whose free
queue repeats a block (say) has the same encoding as one that does not, so
on such *unfaithful* states (:func:`unfaithful`) the check is only that the
z3 invariant is implied by the model's (the encoding drops the conjuncts
listed in :data:`~.invariants.PARTIAL`).  Calls whose refusal is a matter of
argument shape (an id out of range, a mask of the wrong length) have no
z3 counterpart (:data:`ARGUMENT_REFUSALS`), nor does the batch-level contract
``cached_once_per_call``; both are counted as skipped.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from kvpool.model import (
    ACTIONS,
    INVARIANTS,
    LEMMAS,
    OPERATIONS,
    ContractBroken,
    Refusal,
    RefusalKind,
)
from kvpool.model.events import Event, Removed, Stored
from kvpool.model.properties import CACHE_RECORDS, EVENT_LOG, EVICTIONS, STEP_PROPERTIES, Transition
from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import content, extends
from kvpool.model.split import Split
from kvpool.model.state import NULL, Key, Output, PoolState, Primary, Queue

from . import bmc
from .evaluate import (
    Carriers,
    Compiled,
    CompiledQueue,
    Interp,
    Predicate,
    QInterp,
    Undetermined,
    abstract,
    compile_claim,
    compile_predicate,
    compile_queue_step,
    compile_step,
    cross_check,
    queue_of,
    queue_order,
)
from .invariants import SYM_INVARIANTS, SYM_LEMMAS, SymInvariant
from .order import ORDER_PROPERTIES, QSTEPS
from .step_properties import SYM_STEP_PROPERTIES, SymStepProperty
from .symbolic import Block, Content, KeySort
from .transitions import STEPS, StepSpec

T = TypeVar("T")

STATE_REFUSALS = (RefusalKind.NOT_ENOUGH_FREE_BLOCKS, RefusalKind.NOT_IN_USE,
                  RefusalKind.HASH_CONFLICT, RefusalKind.NULL_BLOCK, RefusalKind.CACHING_DISABLED)
"""Refusals that depend on the state: the z3 precondition must be false there."""
ARGUMENT_REFUSALS = (RefusalKind.INVALID_ARGUMENT, RefusalKind.UNKNOWN_BLOCK)
"""Refusals of the arguments' shape: the encoding has no counterpart (its sorts hold only
well-formed values), so such calls are skipped and counted."""
BATCH_CONTRACTS = ("cached_once_per_call",)
"""Contracts on a whole batch: no per-block step can see them (skipped and counted)."""

ABOUT_ENABLING = ("allocation_succeeds_iff_enough_free", "conflicting_caches_are_refused")
"""Step properties that say when a step is enabled: the steps' check compares every
precondition with the model's verdict both ways (a refused call z3 enables disagrees), so an
accepted call can only show them true."""

COMPARED_PROPERTIES = (*SYM_STEP_PROPERTIES, *(n for n in ORDER_PROPERTIES if n in STEP_PROPERTIES))
"""The step properties compared with the model's of the same name, on every accepted call."""

CHECKED = {**SYM_INVARIANTS, **SYM_LEMMAS}
"""Every z3 state predicate checked against the model's predicate of the same name."""
MODEL_PREDICATES = {**INVARIANTS, **LEMMAS}


# --------------------------------------------------------------------------
# The scope: a BMC configuration, its finite domain, its compiled terms.


def domain_of(cfg: bmc.Bounds) -> Carriers:
    """Every key and content the BMC's requests can name, at the configuration's hash block size."""
    hbs = cfg.hash_block_size
    keys: set[Key] = set()
    contents: set[Any] = set()
    for r in cfg.requests():
        for i, h in enumerate(r.block_hashes):
            keys |= {(h, g) for g in cfg.groups}
            contents.add(content(r, (i + 1) * hbs, hbs))
    return Carriers.of(cfg.blocks, keys, contents)


@dataclass
class Compiledset:
    """The z3 steps, predicates, step properties and queue steps compiled for one domain."""

    domain: Carriers
    steps: dict[str, Compiled]
    predicates: dict[str, Predicate]
    specs: dict[str, StepSpec]
    claims: dict[str, dict[str, Callable[..., bool]]] = field(default_factory=dict)
    """Per step property, per step it speaks of: ``(state, post, *args, pre, removed, stored)``."""
    queue: dict[str, CompiledQueue] = field(default_factory=dict)
    converters: dict[str, tuple[Mapping[Any, int] | None, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.converters = {n: _converters(self.domain, sp) for n, sp in self.specs.items()}


def compile_all(d: Carriers, steps: Mapping[str, StepSpec] | None = None,
                predicates: Mapping[str, SymInvariant] | None = None,
                properties: Mapping[str, SymStepProperty] | None = None,
                queue: Mapping[str, tuple[Callable[..., Any], Any]] | None = None) -> Compiledset:
    """Compile every step, predicate, step property and queue step; each argument replaces some
    by name (seeded encoding bugs)."""
    specs = {**STEPS, **(steps or {})}
    preds = {**CHECKED, **(predicates or {})}
    props = {**SYM_STEP_PROPERTIES, **(properties or {})}
    qsteps = {**QSTEPS, **(queue or {})}
    claims = {p: {st: compile_claim(d, specs[st], prop.claim, f"{p} of {st}")
                  for st in specs if prop.steps is None or st in prop.steps}
              for p, prop in props.items()}
    return Compiledset(d, {n: compile_step(d, sp) for n, sp in specs.items()},
                       {n: compile_predicate(d, p, n) for n, p in preds.items()}, specs, claims,
                       {n: compile_queue_step(d, n, fn, sorts, ORDER_PROPERTIES)
                        for n, (fn, sorts) in qsteps.items()})


# --------------------------------------------------------------------------
# Results.


@dataclass
class Disagreement:
    """One place where the encoding and the model differ, with what a reviewer needs to see it."""

    case: str
    """``invariant/<name>`` or ``step/<name>``."""
    state: PoolState
    what: str
    """The perturbation or the call."""
    detail: str
    """Which field (or predicate) differs, z3's value against the model's."""


@dataclass
class Report:
    """What one run covered and every disagreement it found (the first few of each case)."""

    blocks: int
    hash_block_size: int
    depth_target: int
    depth: int = 0
    complete: bool = True
    states: int = 0
    perturbed: int = 0
    unfaithful: int = 0
    transitions: int = 0
    calls: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """Processor time of the run (the machine may be shared: wall time alone would mislead)."""
    skipped: Counter[str] = field(default_factory=Counter)
    invariants: dict[str, list[int]] = field(default_factory=dict)
    """Per checked predicate: [states where it is true, states where it is false] (faithful states)."""
    steps: dict[str, list[int]] = field(default_factory=dict)
    """Per step: [calls where the steps are enabled, calls refused]."""
    properties: dict[str, list[int]] = field(default_factory=dict)
    """Per step property compared: [transitions where the model's holds, where it does not]."""
    queues: int = 0
    """Accepted calls whose queue (as a sequence of places) was compared."""
    events: bool = True
    """The pool emits events (else the event-log properties hold vacuously, both sides)."""
    perturbations: Counter[str] = field(default_factory=Counter)
    disagreements: Counter[str] = field(default_factory=Counter)
    """Per case, how many disagreements were found."""
    examples: dict[str, list[Disagreement]] = field(default_factory=dict)
    """Per case, the first few disagreements."""

    keep: int = 3

    def add(self, d: Disagreement) -> None:
        self.disagreements[d.case] += 1
        kept = self.examples.setdefault(d.case, [])
        if len(kept) < self.keep:
            kept.append(d)

    @property
    def never_false(self) -> list[str]:
        """Predicates no checked state made false: their "both ways" is not shown."""
        return [n for n, (_t, f) in self.invariants.items() if f == 0]

    @property
    def ok(self) -> bool:
        return not self.disagreements and not self.never_false

    @property
    def never_broken(self) -> list[str]:
        """Step properties no compared transition broke: their "both ways" is not shown
        (those about when a step is enabled are shown both ways by the steps' own check)."""
        return [n for n, (_t, f) in self.properties.items()
                if f == 0 and n not in ABOUT_ENABLING and (self.events or n not in EVENT_LOG)]


# --------------------------------------------------------------------------
# States: the model's predicates against the compiled z3 ones.


def _keys_of(s: PoolState, b: int) -> list[Key]:
    p = s.primary[b]
    return ([p.key] if p else []) + list(s.secondary[b])


def unfaithful(s: PoolState) -> list[str]:
    """Why the encoding cannot represent ``s`` exactly (empty: it can).

    Each reason is a conjunct some model invariant states and the encoding
    drops (:data:`kvpool.proofs.invariants.PARTIAL`): sets and relations
    have no order, no duplicates, no empty lists; ``names`` is total; block
    ids are the sort's elements.
    """
    out = []
    if not all(s.index.values()):
        out.append("an index key maps to an empty list")
    if any(len(set(bs)) != len(bs) for bs in s.index.values()):
        out.append("an index entry is repeated")
    if any(len(set(ks)) != len(ks) for ks in s.secondary):
        out.append("a secondary key is repeated")
    if any(k not in s.names for k in s.index):
        out.append("an index key names no prefix")
    if any(not 0 <= b < s.num_blocks for b in s.watchers):
        out.append("a watcher sits on no block of the pool")
    return out


def _check_state(run: _Run, s: PoolState, interp: Interp, what: str) -> None:
    """Every checked predicate on one state, z3 against the model."""
    rep = run.report
    lost = unfaithful(s)
    if lost:
        rep.unfaithful += 1
    for name, pred in run.compiled.predicates.items():
        want = MODEL_PREDICATES[name](s)
        try:
            got: bool | None = pred(interp)
        except Undetermined:
            got = None
        if lost:
            # The encoding forgets what makes s unfaithful: it can only be weaker.
            if want and got is not True:
                run.report.add(Disagreement(
                    f"invariant/{name}", s, what,
                    f"{name}: the model holds it on a state the encoding cannot represent "
                    f"({'; '.join(lost)}), but z3's form is {_show_bool(got)} there"))
            continue
        counts = rep.invariants.setdefault(name, [0, 0])
        counts[0 if want else 1] += 1
        if got is not want:
            rep.add(Disagreement(f"invariant/{name}", s, what,
                                 f"{name}: model {want}, z3 {_show_bool(got)}"))


def _show_bool(v: bool | None) -> str:
    return "undetermined (reads a cell the model leaves undefined)" if v is None else str(v)


# --------------------------------------------------------------------------
# Perturbations: states near a reached one where the model's predicates fail.


def _with_index(index: Mapping[Key, tuple[int, ...]], k: Key,
                blocks: tuple[int, ...]) -> dict[Key, tuple[int, ...]]:
    out = dict(index)
    if blocks:
        out[k] = blocks
    else:
        out.pop(k, None)
    return out


def perturbations(s: PoolState, d: Carriers, turn: int) -> Iterator[tuple[str, PoolState]]:
    """Small edits of ``s``, each labelled, that break (or keep) some invariant.

    ``turn`` rotates the block, key and content each edit picks, so that the
    edits of many states touch every block and many keys.
    """
    n = s.num_blocks
    real = list(range(1, n))
    b = real[turn % len(real)] if real else NULL
    keys = d.keys
    k = keys[turn % len(keys)]
    contents = d.contents
    entries = sorted((kk, bb) for kk, bs in s.index.items() for bb in bs)
    named = sorted(s.names)
    hashed = [x for x in range(n) if s.primary[x] is not None]
    hbs = s.hash_block_size

    if entries:
        kk, bb = entries[turn % len(entries)]
        yield "an index entry dropped", replace(
            s, index=_with_index(s.index, kk, tuple(x for x in s.index[kk] if x != bb)))
        yield "an index entry repeated", replace(s, index={**s.index, kk: (*s.index[kk], bb)})
        yield "an index key with an empty list", replace(s, index={**s.index, kk: ()})
        yield "an announcement dropped", replace(s, announced=s.announced - {(kk, bb)})
        if kk in s.names:
            names = dict(s.names)
            del names[kk]
            yield "an indexed key's name forgotten", replace(s, names=names)
            other = contents[(contents.index(s.names[kk]) + 1 + turn) % len(contents)]
            yield "an indexed key names another prefix", replace(s, names={**s.names, kk: other})
            yield "an indexed block holds another prefix", replace(
                s, holds=_set(s.holds, bb, contents[(contents.index(s.holds[bb]) + 1 + turn)
                                                      % len(contents)]))
    for x in (b, NULL):
        if x not in s.index.get(k, ()):
            yield f"block {x} indexed under a key it does not have", replace(
                s, index={**s.index, k: (*s.index.get(k, ()), x)},
                names=s.names if k in s.names else {**s.names, k: s.holds[x]})
        if (k, x) not in s.announced:
            yield f"an announcement of block {x} nobody indexed", replace(
                s, announced=s.announced | {(k, x)})
    if s.free:
        head = list(s.free)[turn % len(s.free)]
        yield "a free block dropped from the queue", replace(s, free=Queue(x for x in s.free if x != head))
    busy = [x for x in range(n) if x not in s.free]
    if busy:
        x = busy[turn % len(busy)]
        yield f"block {x} (ref {s.ref[x]}) queued", replace(s, free=Queue([*s.free, x]))
    for delta in (+1, -1):
        yield f"block {b}'s count {delta:+d}", replace(s, ref=_set(s.ref, b, s.ref[b] + delta))
        yield f"block {b}'s holders {delta:+d}", replace(s, holders=_set(s.holders, b, s.holders[b] + delta))
    yield "the null block's count -1", replace(s, ref=_set(s.ref, NULL, s.ref[NULL] - 1))
    idle = [x for x in hashed if x != NULL and s.ref[x] == 0]
    if idle:
        x = idle[turn % len(idle)]
        yield f"idle hashed block {x} left out of the queue", replace(
            s, free=Queue(y for y in s.free if y != x))
    inuse = [x for x in hashed if x != NULL and s.ref[x] > 0]
    if inuse:
        x = inuse[turn % len(inuse)]
        yield f"hashed block {x} idle but not queued", replace(
            s, ref=_set(s.ref, x, 0), holders=_set(s.holders, x, 0))
    yield f"block {b} holds another prefix", replace(
        s, holds=_set(s.holds, b, contents[(contents.index(s.holds[b]) + 1 + turn) % len(contents)]))
    if named:
        kk = named[turn % len(named)]
        other = contents[(contents.index(s.names[kk]) + 1) % len(contents)]
        yield "a key names another prefix", replace(s, names={**s.names, kk: other})
    for x in hashed:
        p = s.primary[x]
        assert p is not None
        yield f"block {x} loses its primary key", replace(s, primary=_set(s.primary, x, None))
        for tokens in (0, p.num_tokens + 1, -hbs):
            yield f"block {x}'s primary covers {tokens} tokens", replace(
                s, primary=_set(s.primary, x, Primary(p.key, tokens)))
        yield f"block {x}'s primary key as a secondary too", replace(
            s, secondary=_set(s.secondary, x, (*s.secondary[x], p.key)))
        extra = next((kk for kk in keys if kk != p.key and kk not in s.secondary[x]), None)
        if extra is not None:
            yield f"block {x} gains a secondary key", replace(
                s, secondary=_set(s.secondary, x, (*s.secondary[x], extra)),
                index={**s.index, extra: (*s.index.get(extra, ()), x)},
                names=s.names if extra in s.names else {**s.names, extra: s.holds[x]},
                announced=s.announced | {(extra, x)})
        if s.secondary[x]:
            yield f"block {x}'s secondary key repeated", replace(
                s, secondary=_set(s.secondary, x, (*s.secondary[x], s.secondary[x][0])))
    unhashed = [x for x in range(n) if s.primary[x] is None]
    if unhashed:
        x = unhashed[turn % len(unhashed)]
        yield f"unhashed block {x} gains a secondary key", replace(
            s, secondary=_set(s.secondary, x, (*s.secondary[x], k)),
            index={**s.index, k: (*s.index.get(k, ()), x)} if x not in s.index.get(k, ()) else s.index,
            names=s.names if k in s.names else {**s.names, k: s.holds[x]})
    yield "the null block hashed", replace(
        s, primary=_set(s.primary, NULL, Primary(k, hbs)),
        index={**s.index, k: (*s.index.get(k, ()), NULL)},
        names=s.names if k in s.names else {**s.names, k: s.holds[NULL]})
    yield "a watcher on the null block", replace(s, watchers={**s.watchers, NULL: bmc.watcher_a})
    yield f"a watcher on block {b}", replace(s, watchers={**s.watchers, b: bmc.watcher_b})
    yield "a watcher on a block the pool does not have", replace(
        s, watchers={**s.watchers, n: bmc.watcher_a})
    if s.watchers:
        x = sorted(s.watchers)[turn % len(s.watchers)]
        yield f"block {x}'s watcher dropped", replace(
            s, watchers={y: w for y, w in s.watchers.items() if y != x})
    yield "caching off", replace(s, caching=False)
    yield ("events off", replace(s, events_on=False)) if s.events_on else (
        "events on", replace(s, events_on=True))


def _set(t: Sequence[T], i: int, v: T) -> list[T]:
    """A copy of ``t`` with item ``i`` replaced."""
    return [*t[:i], v, *t[i + 1:]]


# --------------------------------------------------------------------------
# Calls: the model's action against its decomposition into z3 steps.


Plan = Split
"""A call as z3 steps (the declaration's split, :mod:`kvpool.model.split`)."""


def plan(s: PoolState, name: str, args: Sequence[Any], result: Any) -> Plan:
    """The per-block decomposition of one call, as its declaration states it (``result``: the
    model's, ``None`` when it refused)."""
    op = OPERATIONS[name]
    return op.split(s, result, *op.bind(args))


def _block_arg(spec: StepSpec) -> int | None:
    """Where a step's block argument ``b`` is (the block whose entries its events name)."""
    return next((i for i, (arg, sort) in enumerate(spec.args) if arg == "b" and sort.eq(Block)), None)


_BLOCK_ARG = {name: _block_arg(spec) for name, spec in STEPS.items()}


def _step_block(step: str, args: tuple[Any, ...]) -> int | None:
    """The block a step processes, if any."""
    at = _BLOCK_ARG.get(step)
    return None if at is None else int(args[at])


Entries = set[tuple[int, int]]
"""(key index, block) pairs."""


def event_entries(call: str, p: Plan, before: PoolState, after: PoolState, events: Sequence[Event],
                  kid: Mapping[Key, int]) -> tuple[list[Entries], list[Entries], list[str]]:
    """The model's events as per-step (key, block) entries: (removed, stored, unattributed).

    ``Removed`` and ``Stored`` name keys, not blocks; a batch processes its
    blocks in order and each block's events come together.  A ``Removed``
    of key k belongs to the next step whose block had k before the call, a
    stored key to the next step whose block has it after.  The ``Stored`` of
    ``emit_cached_block_events`` reports cache hits: it announces no entry
    (the model's ghost ``announced`` does not change) and is not attributed.
    ``_insert_block_hash`` publishes nothing: its caller announces the entry,
    which the model's ghost ``announced`` gains.
    """
    blocks = [_step_block(st, a) for st, a in p.steps]
    removed: list[Entries] = [set() for _ in p.steps]
    stored: list[Entries] = [set() for _ in p.steps]
    lost: list[str] = []
    r_at = s_at = 0
    for ev in events:
        if isinstance(ev, Removed):
            k = (ev.hash, ev.group)
            while r_at < len(blocks) and not (
                    blocks[r_at] is not None and k in _keys_of(before, blocks[r_at])  # type: ignore[arg-type]
                    and (kid[k], blocks[r_at]) not in removed[r_at]):
                r_at += 1
            if r_at == len(blocks):
                lost.append(f"Removed({_short(k)})")
                continue
            removed[r_at].add((kid[k], blocks[r_at]))  # type: ignore[arg-type]
        elif isinstance(ev, Stored) and call != "emit_cached_block_events":
            for h in ev.hashes:
                k = (h, ev.group)
                while s_at < len(blocks) and not (
                        blocks[s_at] is not None and k in _keys_of(after, blocks[s_at])  # type: ignore[arg-type]
                        and not stored[s_at]):
                    s_at += 1
                if s_at == len(blocks):
                    lost.append(f"Stored({_short(k)})")
                    continue
                stored[s_at].add((kid[k], blocks[s_at]))  # type: ignore[arg-type]
    if call == "_insert_block_hash" and p.steps:
        stored[0] |= {(kid[k], b) for k, b in after.announced - before.announced}
    return removed, stored, lost


def _short(k: Key) -> str:
    return f"{k[0].hex()[:6]}/g{k[1]}"


def _tokens(c: Any) -> str:
    return "<" + "".join(str(t) for chunk in c for t in chunk[0]) + ">"


def show_state(s: PoolState, labels: Mapping[Key, str] | None = None) -> str:
    """A model state in a few lines: each block, the index, the names, the announcements."""
    labels = labels or {}

    def lab(k: Key) -> str:
        return labels.get(k) or _short(k)

    lines = [f"pool: {s.num_blocks} blocks, hash_block_size {s.hash_block_size}, caching "
             f"{'on' if s.caching else 'off'}, events {'on' if s.events_on else 'off'}; "
             f"free queue {list(s.free)}"]
    for b in range(s.num_blocks):
        p = s.primary[b]
        keys = (f"{lab(p.key)}@{p.num_tokens}" if p else "unhashed") + "".join(
            f" +{lab(k)}" for k in s.secondary[b])
        lines.append(f"block {b}{' (null)' if b == NULL else ''}: ref {s.ref[b]}, holders "
                     f"{s.holders[b]}, {keys}, holds {_tokens(s.holds[b])}"
                     + (", watched" if b in s.watchers else ""))
    if any(b >= s.num_blocks or b < 0 for b in s.watchers):
        lines.append(f"watchers on {sorted(s.watchers)}")
    lines.append("index: " + (", ".join(f"{lab(k)} -> {list(bs)}" for k, bs in s.index.items())
                              or "empty"))
    lines.append("names: " + (", ".join(f"{lab(k)} = {_tokens(c)}" for k, c in s.names.items())
                              or "none"))
    lines.append("announced: " + (", ".join(f"({lab(k)}, {b})" for k, b in sorted(s.announced))
                                  or "none"))
    return "\n".join(lines)


def _converters(d: Carriers, spec: StepSpec) -> tuple[Mapping[Any, int] | None, ...]:
    """Per argument of ``spec``: the table that turns a model value into the compiled form."""
    return tuple(d.key_id if sort.eq(KeySort) else d.content_id if sort.eq(Content) else None
                 for _n, sort in spec.args)


def _concrete(conv: tuple[Mapping[Any, int] | None, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Step arguments as the compiled steps take them (keys and contents by index)."""
    return tuple(v if c is None else c[v] for c, v in zip(conv, args, strict=True))


Outcome = tuple[bool, int, Interp, list[frozenset[tuple[int, int]]], list[frozenset[tuple[int, int]]]]
"""(every step enabled, steps enabled, state after them, removed per step, stored per step)."""


def _run_steps(run: _Run, memo: dict[tuple[Any, ...], Outcome], start: Interp,
               steps: tuple[tuple[str, tuple[Any, ...]], ...]) -> Outcome:
    """The z3 steps in sequence from ``start`` (memoised per state: calls share prefixes)."""
    if steps in memo:
        return memo[steps]
    if not steps:
        out: Outcome = (True, 0, start, [], [])
    else:
        ok, done, cur, rem, sto = _run_steps(run, memo, start, steps[:-1])
        if not ok:
            out = (ok, done, cur, rem, sto)
        else:
            name, args = steps[-1]
            step = run.compiled.steps[name]
            cargs = _concrete(run.compiled.converters[name], args)
            if not step.pre(cur, *cargs):
                out = (False, done, cur, rem, sto)
            else:
                nxt, r, s_ = step.post(cur, *cargs)
                out = (True, done + 1, nxt, [*rem, r], [*sto, s_])
    memo[steps] = out
    return out


def _next_interp(d: Carriers, before: PoolState, base: Interp, after: PoolState) -> Interp:
    """:func:`abstract` of ``after``, reusing ``base`` (the abstraction of ``before``) where unchanged."""
    if after is before:
        return base
    full = abstract(d, after) if (after.secondary != before.secondary or after.index != before.index
                                  or after.announced != before.announced) else None
    if full is not None:
        return full
    kid, cid = d.key_id, d.content_id
    n = after.num_blocks
    if after.free == before.free:
        free = base.free
    else:
        fs = set(after.free)
        free = tuple(b in fs for b in range(n))
    if after.primary == before.primary:
        prim, pkey, ptok = base.prim, base.pkey, base.ptok
    else:
        prim = tuple(p is not None for p in after.primary)
        pkey = tuple(None if p is None else kid[p.key] for p in after.primary)
        ptok = tuple(None if p is None else p.num_tokens for p in after.primary)
    names = base.names
    if after.names != before.names:
        lst: list[int | None] = [None] * len(d.keys)
        for k, c in after.names.items():
            lst[kid[k]] = cid[c]
        names = tuple(lst)
    return Interp(
        ref=tuple(after.ref), free=free, prim=prim, pkey=pkey, ptok=ptok, sec=base.sec, idx=base.idx,
        watched=base.watched if after.watchers.keys() == before.watchers.keys()
        else tuple(b in after.watchers for b in range(n)),
        holds=base.holds if after.holds == before.holds else tuple(cid[c] for c in after.holds),
        names=names, holders=tuple(after.holders), live=base.live, events=after.events_on,
        caching=after.caching, hbs=after.hash_block_size)


def differences(z: Interp, m: Interp, d: Carriers) -> list[str]:
    """The fields where z3's state ``z`` differs from the model's ``m`` (undefined cells excepted)."""
    out = []
    for f in Interp._fields:
        zv, mv = getattr(z, f), getattr(m, f)
        if zv == mv:
            continue
        if f in ("pkey", "ptok"):  # meaningful only where the model has a primary key
            bad = [b for b, p in enumerate(m.prim) if p and zv[b] != mv[b]]
            if bad:
                out.append(f"{f} at block(s) {bad}: z3 {[zv[b] for b in bad]}, model "
                           f"{[mv[b] for b in bad]}")
            continue
        if f == "names":  # meaningful only where the model names the key
            bad = [i for i, c in enumerate(mv) if c is not None and zv[i] != c]
            if bad:
                out.append("names of " + ", ".join(
                    f"{_short(d.keys[i])}: z3 {_content(d, zv[i])}, model {_content(d, mv[i])}"
                    for i in bad))
            continue
        if isinstance(zv, frozenset):
            out.append(f"{f}: z3 also has {_pairs(d, f, zv - mv)}, model also has {_pairs(d, f, mv - zv)}")
        else:
            out.append(f"{f}: z3 {zv}, model {mv}")
    return out


def _content(d: Carriers, c: int | None) -> str:
    if c is None:
        return "undefined"
    return "".join(str(t) for chunk in d.contents[c] for t in chunk[0]) or "()"


def _pairs(d: Carriers, f: str, pairs: frozenset[tuple[int, int]]) -> str:
    if f == "sec":
        return "{" + ", ".join(f"block {b}: {_short(d.keys[k])}" for b, k in sorted(pairs)) + "}"
    return "{" + ", ".join(f"({_short(d.keys[k])}, block {b})" for k, b in sorted(pairs)) + "}"


def _check_call(run: _Run, s: PoolState, interp: Interp, memo: dict[tuple[Any, ...], Outcome],
                call: bmc.Call) -> PoolState | None:
    """Run one call on the model and through the z3 steps; the model's next state if it accepted."""
    name, args = call
    rep = run.report
    rep.calls += 1
    op = OPERATIONS[name]
    nxt: PoolState | None = None
    result: Any = None
    try:
        nxt = s.copy()
        result = op.run(nxt, op.bind(args))
    except ContractBroken as broken:
        nxt = None
        if broken.contract in BATCH_CONTRACTS:
            rep.skipped[f"contract {broken.contract} (on the whole batch)"] += 1
            return None
        verdict = f"caller broke {broken.contract}"
    except Refusal as refusal:
        nxt = None
        if refusal.kind in ARGUMENT_REFUSALS:
            rep.skipped[f"refused {refusal.kind.name} (argument shape)"] += 1
            return None
        verdict = f"refused {refusal.kind.name}"
    else:
        verdict = "accepted"
    accepted = nxt is not None
    p = plan(s, name, args, result)
    if name == "reset_prefix_cache" and result is False:
        verdict, accepted = "refused (blocks in use)", False
    rep.transitions += 1
    counts = rep.steps.setdefault(p.name, [0, 0])
    counts[0 if accepted else 1] += 1
    ok, done, after, removed, stored = _run_steps(run, memo, interp, p.steps)
    case = f"step/{p.name}"
    if not accepted:
        if ok and p.exhaust is not None:
            free = [b for b in range(s.num_blocks) if run.compiled.steps[p.exhaust].pre(after, b)]
            if free:
                rep.add(Disagreement(case, s, _described(call, verdict),
                                     f"z3 still enables {p.exhaust} of block(s) {free} after "
                                     f"{done} {p.exhaust} step(s)"))
        elif ok:
            rep.add(Disagreement(case, s, _described(call, verdict), "z3 enables every step: "
                                 + " ; ".join(_show_step(st, a) for st, a in p.steps)))
        return None
    assert nxt is not None
    if not ok:
        st, a = p.steps[done]
        rep.add(Disagreement(case, s, _described(call, verdict), f"z3 precondition of step {done + 1} "
                             f"({_show_step(st, a)}) is false"))
        return nxt
    d = run.compiled.domain
    want = _next_interp(d, s, interp, nxt)
    diff = [] if after == want else differences(after, want, d)
    m_removed, m_stored, lost = event_entries(name, p, s, nxt, nxt.out.events, d.key_id)
    for i, (st, a) in enumerate(p.steps if s.events_on else ()):  # read only under events
        for label, z, m in (("removed", removed[i], m_removed[i]), ("stored", stored[i], m_stored[i])):
            if z != m:
                diff.append(f"step {i + 1} ({_show_step(st, a)}) {label}: z3 {_pairs(d, label, z)}, "
                            f"model's events {_pairs(d, label, frozenset(m))}")
    if lost:
        diff.append(f"model events naming no entry of the blocks processed: {', '.join(lost)}")
    if diff:
        rep.add(Disagreement(case, s, _described(call, verdict), "; ".join(diff)))
        return nxt
    queue = _check_queue(run, s, nxt, call, p)
    runs = [(st, memo[p.steps[:i]][2], memo[p.steps[:i + 1]][2], _concrete(run.compiled.converters[st], a),
             removed[i], stored[i]) for i, (st, a) in enumerate(p.steps)]
    _check_properties(run, s, nxt, result, call, runs, queue)
    return nxt


# --------------------------------------------------------------------------
# The queue as a sequence, and the step properties both ways.

QueueRun = list[tuple[QInterp, QInterp, str, tuple[Any, ...]]]
"""Queue steps as run: (queue before, queue after, step, arguments)."""
StepRun = list[tuple[str, Interp, Interp, tuple[Any, ...], frozenset[tuple[int, int]],
                     frozenset[tuple[int, int]]]]
"""z3 steps as run: (step, state before, state after, arguments, removed, stored)."""


def queue_plan(p: Plan, after: PoolState) -> list[tuple[str, tuple[Any, ...]]]:
    """An accepted call as queue steps (:data:`.order.QSTEPS`), from its split: ``free_blocks``
    reserves a head place per listing first; a step that changes hashes is ``recache`` of each
    block it names, to the cachedness the block ends with."""
    def cached(b: int) -> bool:
        return after.caching and after.primary[b] is not None

    releases = sum(1 for st, _a in p.steps if st == "release")
    out: list[tuple[str, tuple[Any, ...]]] = [("open_batch", (releases,))] if releases else []
    for st, a in p.steps:
        if st in ("alloc", "release", "touch", "unpin"):
            out.append((st, (a[0],)))
        elif st == "reset":
            out.append(("uncache_all", ()))
        elif st in ("evict", "cache_full", "cache_partial", "insert", "move"):
            out += [("recache", (b, cached(b))) for b in ((a[0], a[1]) if st == "move" else (a[0],))]
        else:
            out.append(("identity", ()))
    return out


def _check_queue(run: _Run, s: PoolState, after: PoolState, call: bmc.Call, p: Plan) -> QueueRun:
    """The queue steps from ``s``'s queue: enabled, and leaving ``after``'s queue, IN ORDER."""
    rep = run.report
    q = queue_of(s)
    done: QueueRun = []
    try:
        for name, args in queue_plan(p, after):
            step = run.compiled.queue[name]
            if not step.pre(q, *args):
                rep.add(Disagreement(f"queue/{name}", s, _described(call, "accepted"),
                                     f"the z3 queue step {name}{args} is not enabled"))
                return []
            nq = step.post(q, *args)
            done.append((q, nq, name, args))
            q = nq
        got = queue_order(q)
    except Undetermined as exc:
        rep.add(Disagreement("queue/order", s, _described(call, "accepted"), f"undetermined: {exc}"))
        return []
    rep.queues += 1
    want = queue_of(after)
    if got != tuple(after.free) or (q.ref, q.free, q.cached) != (want.ref, want.free, want.cached):
        rep.add(Disagreement("queue/order", s, _described(call, "accepted"),
                             f"z3's queue {list(got)}, the model's {list(after.free)}"
                             + ("" if (q.ref, q.cached) == (want.ref, want.cached)
                                else f"; counts or cachedness differ: z3 {q.ref} {q.cached}, model "
                                     f"{want.ref} {want.cached}")))
    return done


def _z3_says(run: _Run, steps: StepRun, queue: QueueRun) -> dict[str, bool | None]:
    """Each step property the z3 side states of the call: every step it speaks of keeps it
    (``None``: it reads a cell the model leaves undefined)."""
    out: dict[str, bool | None] = {}
    for prop, per_step in run.compiled.claims.items():
        for name, st, post, args, removed, stored in steps:
            claim = per_step.get(name)
            if claim is None:
                continue
            try:
                held: bool | None = claim(st, post, *args, True, removed, stored)
            except Undetermined:
                held = None
            prev = out.get(prop, True)
            out[prop] = None if prev is None or held is None else prev and held
    for q, qp, name, args in queue:
        for prop, claim in run.compiled.queue[name].claims.items():
            if prop in STEP_PROPERTIES:
                prev = out.get(prop, True)
                out[prop] = None if prev is None else prev and claim(q, qp, *args)
    return out


def _compare(run: _Run, s: PoolState, call: bmc.Call, t: Transition, said: Mapping[str, bool | None],
             what: str, only: str | None = None) -> None:
    """The model's step properties of ``t`` against what z3 says (``only``: that one)."""
    for prop, z in said.items():
        if only is not None and prop != only:
            continue
        want = STEP_PROPERTIES[prop](t)
        counts = run.report.properties.setdefault(prop, [0, 0])
        counts[0 if want else 1] += 1
        if z is not want:
            run.report.add(Disagreement(
                f"property/{prop}", s, _described(call, what),
                f"{prop}: model {want}, z3 {_show_bool(z)}"))


def _check_properties(run: _Run, s: PoolState, nxt: PoolState, result: Any, call: bmc.Call,
                      steps: StepRun, queue: QueueRun) -> None:
    """Every step property z3 states, on the call as made and on transitions made wrong on purpose.

    Reachable calls keep every property, so each accepted call is also altered (one in
    ``perturb`` of them, rotating) in a way that breaks one property in the model: a block
    nobody holds given other content, a shared block's content replaced, an evicted block left
    indexed, a ``Stored`` of a live
    entry, a ``Removed`` of a key nobody announced, two queued blocks swapped, the second
    queued block handed out.  z3's property of the same name, asked of the altered
    transition, must be false too (both ways).
    """
    name, args = call
    op = OPERATIONS[name]
    _compare(run, s, call, op.transition(s, nxt, args, result, out=nxt.out), _z3_says(run, steps, queue),
             "accepted")
    run.turn += 1
    if not steps or run.perturb == 0 or run.turn % run.perturb:
        return
    for label, prop, after, res, out, last, qlast, before in _altered(
            run, s, nxt, result, call, steps, queue):
        st_, post, a, rem, sto = last
        said = _z3_says(run, [*steps[:-1], (steps[-1][0], st_, steps[-1][2] if post is None else post, a,
                                            rem, sto)],
                        [*queue[:-1], qlast] if qlast is not None else queue)
        _compare(run, s, call, op.transition(before or s, after, args, res, out=out), said,
                 f"altered: {label}", prop)


class Altered(NamedTuple):
    """A transition altered to break one property in the model, and the same on the z3 side."""

    label: str
    prop: str
    """The property the alteration breaks."""
    after: PoolState
    result: Any
    out: Output
    last: tuple[Interp, Any, tuple[Any, ...], frozenset[tuple[int, int]], frozenset[tuple[int, int]]]
    """The last z3 step's (state, post or None: unchanged, args, removed, stored)."""
    qlast: tuple[QInterp, QInterp, str, tuple[Any, ...]] | None
    """The last queue step, altered (None: unchanged)."""
    before: PoolState | None = None
    """The state before, when the alteration changes it too (None: the reached one)."""


def _altered(run: _Run, s: PoolState, nxt: PoolState, result: Any, call: bmc.Call, steps: StepRun,
             queue: QueueRun) -> Iterator[Altered]:
    d = run.compiled.domain
    name = call[0]
    lname, lst, _post, largs, lrem, lsto = steps[-1]
    same = (lst, None, largs, lrem, lsto)
    if name not in CACHE_RECORDS:
        idle = [x for x in range(1, s.num_blocks) if s.holders[x] == 0 and nxt.holders[x] == 0]
        if idle:
            x = idle[run.turn % len(idle)]
            other = d.contents[(d.content_id[nxt.holds[x]] + 1) % len(d.contents)]
            after = nxt.copy()
            after.holds[x] = other
            yield Altered(

                "content of unheld block changed", "content_changes_only_through_holders", after, result,
                   nxt.out, (lst, abstract(d, after), largs, lrem, lsto), None)
    shared = [x for x in range(1, s.num_blocks) if s.holders[x] >= 2 and lst.holders[x] >= 2]
    if shared and len(steps) == 1:
        x = shared[run.turn % len(shared)]
        before = s
        if s.holds[x] == EMPTY_PREFIX:  # nothing replaces the empty prefix: say it held some
            before = s.copy()
            before.holds[x] = max(d.contents, key=len)
        lost = next(c for c in d.contents if not extends(c, before.holds[x]))
        after = nxt.copy()
        after.holds[x] = lost
        yield Altered(

            "a shared block's content replaced", "shared_content_only_grows", after, result, nxt.out,
               (abstract(d, before), abstract(d, after), largs, lrem, lsto), None, before)
    if name in EVICTIONS and lname == "evict" and s.primary[largs[0]] is not None:
        b = largs[0]
        p = s.primary[b]
        assert p is not None
        after = nxt.copy()
        after.primary[b] = p
        after.index[p.key] = (*after.index.get(p.key, ()), b)
        after.names.setdefault(p.key, s.names[p.key])
        yield Altered(

            "evicted block keeps its primary entry", "evicted_blocks_leave_the_index", after, result,
               nxt.out, (lst, abstract(d, after), largs, lrem, lsto), None)
    if s.events_on and name != "emit_cached_block_events":
        live = sorted((k, b) for k, b in s.announced
                      if (k, b) in nxt.announced and (d.key_id[k], b) in lst.live
                      and (d.key_id[k], b) not in lrem)
        if live:
            k, b = live[run.turn % len(live)]
            extra = Stored((k[0],), None, (), 1, None, None, None, k[1], s.medium, None)
            yield Altered(

                "a Stored of a live entry", "event_announcements_match_index", nxt, result,
                   Output([*nxt.out.events, extra], nxt.out.fired, nxt.out.told),
                   (lst, None, largs, lrem, lsto | {(d.key_id[k], b)}), None)
        touched = {(ev.hash, ev.group) for ev in nxt.out.events if isinstance(ev, Removed)}
        touched |= {(h, ev.group) for ev in nxt.out.events if isinstance(ev, Stored) for h in ev.hashes}
        dead = [k for k in d.keys if k not in touched and k not in nxt.index
                and not any(kk == k for kk, _b in s.announced)]
        if dead:
            k = dead[run.turn % len(dead)]
            yield Altered(

                "a Removed of a key never announced", "event_removals_name_live_keys", nxt, result,
                   Output([*nxt.out.events, Removed(k[0], k[1], s.medium)], nxt.out.fired, nxt.out.told),
                   (lst, None, largs, lrem | {(d.key_id[k], 1)}, lsto), None)
    if name == "reset_prefix_cache" and result is True:
        after = nxt.copy()
        after.watchers = {1: bmc.watcher_a}
        yield Altered(

            "a watcher kept by the reset", "reset_needs_an_idle_pool", after, result, nxt.out,
               (lst, abstract(d, after), largs, lrem, lsto), None)
    if queue:
        q, qp, qname, qargs = queue[-1]
        stay = [b for b in s.free if b in nxt.free]
        if len(stay) >= 2 and all(qp.free[b] and q.free[b] for b in stay[:2]):
            x, y = stay[0], stay[1]
            after = nxt.copy()
            after.free = Queue(y if b == x else x if b == y else b for b in nxt.free)
            pos = list(qp.pos)
            pos[x], pos[y] = pos[y], pos[x]
            yield Altered(

                "two queued blocks swapped", "queue_keeps_relative_order", after, result, nxt.out, same,
                   (q, qp._replace(pos=tuple(pos)), qname, qargs))
        arrived = [b for b in range(s.num_blocks) if qp.free[b] and not q.free[b]]
        if arrived and len(nxt.free) >= 2:
            x = arrived[-1]
            rest = [b for b in nxt.free if b != x]
            to_tail = nxt.free.members()[0] == x
            after = nxt.copy()
            after.free = Queue([*rest, x] if to_tail else [x, *rest])
            places = [v for v in qp.pos if v is not None]
            moved = max(places) + 1 if to_tail else min(places) - 1
            pos = list(qp.pos)
            pos[x] = moved
            yield Altered(

                "a freed block at the other end", "queue_follows_eviction_policy", after, result, nxt.out,
                   same, (q, qp._replace(pos=tuple(pos), lo=min(qp.lo, moved), hi=max(qp.hi, moved + 1)),
                          qname, qargs))
        if name == "get_new_blocks" and len(queue) == 1 and len(s.free) >= 2:
            second = s.free.members()[1]
            after = nxt.copy()
            after.free = Queue(b for b in s.free if b != second)
            alloc = run.compiled.queue["alloc"]
            yield Altered(

                "the second queued block handed out", "allocation_takes_queue_head", after, [second],
                   nxt.out, same, (q, alloc.post(q, second), "alloc", (second,)))


def _described(call: bmc.Call, verdict: str) -> str:
    """A call and the model's verdict (spelled out only when a disagreement is reported)."""
    name, args = call
    return f"{name}({', '.join(bmc.show_arg(a) for a in args)}), model: {verdict}"


def _show_step(step: str, args: tuple[Any, ...]) -> str:
    shown = []
    for v in args:
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], bytes):
            shown.append(_short(v))
        elif isinstance(v, tuple):
            shown.append("<" + "".join(str(t) for chunk in v for t in chunk[0]) + ">")
        else:
            shown.append(repr(v))
    return f"{step}({', '.join(shown)})"


# --------------------------------------------------------------------------
# The search: the BMC's states and calls, each checked.


@dataclass
class _Run:
    compiled: Compiledset
    report: Report
    perturb: int
    turn: int = 0


def check(cfg: bmc.Bounds, depth: int, seconds: float = 3600.0, *, perturb: int = 1,
          steps: Mapping[str, StepSpec] | None = None,
          predicates: Mapping[str, SymInvariant] | None = None,
          properties: Mapping[str, SymStepProperty] | None = None,
          queue: Mapping[str, tuple[Callable[..., Any], Any]] | None = None,
          start: PoolState | None = None) -> Report:
    """Check the encoding on every state the BMC keeps up to ``depth`` and every call it makes.

    The search is :func:`kvpool.proofs.bmc.explore`'s (same calls, same
    symmetry reduction, same states), without its property checks: each
    kept state's predicates are compared, and those of one in ``perturb`` of
    its perturbations (rotating, so that consecutive states get different
    ones; 0: none); each call from a state above the last level is compared.
    ``steps``/``predicates``/``properties``/``queue`` replace compiled terms
    by name (seeded encoding bugs); ``start`` replaces the initial state (a focused check).  Stops
    after ``seconds`` (``complete`` is then false).
    """
    began, cpu = time.perf_counter(), time.process_time()
    compiled = compile_all(domain_of(cfg), steps, predicates, properties, queue)
    rep = Report(cfg.blocks, cfg.hash_block_size, depth, events=cfg.events_on)
    run = _Run(compiled, rep, perturb)
    rep.invariants = {n: [0, 0] for n in compiled.predicates}
    rep.steps = {n: [0, 0] for n in compiled.steps}
    requests = cfg.requests()
    renamings = bmc.renamings_of(cfg) if cfg.symmetry else []
    memo_key: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def key(s: PoolState) -> tuple[Any, ...]:
        if not cfg.symmetry:
            return bmc.canonical(s)
        exact = s.variables()
        if exact not in memo_key:
            memo_key[exact] = bmc.orbit_key(s, renamings)
        return memo_key[exact]

    def visit(s: PoolState) -> Interp:
        rep.states += 1
        interp = abstract(compiled.domain, s)
        _check_state(run, s, interp, "a state the BMC keeps")
        if perturb:
            run.turn += 1
            for j, (label, ps) in enumerate(perturbations(s, compiled.domain, run.turn)):
                if (run.turn + j) % perturb != 0:
                    continue
                rep.perturbed += 1
                rep.perturbations[re.sub(r"-?\d+", "N", label)] += 1
                _check_state(run, ps, abstract(compiled.domain, ps), f"perturbed: {label}")
        return interp

    s0 = start.copy() if start is not None else cfg.initial()
    s0.events = []
    seen = {key(s0)}
    frontier = [(s0, visit(s0))]
    for level in range(1, depth + 1):
        nxt_level: list[tuple[PoolState, Interp]] = []
        for s, interp in frontier:
            if time.perf_counter() - began > seconds:
                rep.complete = False
                rep.seconds, rep.cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
                return rep
            memo: dict[tuple[Any, ...], Outcome] = {}
            for call in bmc.calls(s, cfg, requests):
                after = _check_call(run, s, interp, memo, call)
                if after is None:
                    continue
                c = key(after)  # the key reads no events, notices or metrics
                if c not in seen:
                    seen.add(c)
                    after.events = []
                    nxt_level.append((after, visit(after)))
        rep.depth, frontier = level, nxt_level
        if not frontier:
            break
    rep.seconds, rep.cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    return rep


# --------------------------------------------------------------------------
# The compiled terms against z3 itself, on a sample.


@dataclass
class Sampled:
    """How the compiled terms fared against z3 on a sample."""

    steps: Counter[str] = field(default_factory=Counter)
    """Step instances checked, by step (precondition, and the result where it holds)."""
    enabled: int = 0
    predicates: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def checks(self) -> int:
        return sum(self.steps.values()) + sum(self.predicates.values())


def _random_args(rng: random.Random, cfg: bmc.Bounds, requests: Sequence[bmc.Request], d: Carriers,
                 spec: StepSpec) -> tuple[Any, ...]:
    """Arguments of ``spec`` from the BMC's domains (a key, its token count and its prefix agree)."""
    hbs = cfg.hash_block_size
    r = rng.choice(requests)
    t = hbs * rng.randint(1, len(r.block_hashes))
    out: list[Any] = []
    for name, sort in spec.args:
        if sort.eq(Block):
            out.append(rng.randrange(cfg.blocks))
        elif sort.eq(KeySort):
            out.append(d.key_id[(r.block_hashes[t // hbs - 1], rng.choice(cfg.groups))])
        elif sort.eq(Content):
            out.append(d.content_id[content(r, t, hbs)])
        elif name == "t":
            out.append(t)
        else:
            out.append(rng.random() < 0.5)
    return tuple(out)


def z3_sample(cfg: bmc.Bounds, n: int, seed: int = 0) -> Sampled:
    """Check the compiled steps and predicates against z3 (:func:`.evaluate.cross_check`) on ``n``
    states of random walks through the BMC's calls: on each, one step (rotating; arguments drawn
    until its precondition holds, if it can) and one predicate on the state or a perturbation."""
    start = time.perf_counter()
    rng = random.Random(seed)
    d = domain_of(cfg)
    cs = compile_all(d)
    requests = cfg.requests()
    out = Sampled()
    s = cfg.initial()
    walked = 0
    steps, preds = list(cs.specs), list(cs.predicates)
    for i in range(n):
        name = steps[i % len(steps)]
        spec, interp = cs.specs[name], abstract(d, s)
        args = _random_args(rng, cfg, requests, d, spec)
        for _ in range(20):
            if _safe_pre(cs.steps[name], interp, args):
                break
            args = _random_args(rng, cfg, requests, d, spec)
        enabled = _safe_pre(cs.steps[name], interp, args)
        out.mismatches += [f"{m} on {_show_state_short(s)}, args {args}"
                           for m in cross_check(d, s, spec, args, cs.steps[name])]
        out.steps[name] += 1
        out.enabled += enabled
        pname = preds[i % len(preds)]
        edits = list(perturbations(s, d, i)) if i % 2 else []
        label, ps = rng.choice(edits) if edits else ("as reached", s)
        out.mismatches += [f"{m} ({pname}, {label}) on {_show_state_short(ps)}"
                           for m in cross_check(d, ps, pred=CHECKED[pname],
                                                compiled_pred=cs.predicates[pname])]
        out.predicates[pname] += 1
        s, walked = _walk(rng, cfg, requests, s, walked)
    out.seconds = time.perf_counter() - start
    return out


def _safe_pre(step: Compiled, interp: Interp, args: tuple[Any, ...]) -> bool:
    try:
        return step.pre(interp, *args)
    except Undetermined:
        return False


def _walk(rng: random.Random, cfg: bmc.Bounds, requests: Sequence[bmc.Request], s: PoolState,
          walked: int) -> tuple[PoolState, int]:
    """One random accepted call from ``s`` (back to the initial state every few calls)."""
    if walked >= 4:
        return cfg.initial(), 0
    calls = list(bmc.calls(s, cfg, requests))
    for call in rng.sample(calls, min(len(calls), 64)):
        step = bmc.apply_call(ACTIONS, s, call)
        if step is not None and not step.refused:
            step.after.events = []
            return step.after, walked + 1
    return cfg.initial(), 0


def _show_state_short(s: PoolState) -> str:
    return (f"ref {list(s.ref)}, free {list(s.free)}, "
            f"hashed {[b for b, p in enumerate(s.primary) if p is not None]}")


__all__ = ["ABOUT_ENABLING", "ARGUMENT_REFUSALS", "BATCH_CONTRACTS", "CHECKED", "COMPARED_PROPERTIES",
           "STATE_REFUSALS", "Compiledset", "Disagreement", "Plan", "Report", "Sampled", "check",
           "compile_all", "differences", "domain_of", "event_entries", "perturbations", "plan",
           "queue_plan", "show_state", "unfaithful", "z3_sample"]
