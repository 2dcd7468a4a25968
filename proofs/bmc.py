"""Bounded model checking of the executable model (``kvpool bmc``).

The inductive proofs (:mod:`.inductive`) are about an abstraction of the
model; this module checks the model itself.  From a small concrete pool it
explores *every* sequence of actions up to a depth, breadth first, with the
arguments drawn from small finite domains (every block id including the null
block; one- and two-element lists for ``free_blocks`` and ``cache_full_blocks``,
one-element lists elsewhere; three requests with overlapping prefixes;
groups 0/1; block sizes ``hbs`` and ``2*hbs``; masks on two-block ranges;
two watchers).  States
are deduplicated on a canonical form (watchers by name; emitted events and
fired notifications are checked when emitted, then dropped from the state,
so the state space stays finite), by default up to renaming the non-null
blocks, the two groups and the two watchers (symmetry reduction,
:func:`orbit_key`; ``Config(symmetry=False)`` / ``--no-symmetry`` turns it
off).  After every step it checks

* every model invariant (:func:`kvpool.model.violated`);
* two event-log properties (with events on): a ``BlockRemoved`` names a (hash, group) that is
  announced and not yet removed or cleared, and afterwards the number of live
  announcements of each key (``BlockStored`` from ``cache_*`` minus
  ``BlockRemoved``, zeroed by ``AllBlocksCleared``) equals the number of its
  index entries.  Since that holds after every step, the live counts are a
  function of the index and need not be carried in the search state;
* every reuse notification a step delivers goes to the watcher registered on
  that block before the step;
* the free-queue order, i.e. the eviction order (:func:`order_violations`):
  ``get_new_blocks`` hands out the head of the queue; freed unhashed blocks
  join the head and freed cached blocks the tail, in the order their last
  reference is dropped (least recently freed, first evicted); ``unpin_blocks``
  appends; ``touch`` removes exactly the touched idle blocks; no action
  reorders the blocks that stay;
* refused calls change nothing: the model is pure, so a refusal leaves the
  state by construction; a variant that mutates before its check (as an
  in-place implementation would) attaches the state it left behind to the
  error as ``error.state``, and that must equal the state before the call.

Caller contracts are assumptions, so only contract-respecting calls are
explored: ``cache_full_blocks``/``cache_partial_block`` (without
``replace_existing_hashes``) write a request's prefix into a block only when
that prefix extends what the block holds or is a prefix of it (an unrelated
request writing into a block holding another prefix breaks
``index_entries_are_sound``, see ``tests/test_proofs.py``), and
``cache_full_blocks`` lists distinct blocks (vLLM's block tables do).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.model import ACTIONS, initial_state, violated
from kvpool.model import actions as A
from kvpool.model.events import Cleared, Removed, Stored
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import Content, content
from kvpool.model.state import NULL, Key, PoolState

Action = Callable[..., tuple[PoolState, Any]]
Call = tuple[str, tuple[Any, ...]]


def watcher_a(_block: int) -> None:
    """A reuse callback (watchers are compared by identity, shown by name)."""


def watcher_b(_block: int) -> None:
    """A second reuse callback."""


WATCHERS = (watcher_a, watcher_b)
TOKENS = {"r0": [1, 1, 1, 1], "r1": [1, 1, 2, 2], "r2": [2, 2, 2, 2]}
"""Three requests: r0 and r1 share their first two tokens, r2 shares nothing."""


@dataclass(frozen=True)
class Request:
    """A request as the model reads it, its hashes naming each prefix (no collisions)."""

    request_id: str
    all_token_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]
    lora_request: Any = None
    mm_features: tuple[Any, ...] = ()
    cache_salt: str | None = None
    session_id: str | None = None

    @classmethod
    def of(cls, request_id: str, tokens: Sequence[int], hash_block_size: int) -> Request:
        """Hash each whole chunk's prefix: equal hashes exactly for equal prefixes."""
        cut = len(tokens) - len(tokens) % hash_block_size
        hashes = tuple(hashlib.sha256(repr(tuple(tokens[:end])).encode()).digest()
                       for end in range(hash_block_size, cut + 1, hash_block_size))
        return cls(request_id, tuple(tokens), hashes)


@dataclass(frozen=True)
class Config:
    """The pool and argument domains explored."""

    blocks: int = 4
    hash_block_size: int = 1
    groups: tuple[int, ...] = (0, 1)
    events_on: bool = True
    """Whether the pool emits KV events (the event-log properties need them on)."""
    symmetry: bool = True
    """Identify states that differ only by a renaming of the non-null blocks."""

    def requests(self) -> list[Request]:
        return [Request.of(name, toks, self.hash_block_size) for name, toks in TOKENS.items()]

    def initial(self) -> PoolState:
        return initial_state(self.blocks, caching=True, hash_block_size=self.hash_block_size,
                             events_on=self.events_on)


