"""A watcher runs for days: what the reading of one engine keeps is bounded by the engine's index (and the
history it is given), never by the run's length.  A long synthetic stream whose live index stays bounded
but whose keys are ever new, with what makes a reading grow (re-announced hits that leave phantoms, copies
in a second tier, partial entries, two groups, no AllBlocksCleared for most of it), is read by the checker
and three router profiles; the memory they hold is measured (tracemalloc) as the stream goes on."""

from __future__ import annotations

import random
import tracemalloc
from collections import deque
from collections.abc import Iterator
from typing import Any

from kvpool.oracle.events.kinds import Position
from kvpool.oracle.events.reading import Finding, Reading
from kvpool.oracle.events.routers import profile_factory

CAPACITY = 300
"""Keys the simulated engine holds at most (per group)."""
HISTORY = 200


def fleet_stream(events: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """An engine's events: chains of new blocks stored, hits re-announced, copies offloaded to CPU,
    partial entries, the oldest keys evicted once the index is full; one clear half-way."""
    rng = random.Random(seed)
    index: dict[int, deque[int]] = {0: deque(), 1: deque()}  # per group, the keys held, oldest first
    offloaded: set[int] = set()
    fresh = 1
    made = 0
    while made < events:
        group = rng.randrange(2)
        held = index[group]
        roll = rng.random()
        if made == events // 2:
            out: list[dict[str, Any]] = [{"type": "AllBlocksCleared"}]
            index[0].clear()
            index[1].clear()
            offloaded.clear()
        elif roll < 0.5 or len(held) < 4:
            n = rng.randint(1, 4)
            parent = held[-1] if held and rng.random() < 0.7 else None
            hashes = list(range(fresh, fresh + n))
            fresh += n
            held.extend(hashes)
            out = [_stored(hashes, parent, group, 4)]
        elif roll < 0.65:
            h = held[rng.randrange(len(held))]  # a hit announced again: no new copy
            out = [_stored([h], None, group, 4)]
        elif roll < 0.7 and group == 0:
            h = held[rng.randrange(len(held))]
            offloaded.add(h)
            out = [_stored([h], None, group, 4, "CPU")]
        else:
            out = [_stored([fresh], fresh - 1, group, 1)]  # a partial entry, its parent never announced
            held.append(fresh)
            fresh += 1
        while len(held) > CAPACITY:
            h = held.popleft()
            out.append({"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": group})
            if h in offloaded:
                offloaded.discard(h)
                out.append({"type": "BlockRemoved", "block_hashes": [h], "medium": "CPU", "group_idx": group})
        for e in out:
            made += 1
            yield e


def _stored(hashes: list[int], parent: int | None, group: int, size: int, medium: str = "GPU"
            ) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [h % 97 for h in hashes for _ in range(size)], "block_size": size, "lora_id": None,
            "medium": medium, "lora_name": None, "extra_keys": None, "group_idx": group}


def test_a_readings_memory_stays_bounded_over_a_long_stream() -> None:
    findings = [0]

    def count(_: Finding) -> None:
        findings[0] += 1

    reading = Reading("engine", {0: 4, 1: 4}, [profile_factory(p) for p in ("dynamo", "llm-d", "refcount")],
                      history=HISTORY, sink=count)
    total, marks = 30_000, (10_000, 20_000, 30_000)
    held: list[int] = []
    live: list[int] = []
    tracemalloc.start()
    try:
        for i, event in enumerate(fleet_stream(total), start=1):
            reading.feed(event, Position(i))
            if i in marks:
                held.append(tracemalloc.get_traced_memory()[0])
                live.append(reading.checker.left_stored)
    finally:
        tracemalloc.stop()
    # what the engine holds (its index, both groups) and what the reading may keep beyond it
    assert max(live) <= 2 * CAPACITY + HISTORY + 16
    assert reading.checker.forgotten > 0 and findings[0] > 0  # phantoms were forgotten; warnings came
    first, second, third = held
    assert third - first < first // 10 and second - first < first // 10, held  # no growth with length
