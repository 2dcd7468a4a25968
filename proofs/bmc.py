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
so the state space stays finite).  After every step it checks

* every model invariant (:func:`kvpool.model.violated`);
* two event-log properties: a ``BlockRemoved`` names a (hash, group) that is
  announced and not yet removed or cleared, and afterwards the number of live
  announcements of each key (``BlockStored`` from ``cache_*`` minus
  ``BlockRemoved``, zeroed by ``AllBlocksCleared``) equals the number of its
  index entries.  Since that holds after every step, the live counts are a
  function of the index and need not be carried in the search state;
* every reuse notification a step delivers goes to the watcher registered on
  that block before the step;
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

import argparse
import contextlib
import functools
import inspect
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.impl.errors import BlockNotInUseError, BlockPoolError, NotEnoughFreeBlocksError
from kvpool.impl.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.keys import get_block_hash, get_group_id, maybe_convert_block_hash
from kvpool.impl.request import Request
from kvpool.model import ACTIONS, initial_state, violated
from kvpool.model import actions as A
from kvpool.model.state import NULL, Content, Key, PoolState

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
class Config:
    """The pool and argument domains explored."""

    blocks: int = 4
    hash_block_size: int = 1
    groups: tuple[int, ...] = (0, 1)

    def requests(self) -> list[Request]:
        hasher = get_request_block_hasher(self.hash_block_size)
        return [Request(name, toks, block_hasher=hasher) for name, toks in TOKENS.items()]

    def initial(self) -> PoolState:
        return initial_state(self.blocks, caching=True, hash_block_size=self.hash_block_size,
                             events_on=True)


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
        _PREFIXES[k] = A._content(r, num_tokens, hbs)
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


@functools.cache
def _ext(key: Key) -> tuple[Any, int]:
    return maybe_convert_block_hash(get_block_hash(key)), get_group_id(key)


def event_violations(before: PoolState, after: PoolState, action: str) -> list[str]:
    """Check the events one step emitted against the index before and after it."""
    live: dict[tuple[Any, int], int] = {}
    for key, blocks in before.index.items():
        live[_ext(key)] = len(blocks)
    bad: list[str] = []
    for ev in after.events[len(before.events):]:
        if isinstance(ev, AllBlocksCleared):
            live = {}
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                k = (h, ev.group_idx or 0)
                if live.get(k, 0) <= 0:
                    bad.append("event_removed_key_not_live")
                live[k] = live.get(k, 0) - 1
        elif isinstance(ev, BlockStored) and action != "emit_cached_block_events":
            for h in ev.block_hashes:
                k = (h, ev.group_idx or 0)
                live[k] = live.get(k, 0) + 1
    want = {_ext(key): len(blocks) for key, blocks in after.index.items()}
    if {k: v for k, v in live.items() if v} != want:
        bad.append("event_announcements_match_index")
    if any(before.watchers.get(b) is not w for w, b in after.fired[len(before.fired):]):
        bad.append("fired_watchers_were_registered")
    return sorted(set(bad))


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
    except BlockPoolError as e:
        left = getattr(e, "state", None)
        if left is None or (canonical(left) == canonical(s) and left.events == s.events):
            return None
        return Step(name, args, s, left, None, type(e).__name__)
    return Step(name, args, s, nxt, result)


def _check(step: Step, state_too: bool = True) -> list[str]:
    """Every property of one step (the invariants only if the state is new)."""
    bad = violated(step.after) if state_too or step.error else []
    bad += event_violations(step.before, step.after, step.action)
    if step.error is not None:
        bad.append("refused_call_changes_nothing")
    return bad


def explore(
    cfg: Config = Config(), depth: int = 3, seconds: float = 20.0,
    actions: Mapping[str, Action] = ACTIONS,
) -> Outcome:
    """Breadth-first search of all call sequences up to ``depth`` within ``seconds``."""
    start = time.perf_counter()
    requests = cfg.requests()
    s0 = cfg.initial()
    parent: dict[tuple[Any, ...], Step | None] = {canonical(s0): None}
    frontier = [s0]
    done, transitions = 0, 0

    def trace_to(last: Step) -> list[Step]:
        out = [last]
        p = parent[canonical(last.before)]
        while p is not None:
            out.append(p)
            p = parent[canonical(p.before)]
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
                c = canonical(step.after)
                seen = c in parent  # then its invariants were checked already
                bad = _check(step, state_too=not seen)
                if bad:
                    return Outcome(level - 1, len(parent), transitions,
                                   time.perf_counter() - start, False, bad, trace_to(step))
                if not seen:
                    parent[c] = step  # its events are kept for the trace
                    nxt.append(replace(step.after, events=(), fired=()))
        done, frontier = level, nxt
        if not frontier:
            break
    return Outcome(done, len(parent), transitions, time.perf_counter() - start, True)