# --------------------------------------------------------------------------
# Argument domains.


def _extends(held: Content, written: Content) -> bool:
    """The write contract: one prefix is a prefix of the other."""
    k = min(len(held), len(written))
    return held[:k] == written[:k]


_PREFIXES: dict[tuple[str, tuple[int, ...], int, int], Content] = {}


def _prefix(r: Request, num_tokens: int, hbs: int) -> Content:
    """The ghost content of a request prefix (memoised: the requests never change)."""
    k = (r.request_id, tuple(r.all_token_ids), num_tokens, hbs)
    if k not in _PREFIXES:
        _PREFIXES[k] = content(r, num_tokens, hbs)
    return _PREFIXES[k]


def calls(s: PoolState, cfg: Config, requests: Sequence[Request]) -> Iterator[Call]:
    """Every contract-respecting call from ``s`` over the small domains."""
    ids = range(s.num_blocks)
    hbs = s.hash_block_size
    ones = [[b] for b in ids]
    twos = [[a, b] for a in ids for b in ids]
    for n in range(1, s.num_blocks):
        yield "get_new_blocks", (n,)
    for lst in ones + twos:
        yield "free_blocks", (lst,)
    for lst in ones:
        yield "touch", (lst,)
        yield "evict_blocks", (lst,)
        for w in WATCHERS:
            yield "unpin_blocks", (lst, w)
    yield "reset_prefix_cache", ()
    yield "take_events", ()
    for src in ids:
        for dst in ids:
            yield "move_block_hashes", (src, dst)
    for r, bs, g in itertools.product(requests, (2 * hbs, hbs), cfg.groups):
        yield "emit_cached_block_events", (r, 1, bs, g)
        nmax = len(r.all_token_ids) // bs
        for b in ids if bs > hbs else ():  # a partial entry must end inside a block
            for nt in range(hbs, len(r.all_token_ids) + 1, hbs):
                if nt % bs == 0:
                    continue  # a boundary that is a block's end is cache_full's job
                content = _prefix(r, nt, hbs)
                for rep in (False, True):
                    if rep or _extends(s.holds[b], content):
                        yield "cache_partial_block", (r, b, nt, g, bs, rep)
        # (list, num_cached): the listed blocks before num_cached are not read,
        # so one filler (the null block) stands for all of them.
        ranges = [([b], 0) for b in ids] + [([NULL, b], 1) for b in ids]
        ranges += [([a, b], 0) for a in ids for b in ids if a != b]
        for lst, nc in ranges:
            nf = min(len(lst), nmax)
            if nc >= nf:
                continue
            masks: list[list[bool] | None] = [None]
            if nf - nc == 2:
                masks += [[True, False], [False, True]]
            for mask in masks:
                ok = all(
                    _extends(s.holds[b], _prefix(r, (nc + i + 1) * bs, hbs))
                    for i, b in enumerate(lst[nc:nf])
                    if b != NULL and (mask is None or mask[i]))
                if ok:
                    yield "cache_full_blocks", (r, lst, nc, nf, bs, g, mask)


# --------------------------------------------------------------------------
# Canonical states and the event properties.


def canonical(s: PoolState) -> tuple[Any, ...]:
    """A hashable form of the variables (events/fired excluded, watchers by name)."""
    return (
        s.ref, s.free, s.primary, s.secondary,
        tuple(sorted(s.index.items())),
        tuple(sorted((b, w.__name__) for b, w in s.watchers.items())),
        s.holds, tuple(sorted(s.names.items(), key=lambda kv: kv[0])),
    )


_CONTENT_IDS: dict[Content, int] = {}


def _content_id(c: Content) -> int:
    """A number per ghost content, so block signatures sort (contents may hold ``None``)."""
    return _CONTENT_IDS.setdefault(c, len(_CONTENT_IDS))


Renaming = tuple[dict[int, int], dict[str, str]]
"""A renaming of the KV-cache groups and of the watchers (by name)."""


def _renamings(cfg: Config) -> list[Renaming]:
    """Every renaming of the KV-cache groups and of the watchers the domains treat alike."""
    names = [w.__name__ for w in WATCHERS]
    gperms = [dict(zip(cfg.groups, p, strict=True)) for p in itertools.permutations(cfg.groups)]
    wperms = [dict(zip(names, p, strict=True)) for p in itertools.permutations(names)]
    return [(g, w) for g in gperms for w in wperms]


