"""States: the model's invariants and lemmas against the compiled z3 ones, on reached states and on
perturbations of them (states near a reached one where the model's predicates fail)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TypeVar

from kvpool.model.request import Content
from kvpool.model.state import NULL, PoolState, Primary, Queue

from .. import bmc
from ..evaluate.interp import Carriers, Interp
from ..evaluate.runtime import Undetermined
from .report import Disagreement, Run
from .scope import MODEL_PREDICATES
from .show import show_bool

T = TypeVar("T")

def unfaithful(s: PoolState) -> list[str]:
    """Why the encoding cannot represent ``s`` exactly (empty: it can).

    Each reason is a conjunct some model invariant states and the encoding
    drops (:data:`kvpool.proofs.invariants.PARTIAL`): sets and relations
    have no order, no duplicates, no empty lists; ``names`` is total; block
    ids are the sort's elements.
    """
    reasons = ((not all(s.index.values()), "an index key maps to an empty list"),
               (any(len(set(bs)) != len(bs) for bs in s.index.values()), "an index entry is repeated"),
               (any(len(set(ks)) != len(ks) for ks in s.secondary), "a secondary key is repeated"),
               (any(k not in s.names for k in s.index), "an index key names no prefix"),
               (any(not 0 <= b < s.num_blocks for b in s.watchers), "a watcher sits on no block of the pool"))
    return [why for lost, why in reasons if lost]


def check_state(run: Run, s: PoolState, interp: Interp, what: str) -> None:
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
        if lost:  # the encoding forgets what makes s unfaithful: it can only be weaker
            if want and got is not True:
                rep.add(Disagreement(
                    f"invariant/{name}", s, what,
                    f"{name}: the model holds it on a state the encoding cannot represent "
                    f"({'; '.join(lost)}), but z3's form is {show_bool(got)} there"))
            continue
        counts = rep.invariants.setdefault(name, [0, 0])
        counts[0 if want else 1] += 1
        if got is not want:
            rep.add(Disagreement(f"invariant/{name}", s, what,
                                 f"{name}: model {want}, z3 {show_bool(got)}"))


# --------------------------------------------------------------------------
# Perturbations: states near a reached one where the model's predicates fail.


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

    def other(c: Content, by: int = 1 + turn) -> Content:
        """The content ``by`` places after ``c`` in the domain's order."""
        return contents[(contents.index(c) + by) % len(contents)]

    if entries:
        kk, bb = entries[turn % len(entries)]
        kept = tuple(x for x in s.index[kk] if x != bb)
        yield "an index entry dropped", replace(
            s, index={**s.index, kk: kept} if kept else {x: v for x, v in s.index.items() if x != kk})
        yield "an index entry repeated", replace(s, index={**s.index, kk: (*s.index[kk], bb)})
        yield "an index key with an empty list", replace(s, index={**s.index, kk: ()})
        yield "an announcement dropped", replace(s, announced=s.announced - {(kk, bb)})
        if kk in s.names:
            yield "an indexed key's name forgotten", replace(
                s, names={x: c for x, c in s.names.items() if x != kk})
            yield "an indexed key names another prefix", replace(s, names={**s.names, kk: other(s.names[kk])})
            yield "an indexed block holds another prefix", replace(
                s, holds=_set(s.holds, bb, other(s.holds[bb])))
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
    yield f"block {b} holds another prefix", replace(s, holds=_set(s.holds, b, other(s.holds[b])))
    if named:
        kk = named[turn % len(named)]
        yield "a key names another prefix", replace(s, names={**s.names, kk: other(s.names[kk], 1)})
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
        yield f"unhashed block {x} gains a primary key the index lacks", replace(
            s, primary=_set(s.primary, x, Primary(k, hbs)),
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
