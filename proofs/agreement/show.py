"""A disagreement made readable: model states, calls, z3 steps, keys and contents in a few words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.model.state import NULL, Key, PoolState

from .. import bmc
from ..evaluate.interp import Carriers


def short(k: Key) -> str:
    return f"{k[0].hex()[:6]}/g{k[1]}"


def _tokens(c: Any) -> str:
    return "".join(str(t) for chunk in c for t in chunk[0])


def show_tokens(c: Any) -> str:
    return f"<{_tokens(c)}>"


def show_state(s: PoolState, labels: Mapping[Key, str] | None = None) -> str:
    """A model state in a few lines: each block, the index, the names, the announcements."""
    labels = labels or {}

    def lab(k: Key) -> str:
        return labels.get(k) or short(k)

    lines = [f"pool: {s.num_blocks} blocks, hash_block_size {s.hash_block_size}, caching "
             f"{'on' if s.caching else 'off'}, events {'on' if s.events_on else 'off'}; "
             f"free queue {list(s.free)}"]
    for b in range(s.num_blocks):
        p = s.primary[b]
        keys = (f"{lab(p.key)}@{p.num_tokens}" if p else "unhashed") + "".join(
            f" +{lab(k)}" for k in s.secondary[b])
        lines.append(f"block {b}{' (null)' if b == NULL else ''}: ref {s.ref[b]}, holders "
                     f"{s.holders[b]}, {keys}, holds {show_tokens(s.holds[b])}"
                     + (", watched" if b in s.watchers else ""))
    if any(b >= s.num_blocks or b < 0 for b in s.watchers):
        lines.append(f"watchers on {sorted(s.watchers)}")
    lines.append("index: " + (", ".join(f"{lab(k)} -> {list(bs)}" for k, bs in s.index.items())
                              or "empty"))
    lines.append("names: " + (", ".join(f"{lab(k)} = {show_tokens(c)}" for k, c in s.names.items())
                              or "none"))
    lines.append("announced: " + (", ".join(f"({lab(k)}, {b})" for k, b in sorted(s.announced))
                                  or "none"))
    return "\n".join(lines)


def show_content(d: Carriers, c: int | None) -> str:
    return "undefined" if c is None else _tokens(d.contents[c]) or "()"


def show_pairs(d: Carriers, f: str, pairs: frozenset[tuple[int, int]]) -> str:
    if f == "sec":
        return "{" + ", ".join(f"block {b}: {short(d.keys[k])}" for b, k in sorted(pairs)) + "}"
    return "{" + ", ".join(f"({short(d.keys[k])}, block {b})" for k, b in sorted(pairs)) + "}"


def described(call: bmc.Call, verdict: str) -> str:
    """A call and the model's verdict (spelled out only when a disagreement is reported)."""
    name, args = call
    return f"{name}({', '.join(bmc.show_arg(a) for a in args)}), model: {verdict}"


def show_step(step: str, args: tuple[Any, ...]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, tuple):
            return short(v) if len(v) == 2 and isinstance(v[0], bytes) else show_tokens(v)
        return repr(v)
    return f"{step}({', '.join(map(one, args))})"


def show_bool(v: bool | None) -> str:
    return "undetermined (reads a cell the model leaves undefined)" if v is None else str(v)