def orbit_key(s: PoolState, renamings: Sequence[Renaming] = ()) -> tuple[Any, ...]:
    """A canonical form of ``s`` up to renaming the non-null blocks (symmetry reduction).

    Each block gets a signature that mentions no block id: its places in the
    free queue, ref count, hashes, content, watcher, and its (key, position)
    in every index list.  The null block's signature comes first; the real
    blocks' signatures are sorted.  The state can be rebuilt from the key up
    to a renaming (the queue and each index list from the positions), and a
    renaming leaves every signature as it is, so two states share a key
    exactly when one is a renaming of the other.  With ``renamings`` (group
    and watcher renamings, see :func:`_renamings`) the key is the least over
    them, so states that differ by one of those too share a key.

    Why it is sound: the model, the argument domains (every id and pair of
    ids, both groups, both watchers) and every checked property treat the
    real blocks, the groups and the watchers alike (none compares or orders
    them), so a renamed state has the renamed successors and the same
    verdicts: exploring one state per key explores them all.  The free queue
    orders the blocks in it, so block renaming mostly merges states whose
    in-use blocks differ; group renaming halves the hashed states.
    """
    n = s.num_blocks
    places: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(s.free):
        if 0 <= b < n:
            places[b].append(i)
    fixed = [(tuple(places[b]), s.ref[b], _content_id(s.holds[b])) for b in range(n)]
    watched = {b: w.__name__ for b, w in s.watchers.items()}
    keyed = bool(s.names) or bool(s.index) or any(p is not None for p in s.primary)
    # Renaming what the state does not mention changes nothing: skip those.
    gmaps = {tuple(sorted(g.items())) for g, _ in renamings} if keyed else set()
    wmaps = {tuple(sorted(w.items())) for _, w in renamings} if watched else set()
    best: tuple[Any, ...] | None = None
    for gmap in gmaps or {()}:
        key = _key_renamer(gmap)
        entries: list[list[tuple[Key, int]]] = [[] for _ in range(n)]
        for k, blocks in s.index.items():
            kk = key(k)
            for i, b in enumerate(blocks):
                entries[b].append((kk, i))
        hashes = [((key(p.key), p.num_tokens) if (p := s.primary[b]) else (),
                   tuple(key(k) for k in s.secondary[b]), tuple(sorted(entries[b])))
                  for b in range(n)]
        names = tuple(sorted((key(k), c) for k, c in s.names.items()))
        for wmap in wmaps or {()}:
            wm = dict(wmap)
            sigs = [(*fixed[b], *hashes[b], wm.get(watched.get(b, ""), watched.get(b, "")))
                    for b in range(n)]
            out = (sigs[NULL], tuple(sorted(sigs[1:])), names, len(s.free))
            if best is None or out < best:
                best = out
    assert best is not None
    return best


@functools.cache
def _key_renamer(gmap: tuple[tuple[int, int], ...]) -> Callable[[Key], Key]:
    """Rename the group part of index keys (memoised per key)."""
    table = dict(gmap)
    if all(k == v for k, v in gmap):
        return lambda k: k

    @functools.cache
    def rename(k: Key) -> Key:
        return k[0], table.get(k[1], k[1])

    return rename


def event_violations(before: PoolState, after: PoolState, action: str) -> list[str]:
    """Check the events one step emitted against the index before and after it.

    With events off there is no log to check (``no_events_when_disabled`` is
    an invariant); the watcher property is checked either way.
    """
    if not before.events_on:
        stray = any(before.watchers.get(b) is not w for w, b in after.fired[len(before.fired):])
        return ["fired_watchers_were_registered"] if stray else []
    live: dict[Key, int] = {key: len(blocks) for key, blocks in before.index.items()}
    bad: list[str] = []
    for ev in after.events[len(before.events):]:
        if isinstance(ev, Cleared):
            live = {}
        elif isinstance(ev, Removed):
            k = (ev.hash, ev.group)
            if live.get(k, 0) <= 0:
                bad.append("event_removed_key_not_live")
            live[k] = live.get(k, 0) - 1
        elif isinstance(ev, Stored) and action != "emit_cached_block_events":
            for h in ev.hashes:
                live[(h, ev.group)] = live.get((h, ev.group), 0) + 1
    want = {key: len(blocks) for key, blocks in after.index.items()}
    if {k: v for k, v in live.items() if v} != want:
        bad.append("event_announcements_match_index")
    if any(before.watchers.get(b) is not w for w, b in after.fired[len(before.fired):]):
        bad.append("fired_watchers_were_registered")
    return sorted(set(bad))


