"""Calls: the model's action against its decomposition into z3 steps (enabled exactly when the
model accepts; the model's next state and events on every field)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpool.model import OPERATIONS, ContractBroken, Refusal
from kvpool.model.events import Event, Removed, Stored
from kvpool.model.state import Key, PoolState

from .. import bmc
from ..evaluate.interp import Carriers, Interp, abstract, names_of
from ..symbolic import Block
from ..transitions import STEPS
from .properties import Plan, check_properties, check_queue
from .report import Disagreement, Run
from .scope import ARGUMENT_REFUSALS, BATCH_CONTRACTS, concrete_args
from .show import described, short, show_content, show_pairs, show_step


def _keys_of(s: PoolState, b: int) -> list[Key]:
    p = s.primary[b]
    return ([p.key] if p else []) + list(s.secondary[b])


def plan(s: PoolState, name: str, args: Sequence[Any], result: Any) -> Plan:
    """The per-block decomposition of one call, as its declaration states it (``result``: the
    model's, ``None`` when it refused)."""
    op = OPERATIONS[name]
    return op.split(s, result, *op.bind(args))


_BLOCK_ARG = {name: next((i for i, (a, sort) in enumerate(spec.args) if a == "b" and sort.eq(Block)), None)
              for name, spec in STEPS.items()}
"""Per step, where its block argument ``b`` is (the block whose entries its events name)."""


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
    blocks = [None if (at := _BLOCK_ARG.get(st)) is None else int(a[at]) for st, a in p.steps]
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
                lost.append(f"Removed({short(k)})")
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
                    lost.append(f"Stored({short(k)})")
                    continue
                stored[s_at].add((kid[k], blocks[s_at]))  # type: ignore[arg-type]
    if call == "_insert_block_hash" and p.steps:
        stored[0] |= {(kid[k], b) for k, b in after.announced - before.announced}
    return removed, stored, lost


Outcome = tuple[bool, int, Interp, list[frozenset[tuple[int, int]]], list[frozenset[tuple[int, int]]]]
"""(every step enabled, steps enabled, state after them, removed per step, stored per step)."""


def _run_steps(run: Run, memo: dict[tuple[Any, ...], Outcome], start: Interp,
               steps: tuple[tuple[str, tuple[Any, ...]], ...]) -> Outcome:
    """The z3 steps in sequence from ``start`` (memoised per state: calls share prefixes)."""
    if steps in memo:
        return memo[steps]
    out: Outcome = _run_steps(run, memo, start, steps[:-1]) if steps else (True, 0, start, [], [])
    ok, done, cur, rem, sto = out
    if steps and ok:
        name, args = steps[-1]
        step = run.compiled.steps[name]
        cargs = concrete_args(run.compiled.converters[name], args)
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
    if (after.secondary != before.secondary or after.index != before.index
            or after.announced != before.announced):
        return abstract(d, after)
    kid, cid = d.key_id, d.content_id
    n = after.num_blocks
    if after.free == before.free:
        free = base.free
    else:
        queued = set(after.free)
        free = tuple(b in queued for b in range(n))
    if after.primary == before.primary:
        prim, pkey, ptok = base.prim, base.pkey, base.ptok
    else:
        prim = tuple(p is not None for p in after.primary)
        pkey = tuple(None if p is None else kid[p.key] for p in after.primary)
        ptok = tuple(None if p is None else p.num_tokens for p in after.primary)
    names = base.names if after.names == before.names else names_of(d, after)
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
                    f"{short(d.keys[i])}: z3 {show_content(d, zv[i])}, model {show_content(d, mv[i])}"
                    for i in bad))
            continue
        if isinstance(zv, frozenset):
            out.append(f"{f}: z3 also has {show_pairs(d, f, zv - mv)}, "
                       f"model also has {show_pairs(d, f, mv - zv)}")
        else:
            out.append(f"{f}: z3 {zv}, model {mv}")
    return out


def check_call(run: Run, s: PoolState, interp: Interp, memo: dict[tuple[Any, ...], Outcome],
                call: bmc.Call) -> PoolState | None:
    """Run one call on the model and through the z3 steps; the model's next state if it accepted."""
    name, args = call
    rep = run.report
    rep.calls += 1
    op = OPERATIONS[name]
    nxt = s.copy()
    result: Any = None
    skip = ""
    try:
        result = op.run(nxt, op.bind(args))
        verdict = "accepted"
    except ContractBroken as broken:
        verdict = f"caller broke {broken.contract}"
        if broken.contract in BATCH_CONTRACTS:
            skip = f"contract {broken.contract} (on the whole batch)"
    except Refusal as refusal:
        verdict = f"refused {refusal.kind.name}"
        if refusal.kind in ARGUMENT_REFUSALS:
            skip = f"{verdict} (argument shape)"
    if skip:
        rep.skipped[skip] += 1
        return None
    accepted = verdict == "accepted"
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
                rep.add(Disagreement(case, s, described(call, verdict),
                                     f"z3 still enables {p.exhaust} of block(s) {free} after "
                                     f"{done} {p.exhaust} step(s)"))
        elif ok:
            rep.add(Disagreement(case, s, described(call, verdict), "z3 enables every step: "
                                 + " ; ".join(show_step(st, a) for st, a in p.steps)))
        return None
    if not ok:
        st, a = p.steps[done]
        rep.add(Disagreement(case, s, described(call, verdict), f"z3 precondition of step {done + 1} "
                             f"({show_step(st, a)}) is false"))
        return nxt
    d = run.compiled.domain
    want = _next_interp(d, s, interp, nxt)
    diff = [] if after == want else differences(after, want, d)
    m_removed, m_stored, lost = event_entries(name, p, s, nxt, nxt.out.events, d.key_id)
    for i, (st, a) in enumerate(p.steps if s.events_on else ()):  # read only under events
        for label, z, m in (("removed", removed[i], m_removed[i]), ("stored", stored[i], m_stored[i])):
            if z != m:
                diff.append(f"step {i + 1} ({show_step(st, a)}) {label}: z3 {show_pairs(d, label, z)}, "
                            f"model's events {show_pairs(d, label, frozenset(m))}")
    if lost:
        diff.append(f"model events naming no entry of the blocks processed: {', '.join(lost)}")
    if diff:
        rep.add(Disagreement(case, s, described(call, verdict), "; ".join(diff)))
        return nxt
    queue = check_queue(run, s, nxt, call, p)
    runs = [(st, memo[p.steps[:i]][2], memo[p.steps[:i + 1]][2],
             concrete_args(run.compiled.converters[st], a), removed[i], stored[i])
            for i, (st, a) in enumerate(p.steps)]
    check_properties(run, s, nxt, result, call, runs, queue)
    return nxt
