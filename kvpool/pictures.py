"""Pictures of a pool: what a reviewer sees at each step of a counterexample.

A picture is plain JSON (see ``kvpool/VERIFY_SCHEMA.md``): one cell per block
with its ref count, its position in the free queue (the eviction order) and
its index keys, plus the index itself and the pending events.  The report
draws it; the JSON result carries it, so other tools can draw it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpool.impl.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.impl.keys import get_block_hash, get_group_id
from kvpool.model.state import PoolState
from kvpool.oracle.observe import Observation, observe_model

Label = Callable[[bytes], str]
Picture = dict[str, Any]


def short_label(key: bytes) -> str:
    """A key as the last 3 bytes of its hash and its group, e.g. ``a1b2c3/g0``.

    The last bytes, because events publish a hash as its low 64 bits: the
    same six hex digits then name the key in the index and in the events.
    """
    return f"{get_block_hash(key)[-3:].hex()}/g{get_group_id(key)}"


def _low64(key: bytes) -> int:
    return int.from_bytes(get_block_hash(key), "big") & 0xFFFF_FFFF_FFFF_FFFF


def labeller(names: Mapping[bytes, str] | None = None) -> Label:
    """Use ``names`` where they know a key, the short hex label elsewhere."""
    known = dict(names or {})
    return lambda key: known.get(key) or short_label(key)


def _event(ev: Any, known: Mapping[int, str]) -> str:
    """An event in one line; hashes named as the index names their keys."""
    if isinstance(ev, AllBlocksCleared) or not isinstance(ev, (BlockStored, BlockRemoved)):
        return type(ev).__name__
    group = getattr(ev, "group_idx", None)

    def name(h: Any) -> str:
        if isinstance(h, int):
            return known.get(h) or f"{h & 0xFFFFFF:06x}"
        return known.get(_low64(h)) or str(h) if isinstance(h, bytes) else str(h)

    shown = ", ".join(name(h) for h in ev.block_hashes)
    return f"{type(ev).__name__}[{shown}]" + (f" group {group}" if group is not None else "")


def picture_of_observation(obs: Observation, label: Label = short_label,
                           events: list[str] | None = None) -> Picture:
    """A picture from a whole-pool observation; ``events`` None: not observed."""
    position = {b: i for i, b in enumerate(obs.free)}
    watched = set(obs.watched)
    blocks = []
    for block_id, ref in enumerate(obs.ref):
        primary = obs.primary[block_id]
        blocks.append({
            "id": block_id,
            "ref": ref,
            "free_pos": position.get(block_id),
            "key": None if primary is None else label(primary[0]),
            "tokens": None if primary is None else primary[1],
            "extra_keys": [label(k) for k in obs.secondary[block_id]],
            "null": block_id == 0,
            "watched": block_id in watched,
        })
    index = [{"key": label(k), "blocks": list(ids)}
             for k, ids in sorted(obs.index, key=lambda entry: label(entry[0]))]
    return {"blocks": blocks, "free": list(obs.free), "index": index,
            "num_free": obs.num_free, "events": None if events is None else list(events)}


def event_names(s: PoolState, label: Label = short_label) -> dict[int, str]:
    """How events name a key: its published (low 64-bit) hash -> the key's label."""
    return {_low64(k): label(k).split("/g")[0] for k in [*s.names, *s.index]}


def describe_events(events: Any, known: Mapping[int, str]) -> list[str]:
    """Events in one line each, hashes named as the index names their keys."""
    return [_event(e, known) for e in events]


def picture_of_state(s: PoolState, label: Label = short_label) -> Picture:
    """A picture of a model state, with its pending events."""
    return picture_of_observation(observe_model(s), label,
                                  describe_events(s.events, event_names(s, label)))


def picture_differences(expected: Picture, actual: Picture) -> list[str]:
    """Which parts of two pictures differ, as ``block 3.ref`` / ``index`` / ``free``."""
    out = []
    for mine, theirs in zip(expected["blocks"], actual["blocks"], strict=False):
        for name in ("ref", "free_pos", "key", "tokens", "extra_keys", "watched"):
            if mine[name] != theirs[name]:
                out.append(f"block {mine['id']}.{name}")
    if len(expected["blocks"]) != len(actual["blocks"]):
        out.append("blocks")
    for name in ("free", "index", "num_free", "events"):
        if expected[name] != actual[name] and actual[name] is not None:
            out.append(name)
    return out


def picture_changes(before: Picture, after: Picture) -> list[str]:
    """What one step changed, as a reviewer would say it: ``ref 2: 1 -> 0``."""
    out = []
    for old, new in zip(before["blocks"], after["blocks"], strict=False):
        for name, shown in (("ref", "ref"), ("key", "key"), ("extra_keys", "extra keys"),
                            ("watched", "watched")):
            if old[name] != new[name]:
                out.append(f"{shown} {old['id']}: {old[name]} -> {new[name]}")
    if before["free"] != after["free"]:
        out.append(f"free queue: {before['free']} -> {after['free']}")
    old_index = {e["key"]: e["blocks"] for e in before["index"]}
    new_index = {e["key"]: e["blocks"] for e in after["index"]}
    for key in sorted(old_index.keys() | new_index.keys()):
        if old_index.get(key) != new_index.get(key):
            out.append(f"index {key}: {old_index.get(key, [])} -> {new_index.get(key, [])}")
    fresh = after["events"][len(before["events"]):] if len(after["events"]) >= len(
        before["events"]) else after["events"]
    out += [f"event {e}" for e in fresh]
    return out