def policy_queue(before: PoolState, action: str, args: Sequence[Any]) -> tuple[int, ...]:
    """The free queue the eviction policy prescribes after an accepted call.

    Stated from the call and the state before it, not from the action's code:

    * ``get_new_blocks(n)``: the queue minus its first ``n`` blocks;
    * ``free_blocks(ids)``: each real block whose last reference the call drops
      (listed as often as it is referenced) joins the queue, in the order of its
      last listing: unhashed ones at the head (reused first), hashed ones at the
      tail (evicted last: least recently freed, first evicted);
    * ``unpin_blocks(ids, w)``: the same blocks, all at the tail;
    * ``touch(ids)``: the queue minus the touched idle real blocks;
    * every other action leaves the queue as it is.
    """
    q = before.free
    if action == "get_new_blocks":
        return q[args[0]:]
    if action == "touch":
        gone = {b for b in args[0] if b != NULL and before.ref[b] == 0}
        return tuple(b for b in q if b not in gone)
    if action in ("free_blocks", "unpin_blocks"):
        ids = list(args[0])
        last = {b: i for i, b in enumerate(ids)}
        idle = [b for b in sorted(last, key=last.__getitem__)
                if b != NULL and ids.count(b) == before.ref[b]]
        if action == "unpin_blocks":
            return (*q, *idle)
        hashed = [b for b in idle if before.caching and before.primary[b] is not None]
        return (*(b for b in idle if b not in hashed), *q, *hashed)
    return q


def order_violations(before: PoolState, after: PoolState, action: str, args: Sequence[Any],
                     result: Any) -> list[str]:
    """Check the free-queue order (the eviction order) across one accepted call.

    * ``queue_keeps_relative_order``: blocks in the queue before and after the
      call are in the same relative order (no action reorders the queue);
    * ``allocation_takes_queue_head``: ``get_new_blocks(n)`` hands out the first
      ``n`` blocks of the queue, in queue order, and leaves the rest;
    * ``queue_follows_eviction_policy``: for every other action the queue is
      exactly :func:`policy_queue` (where freed blocks go, what a hit removes).
    """
    bad = []
    in_before, in_after = set(before.free), set(after.free)
    if [b for b in before.free if b in in_after] != [b for b in after.free if b in in_before]:
        bad.append("queue_keeps_relative_order")
    if action == "get_new_blocks":
        n = args[0]
        if list(result) != list(before.free[:n]) or after.free != before.free[n:]:
            bad.append("allocation_takes_queue_head")
    elif after.free != policy_queue(before, action, args):
        bad.append("queue_follows_eviction_policy")
    return bad


EVENT_PROPERTIES: tuple[str, ...] = (
    "event_removed_key_not_live", "event_announcements_match_index", "fired_watchers_were_registered")
"""Event-log properties (:func:`event_violations`), by the name a violation reports."""

ORDER_PROPERTIES: tuple[str, ...] = (
    "queue_keeps_relative_order", "allocation_takes_queue_head", "queue_follows_eviction_policy")
"""Free-queue order properties (:func:`order_violations`)."""

PROPERTIES: tuple[str, ...] = (*EVENT_PROPERTIES, *ORDER_PROPERTIES, "refused_call_changes_nothing")
"""Every per-step property the search checks besides the model invariants."""


# --------------------------------------------------------------------------
# The search.


@dataclass
class Step:
    """One transition on a trace: the call, the states around it, the result."""

    action: str
    args: tuple[Any, ...]
    before: PoolState
    after: PoolState
    result: Any = None
    error: str | None = None


@dataclass
class Outcome:
    """What a search found: depth fully explored, states seen, any violation."""

    depth: int
    states: int
    transitions: int
    seconds: float
    complete: bool
    violation: list[str] = field(default_factory=list)
    trace: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violation


def _apply(actions: Mapping[str, Action], s: PoolState, call: Call) -> Step | None:
    """Run one call; ``None`` for a clean refusal."""
    name, args = call
    try:
        nxt, result = actions[name](s, *args)
    except Refusal as e:
        left = getattr(e, "state", None)
        if left is None or (canonical(left) == canonical(s) and left.events == s.events):
            return None
        return Step(name, args, s, left, None, e.kind.name)
    return Step(name, args, s, nxt, result)


