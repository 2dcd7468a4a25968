"""Pictures of a pool: what a reviewer sees at each step of a counterexample.

A picture is plain JSON (see ``kvpool/VERIFY_SCHEMA.md``): one cell per block
with its ref count, its position in the free queue (the eviction order) and
its index keys, plus the index itself and the pending events.  The report
draws it; the JSON result carries it, so other tools can draw it too.  It is
drawn from plain data only: a model state, an observation of a pool in the
model's vocabulary, events as ``{"type": ..., field: value}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvpool.model.state import Key, PoolState
from kvpool.oracle.core.abstraction import model_event, published
from kvpool.oracle.core.lockstep import Divergence
from kvpool.oracle.core.observe import Observation, observe_model

Label = Callable[[Key], str]
Picture = dict[str, Any]


def short_label(key: Key) -> str:
    """A key as the last 3 bytes of its hash and its group, e.g. ``a1b2c3/g0``.

    The last bytes, because events publish a hash as its low 64 bits: the
    same six hex digits then name the key in the index and in the events.
    """
    block_hash, group = key
    return f"{block_hash[-3:].hex()}/g{group}"


def labeller(names: Mapping[Key, str] | None = None) -> Label:
    """Use ``names`` where they know a key, the short hex label elsewhere."""
    known = dict(names or {})
    return lambda key: known.get(key) or short_label(key)


def _event(ev: Mapping[str, Any], known: Mapping[Any, str]) -> str:
    """An event in one line; hashes named as the index names their keys."""
    kind = str(ev.get("type"))
    if kind not in ("BlockStored", "BlockRemoved"):
        return kind
    group = ev.get("group_idx")

    def name(h: Any) -> str:
        if h in known:
            return known[h]
        return f"{h & 0xFFFFFF:06x}" if isinstance(h, int) else str(h)

    shown = ", ".join(name(h) for h in ev.get("block_hashes") or ())
    return f"{kind}[{shown}]" + (f" group {group}" if group is not None else "")


def picture_of_observation(obs: Observation, label: Label = short_label,
                           events: list[str] | None = None) -> Picture:
    """A picture from a whole-pool observation; ``events`` None: not observed."""
    if obs.ref is None or obs.free is None or obs.primary is None:
        raise ValueError("an observation through calls only (api-only) has no picture")
    position = {b: i for i, b in enumerate(obs.free)}
    watched = None if obs.watched is None else set(obs.watched)
    blocks = [{"id": block_id, "ref": ref, "free_pos": position.get(block_id),
               "key": None if primary is None else label(primary[0]),
               "tokens": None if primary is None else primary[1],
               "extra_keys": None if obs.secondary is None else [label(k) for k in obs.secondary[block_id]],
               "null": block_id == 0, "watched": None if watched is None else block_id in watched}
              for block_id, (ref, primary) in enumerate(zip(obs.ref, obs.primary, strict=True))]
    index = (None if obs.index is None else
             [{"key": label(k), "blocks": list(ids)}
              for k, ids in sorted(obs.index, key=lambda entry: label(entry[0]))])
    return {"blocks": blocks, "free": list(obs.free), "index": index,
            "num_free": obs.num_free, "events": None if events is None else list(events)}


def event_names(s: PoolState, label: Label = short_label) -> dict[Any, str]:
    """How events name a key: its published hash -> the key's label without the group."""
    return {published(k[0]): label(k).split("/g")[0] for k in [*s.names, *s.index]}


def describe_events(events: Iterable[Mapping[str, Any]], known: Mapping[Any, str]) -> list[str]:
    """Events (as field dicts) in one line each, hashes named as the index names their keys."""
    return [_event(e, known) for e in events]


def picture_of_state(s: PoolState, label: Label = short_label) -> Picture:
    """A picture of a model state, with its pending events."""
    return picture_of_observation(
        observe_model(s), label,
        describe_events((model_event(e) for e in s.events), event_names(s, label)))


def picture_differences(expected: Picture, actual: Picture) -> list[str]:
    """Which parts of two pictures differ, as ``block 3.ref`` / ``index`` / ``free``."""
    out = []
    for mine, theirs in zip(expected["blocks"], actual["blocks"], strict=False):
        for name in ("ref", "free_pos", "key", "tokens", "extra_keys", "watched"):
            hidden = theirs[name] is None and (  # the pool does not show it: not a difference
                name in ("extra_keys", "watched") or (name == "tokens" and theirs["key"] is not None))
            if mine[name] != theirs[name] and not hidden:
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


def trace_step(index: int, call: str, outcome: str = "", changes: list[str] | None = None,
               picture: Picture | None = None) -> dict[str, Any]:
    """One step of a failure's trace (``VERIFY_SCHEMA.md``'s TraceStep), without the pool under
    test beside the model's (:func:`pictured_steps` adds it on the step that diverges)."""
    return {"index": index, "call": call, "outcome": outcome, "changes": changes or [],
            "picture": picture, "pool_picture": None, "differs": []}


def pictured_steps(div: Divergence) -> list[dict[str, Any]]:
    """A divergence's last calls as the report shows them (``VERIFY_SCHEMA.md``'s TraceStep).

    A picture of the model's pool after each call and what the call changed;
    on the last one, the pool under test beside it with the differences.
    """
    before = picture_of_state(div.before) if div.before is not None else None
    out: list[dict[str, Any]] = []
    last = div.first + len(div.record)
    for number, step in enumerate(div.record, start=div.first + 1):
        state = step.state if step.state is not None or number < last else div.model
        picture = picture_of_state(state) if state is not None else None
        out.append(trace_step(number, step.call, step.outcome,
                              picture_changes(before, picture) if before and picture else [], picture))
        before = picture
    if not out and div.model is not None:  # diverged before the first call: as built
        out.append(trace_step(0, "(the pool as constructed)", picture=picture_of_state(div.model)))
    if out and out[-1]["picture"] is not None:
        if div.pool is None:
            out[-1]["changes"].append(
                f"the pool could not be observed: {div.unobservable or 'no observation'}")
        else:
            final = div.record[-1].state if div.record and div.record[-1].state else div.model
            known = event_names(final) if final is not None else {}
            pool = picture_of_observation(div.pool, events=None if div.pool_events is None
                                          else describe_events(div.pool_events, known))
            out[-1]["pool_picture"] = pool
            out[-1]["differs"] = picture_differences(out[-1]["picture"], pool)
    return out
