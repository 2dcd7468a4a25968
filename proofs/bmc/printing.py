"""A violating trace as a reviewer reads it: each call and what it changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.model import OPERATIONS, violated
from kvpool.model.events import Cleared, Stored
from kvpool.model.properties import Transition
from kvpool.model.state import Key, PoolState

from .domains import DEFAULT, Bounds, Request
from .search import Outcome


def key_labels(cfg: Bounds) -> dict[Key, str]:
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


def describe(step: Transition, labels: Mapping[Key, str]) -> list[str]:
    """What a step changed, field by field."""
    a, b = step.before, step.after

    def lab(k: Key) -> str:
        return labels.get(k, f"{k[0].hex()[:8]}/g{k[1]}")

    def keys(s: PoolState, i: int) -> str:
        p = s.primary[i]
        prim = f"{lab(p.key)}@{p.num_tokens}" if p else "-"
        return prim + "".join(f" +{lab(k)}" for k in s.secondary[i])

    out: list[str] = []
    if refs := [f"{i}: {x}->{y}" for i, (x, y) in enumerate(zip(a.ref, b.ref, strict=True)) if x != y]:
        out.append("ref " + ", ".join(refs))
    if tuple(a.free) != tuple(b.free):
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
    if evs := [_event(e, labels) for e in step.out.events]:
        out.append("events " + "; ".join(evs))
    if fired := [f"{show_arg(w)}({blk})" for w, blk in step.out.fired]:
        out.append("fired " + ", ".join(fired))
    return out or ["(no change)"]


def format_trace(out: Outcome, cfg: Bounds = DEFAULT) -> str:
    """The violating trace, one numbered call per step with its changes."""
    labels = key_labels(cfg)
    lines = [f"VIOLATION of {', '.join(out.violation)} after {len(out.trace)} step(s):"]
    for n, st in enumerate(out.trace, 1):
        args = ", ".join(f"{a.name}={show_arg(x)}" for a, x in zip(OPERATIONS[st.action].args, st.args,
                                                                    strict=False))
        tail = f"  -> raised {st.refusal}" if st.refused else (
            f"  -> {st.result!r}" if st.result is not None and not isinstance(st.result, bytes) else "")
        lines.append(f"{n}. {st.action}({args}){tail}")
        lines += [f"     {d}" for d in describe(st, labels)]
    if out.trace:
        lines.append(f"   invariants broken in the last state: {violated(out.trace[-1].after) or 'none'}")
    return "\n".join(lines)