def _check(step: Step, state_too: bool = True) -> list[str]:
    """Every property of one step (the invariants only if the state is new)."""
    bad = violated(step.after) if state_too or step.error else []
    bad += event_violations(step.before, step.after, step.action)
    if step.error is not None:
        bad.append("refused_call_changes_nothing")
    else:
        bad += order_violations(step.before, step.after, step.action, step.args, step.result)
    return bad


def explore(
    cfg: Config = Config(), depth: int = 3, seconds: float = 20.0,
    actions: Mapping[str, Action] = ACTIONS, visit: Callable[[PoolState], None] | None = None,
) -> Outcome:
    """Breadth-first search of all call sequences up to ``depth`` within ``seconds``.

    ``visit`` (if given) is called on each state the search keeps, the
    initial one included: one per class with :attr:`Config.symmetry`.
    """
    start = time.perf_counter()
    requests = cfg.requests()
    s0 = cfg.initial()
    if cfg.symmetry:
        renamings = _renamings(cfg)
        memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}

        def key(s: PoolState) -> tuple[Any, ...]:
            # Most steps reach a state seen before: look it up by its exact
            # variables (dict order included) before canonicalising it.
            exact = (s.ref, s.free, s.primary, s.secondary, s.holds, tuple(s.index.items()),
                     tuple(s.watchers.items()), tuple(s.names.items()))
            if exact not in memo:
                memo[exact] = orbit_key(s, renamings)
            return memo[exact]
    else:
        key = canonical
    parent: dict[tuple[Any, ...], Step | None] = {key(s0): None}
    frontier = [s0]
    done, transitions = 0, 0
    if visit is not None:
        visit(s0)

    def trace_to(last: Step) -> list[Step]:
        out = [last]
        p = parent[key(last.before)]
        while p is not None:
            out.append(p)
            p = parent[key(p.before)]
        return out[::-1]

    for level in range(1, depth + 1):
        nxt: list[PoolState] = []
        for s in frontier:
            if time.perf_counter() - start > seconds:
                return Outcome(done, len(parent), transitions, time.perf_counter() - start, False)
            for call in calls(s, cfg, requests):
                step = _apply(actions, s, call)
                if step is None:
                    continue
                transitions += 1
                c = key(step.after)
                seen = c in parent  # then its invariants were checked already
                bad = _check(step, state_too=not seen)
                if bad:
                    return Outcome(level - 1, len(parent), transitions,
                                   time.perf_counter() - start, False, bad, trace_to(step))
                if not seen:
                    parent[c] = step  # its events are kept for the trace
                    nxt.append(replace(step.after, events=(), fired=()))
                    if visit is not None:
                        visit(nxt[-1])
        done, frontier = level, nxt
        if not frontier:
            break
    return Outcome(done, len(parent), transitions, time.perf_counter() - start, True)


# --------------------------------------------------------------------------
# Printing a trace for a reviewer.


def key_labels(cfg: Config) -> dict[Key, str]:
    """Name each key by the request prefix it stands for, e.g. ``r0[:2]/g1``."""
    out: dict[Key, str] = {}
    hbs = cfg.hash_block_size
    for r in cfg.requests():
        for i, h in enumerate(r.block_hashes):
            for g in cfg.groups:
                out.setdefault((h, g), f"{r.request_id}[:{(i + 1) * hbs}]/g{g}")
    return out


def show_arg(a: Any) -> str:
    if isinstance(a, Request):
        return a.request_id
    if callable(a):
        return getattr(a, "__name__", repr(a))
    return repr(a)


def _event(ev: Any, labels: Mapping[Key, str]) -> str:
    if isinstance(ev, Cleared):
        return "Cleared"
    hashes = ev.hashes if isinstance(ev, Stored) else (ev.hash,)
    names = [labels.get((h, ev.group), h.hex()[:8]) for h in hashes]
    return f"{type(ev).__name__}({', '.join(names)})"