# --------------------------------------------------------------------------
# Printing a trace for a reviewer.


def _labels(cfg: Config) -> dict[Key, str]:
    """Name each key by the request prefix it stands for, e.g. ``r0[:2]/g1``."""
    from kvpool.impl.keys import make_block_hash_with_group_id

    out: dict[Key, str] = {}
    hbs = cfg.hash_block_size
    for r in cfg.requests():
        for i, h in enumerate(r.block_hashes):
            for g in cfg.groups:
                out.setdefault(make_block_hash_with_group_id(h, g), f"{r.request_id}[:{(i + 1) * hbs}]/g{g}")
    return out


def _ext_labels(labels: Mapping[Key, str]) -> dict[tuple[Any, int], str]:
    return {_ext(k): v for k, v in labels.items()}


def show_arg(a: Any) -> str:
    if isinstance(a, Request):
        return a.request_id
    if callable(a):
        return getattr(a, "__name__", repr(a))
    return repr(a)


def _event(ev: Any, ext: Mapping[tuple[Any, int], str]) -> str:
    if isinstance(ev, AllBlocksCleared):
        return "AllBlocksCleared"
    names = [ext.get((h, ev.group_idx or 0), str(h)[:8]) for h in ev.block_hashes]
    return f"{type(ev).__name__}({', '.join(names)})"


def describe(step: Step, labels: Mapping[Key, str]) -> list[str]:
    """What a step changed, field by field."""
    a, b = step.before, step.after

    def lab(k: Key) -> str:
        return labels.get(k, k.hex()[:8])

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
    ext = _ext_labels(labels)
    evs = [_event(e, ext) for e in b.events[len(a.events):]]
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
    labels = _labels(cfg)
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
            raise BlockNotInUseError(f"{what} block {b}")


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
    err = NotEnoughFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
    err.state = left  # type: ignore[attr-defined]
    raise err


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
}
"""Seeded bugs for the BMC: (the action replaced, the broken variant)."""


def with_bug(bug: str) -> dict[str, Action]:
    """A copy of ``ACTIONS`` with one action replaced by its broken variant."""
    name, fn = BUGS[bug]
    return {**ACTIONS, name: fn}


# --------------------------------------------------------------------------


def _as_json(out: Outcome, cfg: Config) -> dict[str, Any]:
    return {
        "depth": out.depth, "states": out.states, "transitions": out.transitions,
        "seconds": round(out.seconds, 3), "complete": out.complete, "ok": out.ok,
        "violation": out.violation,
        "trace": [{"action": st.action, "args": [show_arg(a) for a in st.args],
                   "changes": describe(st, _labels(cfg))} for st in out.trace],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Explore; print depth and states, or the violating trace (exit 1)."""
    p = argparse.ArgumentParser(prog="kvpool bmc", description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, default=3, help="maximum number of calls")
    p.add_argument("--seconds", type=float, default=20.0, help="time budget")
    p.add_argument("--blocks", type=int, default=4, help="pool size, null block included")
    p.add_argument("--hash-block-size", type=int, default=1, choices=(1, 2))
    p.add_argument("--bug", choices=sorted(BUGS), help="explore with a seeded bug")
    p.add_argument("--json", metavar="FILE", help="also write the outcome as JSON")
    args = p.parse_args(argv)
    cfg = Config(blocks=args.blocks, hash_block_size=args.hash_block_size)
    acts = with_bug(args.bug) if args.bug else ACTIONS
    out = explore(cfg, args.depth, args.seconds, acts)
    if out.violation:
        print(format_trace(out, cfg))
    print(f"bmc: {cfg.blocks} blocks, hbs {cfg.hash_block_size}: depth {out.depth} fully explored"
          f"{'' if out.complete else ' (budget or violation stopped the next level)'}, "
          f"{out.states} states, {out.transitions} transitions, {out.seconds:.2f}s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_as_json(out, cfg), fh, indent=2)
    return 1 if out.violation else 0


if __name__ == "__main__":
    sys.exit(main())
