"""What a trace says beyond its events: the pool's index after each call, replayed on the model.

A bare stream cannot tell a re-announced hit from a second copy, nor a
removed parent the pool still holds from one it dropped; a trace can, by the
pool's copies before and after each call (the observation's, or the model's
state of the replay).  :class:`PoolFacts` gives the checker those copies as
the stream advances; :func:`step_events` gives the events a router reads from
one call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvpool.model.request import prefix_key
from kvpool.model.state import PoolState

from ..trace import TraceError, TraceStep
from ..trace.check import agreeing_steps
from .kinds import LOW_64, Key, Position, event_group, hash64

Copies = dict[Key, int]


def index_copies(index: list[list[Any]]) -> Copies:
    """An observation's index as copies per (hash in int form, group): keys end in the group."""
    out: Copies = {}
    for key_hex, ids in index:
        raw = bytes.fromhex(key_hex)
        key = (int.from_bytes(raw[:-4], "big") & LOW_64, int.from_bytes(raw[-4:], "big"))
        out[key] = out.get(key, 0) + len(ids)
    return out


def pool_copies(step: TraceStep, state: PoolState) -> Copies:
    """The pool's copies per (64-bit hash, group) after a call: its observation's, or the model's."""
    if step.observation is not None and "index" in step.observation:
        return index_copies(step.observation["index"])
    return {(int.from_bytes(h, "big") & LOW_64, g): len(ids) for (h, g), ids in state.index.items()}


def _callers_announcement(args: dict[str, Any], hash_block_size: int) -> dict[str, Any]:
    """The ``BlockStored`` the caller of ``_insert_block_hash`` publishes for the copied key."""
    block_hash, group = prefix_key(args["request"], args["prefix_tokens"], hash_block_size,
                                   args["kv_cache_group_id"])
    return {"type": "BlockStored", "block_hashes": [hash64(block_hash.hex())],
            "parent_block_hash": None, "token_ids": [], "block_size": 0,
            "group_idx": group}


def step_events(step: TraceStep, hash_block_size: int, events_on: bool
                ) -> list[tuple[Position, dict[str, Any]]]:
    """The events a router reads from one call, positioned: the call's own, then (for
    ``_insert_block_hash``) the offload caller's announcement of the key it copied.

    A pool that does not show each call's events (``events: null``) hands them
    over in ``take_events``: there they are read, when the router would receive them.
    """
    own = step.events
    if own is None and step.op == "take_events" and step.error is None:
        own = step.result
    events = [(Position(step.line, i), e) for i, e in enumerate(own or ())]
    if step.op == "_insert_block_hash" and step.error is None and events_on:
        events.append((Position(step.line, len(events)), _callers_announcement(step.args, hash_block_size)))
    return events


class PoolFacts:
    """What a trace's replay says of each call, read as the stream advances: the pool's copies,
    before and after the call, of the keys its stores name.

    The replay runs at most one call ahead of the reader, and follows the
    index by each call's footprint: memory and cost per call are the pool's
    and the call's, never the trace's.  Lines after a call the model does
    not agree with (or an unreadable line) are not covered.
    """

    def __init__(self, path: str | Path):
        self._facts = _replay(path)
        self._next: tuple[int, Copies, Copies] | None = None
        self._done = False

    def at(self, line: int) -> tuple[Copies, Copies] | None:
        """Before and after ``line``'s call, for the keys its stores name; lines only increase."""
        while not self._done and (self._next is None or self._next[0] < line):
            try:
                self._next = next(self._facts)
            except (StopIteration, TraceError):
                self._done, self._next = True, None
        if self._next is not None and self._next[0] == line:
            return self._next[1], self._next[2]
        return None


def _named(step: TraceStep, state: PoolState) -> set[Key]:
    """The keys (and parents) the call's stores name, in the checker's key form."""
    keys: set[Key] = set()
    for _, e in step_events(step, state.hash_block_size, state.events_on):
        if e["type"] == "BlockStored":
            group = event_group(e)
            keys.update((hash64(h), group) for h in e["block_hashes"])
            if e.get("parent_block_hash") is not None:
                keys.add((hash64(e["parent_block_hash"]), group))
    return keys


def _replay(path: str | Path) -> Iterator[tuple[int, Copies, Copies]]:
    """Per call whose stores name keys: its line, and the pool's copies of them before and after.

    The observation's index where a line has one, else the model's, kept per
    key as each call's declared footprint changes it.
    """
    copies: Copies = {}
    for step, state, keys in agreeing_steps(path, footprints=True):
        named = _named(step, state)
        before = {k: copies.get(k, 0) for k in named}
        if step.observation is not None and "index" in step.observation:
            copies = index_copies(step.observation["index"])
        else:
            for h, g in keys:
                key, held = (int.from_bytes(h, "big") & LOW_64, g), len(state.index.get((h, g), ()))
                if held:
                    copies[key] = held
                else:
                    copies.pop(key, None)
        if named:
            yield step.line, before, {k: copies.get(k, 0) for k in named}


__all__ = ["Copies", "PoolFacts", "index_copies", "pool_copies", "step_events"]