def describe(step: Step, labels: Mapping[Key, str]) -> list[str]:
    """What a step changed, field by field."""
    a, b = step.before, step.after

    def lab(k: Key) -> str:
        return labels.get(k, f"{k[0].hex()[:8]}/g{k[1]}")

    def keys(s: PoolState, i: int) -> str:
        p = s.primary[i]
        prim = f"{lab(p.key)}@{p.num_tokens}" if p else "-"
        return prim + "".join(f" +{lab(k)}" for k in s.secondary[i])

    out: list[str] = []
    refs = [f"{i}: {x}->{y}" for i, (x, y) in enumerate(zip(a.ref, b.ref, strict=True)) if x != y]
    if refs:
        out.append("ref " + ", ".join(refs))
    if a.free != b.free:
        out.append(f"free queue {list(a.free)} -> {list(b.free)}")
    for i in range(a.num_blocks):
        if a.primary[i] != b.primary[i] or a.secondary[i] != b.secondary[i]:
            out.append(f"block {i} hashes {keys(a, i)} -> {keys(b, i)}")
        if a.holds[i] != b.holds[i]:
            out.append(f"block {i} holds {len(a.holds[i])} -> {len(b.holds[i])} chunks")
    ia, ib = dict(a.index), dict(b.index)
    for k in sorted(set(ia) | set(ib)):
        if ia.get(k) != ib.get(k):
            out.append(f"index {lab(k)}: {list(ia.get(k, ()))} -> {list(ib.get(k, ()))}")
    if dict(a.watchers) != dict(b.watchers):
        wa = {k: show_arg(v) for k, v in a.watchers.items()}
        wb = {k: show_arg(v) for k, v in b.watchers.items()}
        out.append(f"watchers {wa} -> {wb}")
    evs = [_event(e, labels) for e in b.events[len(a.events):]]
    if evs:
        out.append("events " + "; ".join(evs))
    fired = [f"{show_arg(w)}({blk})" for w, blk in b.fired[len(a.fired):]]
    if fired:
        out.append("fired " + ", ".join(fired))
    return out or ["(no change)"]


def _params(action: str) -> list[str]:
    """The argument names of a model action (after the state)."""
    return list(inspect.signature(ACTIONS[action]).parameters)[1:]


def format_trace(out: Outcome, cfg: Config = Config()) -> str:
    """The violating trace, one numbered call per step with its changes."""
    labels = key_labels(cfg)
    lines = [f"VIOLATION of {', '.join(out.violation)} after {len(out.trace)} step(s):"]
    for n, st in enumerate(out.trace, 1):
        args = ", ".join(f"{k}={show_arg(x)}" for k, x in zip(_params(st.action), st.args, strict=False))
        tail = f"  -> raised {st.error}" if st.error else (
            f"  -> {st.result!r}" if st.result is not None and not isinstance(st.result, bytes) else "")
        lines.append(f"{n}. {st.action}({args}){tail}")
        lines += [f"     {d}" for d in describe(st, labels)]
    if out.trace:
        lines.append(f"   invariants broken in the last state: {violated(out.trace[-1].after) or 'none'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Seeded bugs: broken variants of model actions, found by the search.


@contextlib.contextmanager
def _patched(**names: Any) -> Iterator[None]:
    """Temporarily replace helpers inside :mod:`kvpool.model.actions`."""
    old = {k: getattr(A, k) for k in names}
    for k, v in names.items():
        setattr(A, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(A, k, v)


def _drop_fields_only(s: PoolState, n: Any, b: int) -> None:
    """Forget the block's hash fields but leave its index entries behind."""
    n.primary[b] = None
    n.secondary[b] = ()


def _check_once_per_block(s: PoolState, ids: Sequence[int], what: str) -> None:
    """vLLM-style check of each distinct block, blind to repeats in one call."""
    A._check_ids(s, ids)
    for b in set(ids):
        if b != NULL and s.ref[b] < 1:
            raise Refusal(RefusalKind.NOT_IN_USE, f"{what} block {b}")


def free_without_refcount_check(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Release with no ref-count check: a double free drives the count to -1."""
    with _patched(_check_releasable=lambda s, ids, what: A._check_ids(s, ids)):
        return A.free_blocks(s, ids)


def free_same_block_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """``free_blocks([b, b])`` on a block with one reference is accepted."""
    with _patched(_check_releasable=_check_once_per_block):
        return A.free_blocks(s, ids)


def evict_forgets_index(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction resets the block's hash fields but not the index."""
    with _patched(_drop_hashes=_drop_fields_only):
        return A.evict_blocks(s, ids)


def evict_without_events(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction that tells no event consumer: their view of the cache goes stale."""
    nxt, res = A.evict_blocks(replace(s, events_on=False), ids)
    return replace(nxt, events_on=s.events_on), res


def touch_leaves_block_free(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A prefix hit takes a reference but leaves the idle block in the free queue."""
    A._check_ids(s, ids)
    ref = list(s.ref)
    for b in ids:
        ref[b] += 1
    return replace(s, ref=tuple(ref)), None


def free_null_into_queue(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """The null block reaching count 0 joins the free queue, to be handed out later."""
    nxt, res = A.free_blocks(s, ids)
    if NULL in ids and nxt.ref[NULL] == 0 and NULL not in nxt.free:
        nxt = replace(nxt, free=(*nxt.free, NULL))
    return nxt, res


def partial_kept_after_promotion(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """Promoting a partial entry to a full hash leaves the partial entry indexed."""
    with _patched(_drop_hashes=_drop_fields_only):
        return A.cache_full_blocks(s, *args)


def cache_full_hashes_null(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks without the null-block skip: the placeholder gets hashed."""
    with _patched(NULL=-1):
        return A.cache_full_blocks(s, *args)


def reset_while_in_use(s: PoolState) -> tuple[PoolState, Any]:
    """Reset without the in-use guard, rebuilding the free queue as at start."""
    nxt, _ = A.reset_prefix_cache(replace(s, free=tuple(range(1, s.num_blocks))))
    return replace(nxt, ref=s.ref), True


def counter_before_check(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """get_new_blocks pops blocks one by one and only then finds the queue too short."""
    if num_blocks <= len(s.free):
        return A.get_new_blocks(s, num_blocks)
    left, _ = A.get_new_blocks(s, len(s.free))
    err = Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS,
                  f"Cannot get {num_blocks} free blocks from the pool")
    err.state = left  # type: ignore[attr-defined]
    raise err


def _free_listing(s: PoolState, ids: Sequence[int]) -> list[int]:
    """Check a free_blocks call as the model does; the counts after dropping every listing."""
    A._check_releasable(s, ids, "free")
    ref = list(s.ref)
    for b in ids:
        if b != NULL or s.null_counted:
            ref[b] -= 1
    return ref


def free_appends_listing_twice(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """vLLM's own shape of free_blocks: drop every listing, then queue each listing at 0.

    A block listed twice in one call (a request whose block table holds it
    twice, ref count 2) is queued twice: the free count, and with it usage,
    is wrong (usage below 0 once the queue outgrows the pool), and the block
    can be handed to two requests.
    """
    ref = _free_listing(s, ids)
    idle = [b for b in ids if b != NULL and ref[b] == 0]
    hashed = [b for b in idle if s.caching and s.primary[b] is not None]
    first = [b for b in idle if b not in hashed]
    return replace(s, ref=tuple(ref), free=(*first, *s.free, *hashed)), None


def free_pushes_head_one_by_one(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed unhashed blocks pushed onto the head one at a time (``appendleft`` in a loop).

    A batch lands reversed: the engine frees a block table in reverse so that
    its tail blocks are reused first, and the pool silently undoes that.
    """
    ref = _free_listing(s, ids)
    free = list(s.free)
    seen = list(s.ref)
    for b in ids:
        if b == NULL:
            continue
        seen[b] -= 1
        if seen[b] == 0:
            if s.caching and s.primary[b] is not None:
                free.append(b)
            else:
                free.insert(0, b)
    return replace(s, ref=tuple(ref), free=tuple(free)), None


def free_hashed_to_head(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Freed cached blocks go to the head like unhashed ones: the freshest prefix is evicted first."""
    ref = _free_listing(s, ids)
    last = {b: i for i, b in enumerate(ids)}
    idle = [b for b in sorted(last, key=last.__getitem__) if b != NULL and ref[b] == 0]
    return replace(s, ref=tuple(ref), free=(*idle, *s.free)), None


def touch_swap_remove(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """A hit block leaves an array-backed free list by swap-with-last (O(1) removal).

    The former tail block jumps into the hole: the eviction order is lost.
    """
    A._check_ids(s, ids)
    free, ref = list(s.free), list(s.ref)
    for b in ids:
        if b == NULL and not s.null_counted:
            continue
        if ref[b] == 0 and b != NULL:
            i = free.index(b)
            free[i] = free[-1]
            free.pop()
        ref[b] += 1
    return replace(s, ref=tuple(ref), free=tuple(free)), None


def alloc_pops_tail(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The free list used as a stack: allocation takes the most recently freed blocks.

    The hottest cached prefixes (freed last, at the tail) are evicted first
    instead of the least recently used ones at the head.
    """
    nxt, taken = A.get_new_blocks(replace(s, free=s.free[::-1]), num_blocks)
    return replace(nxt, free=nxt.free[::-1]), taken


def reuse_notice_names_position(s: PoolState, num_blocks: int) -> tuple[PoolState, Any]:
    """The reuse callback gets the block's index in the allocated batch, not its id.

    An ``enumerate()`` mix-up: the engine is told that the wrong block was
    reused and keeps reading the overwritten one.
    """
    nxt, taken = A.get_new_blocks(s, num_blocks)
    notices = tuple((w, taken.index(b)) for w, b in nxt.fired[len(s.fired):])
    return replace(nxt, fired=(*s.fired, *notices)), taken


def removed_event_drops_group(s: PoolState, ids: Sequence[int]) -> tuple[PoolState, Any]:
    """Eviction's BlockRemoved leaves out the KV-cache group (``group_idx=None``, read as 0).

    A router keeping one view per group (full attention, sliding window)
    removes the entry from group 0 and keeps serving the evicted one.
    """
    nxt, res = A.evict_blocks(s, ids)
    new = tuple(replace(ev, group=0) if isinstance(ev, Removed) else ev
                for ev in nxt.events[len(s.events):])
    return replace(nxt, events=(*s.events, *new)), res


def stored_event_when_disabled(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
    """cache_full_blocks emits BlockStored without checking that events are enabled.

    Nobody takes events from such a pool, so the queue grows with every
    cached block for the life of the engine.  Needs ``Config(events_on=False)``
    (see :data:`BUG_CONFIG`).
    """
    nxt, res = A.cache_full_blocks(replace(s, events_on=True), *args)
    return replace(nxt, events_on=s.events_on), res


BUGS: dict[str, tuple[str, Action]] = {
    "free_without_refcount_check": ("free_blocks", free_without_refcount_check),
    "free_same_block_twice": ("free_blocks", free_same_block_twice),
    "evict_forgets_index": ("evict_blocks", evict_forgets_index),
    "evict_without_events": ("evict_blocks", evict_without_events),
    "touch_leaves_block_free": ("touch", touch_leaves_block_free),
    "free_null_into_queue": ("free_blocks", free_null_into_queue),
    "partial_kept_after_promotion": ("cache_full_blocks", partial_kept_after_promotion),
    "cache_full_hashes_null": ("cache_full_blocks", cache_full_hashes_null),
    "reset_while_in_use": ("reset_prefix_cache", reset_while_in_use),
    "counter_before_check": ("get_new_blocks", counter_before_check),
    "free_appends_listing_twice": ("free_blocks", free_appends_listing_twice),
    "free_pushes_head_one_by_one": ("free_blocks", free_pushes_head_one_by_one),
    "free_hashed_to_head": ("free_blocks", free_hashed_to_head),
    "touch_swap_remove": ("touch", touch_swap_remove),
    "alloc_pops_tail": ("get_new_blocks", alloc_pops_tail),
    "reuse_notice_names_position": ("get_new_blocks", reuse_notice_names_position),
    "removed_event_drops_group": ("evict_blocks", removed_event_drops_group),
    "stored_event_when_disabled": ("cache_full_blocks", stored_event_when_disabled),
}
"""Seeded bugs for the BMC: (the action replaced, the broken variant)."""

BUG_CONFIG: dict[str, dict[str, Any]] = {
    "stored_event_when_disabled": {"events_on": False},
    "removed_event_drops_group": {"symmetry": False},
}
"""Bugs to explore in a configuration other than :class:`Config`'s default.

``stored_event_when_disabled`` only shows in a pool with events off.
``removed_event_drops_group`` treats group 0 unlike group 1, so it breaks the
group symmetry the reduction relies on (:func:`orbit_key`): with the reduction
the search explores only the group-0 half of each pair, where the bug is
harmless, and finds it one call later (depth 3, 12 s instead of depth 2).
Explore them with :func:`bug_config` (``kvpool bmc --bug`` does)."""


def bug_config(bug: str, cfg: Config | None = None) -> Config:
    """The configuration in which to look for ``bug``: ``cfg`` with the bug's overrides."""
    return replace(cfg or Config(), **BUG_CONFIG.get(bug, {}))


def find_bug(bug: str, cfg: Config | None = None, depth: int = 6, seconds: float = 60.0) -> Outcome:
    """Explore with ``bug`` seeded, in :func:`bug_config`; cached (tests share the searches)."""
    return _find_bug(bug, bug_config(bug, cfg), depth, seconds)


@functools.cache
def _find_bug(bug: str, cfg: Config, depth: int, seconds: float) -> Outcome:
    return explore(cfg, depth, seconds, with_bug(bug))


def with_bug(bug: str) -> dict[str, Action]:
    """A copy of ``ACTIONS`` with one action replaced by its broken variant."""
    name, fn = BUGS[bug]
    return {**ACTIONS, name: fn}
