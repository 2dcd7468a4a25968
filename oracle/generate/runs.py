"""What a run is made of: the shape of its pool, and its requests in flight.

The workload, the long-lived workload, the state machine, the campaign and the
recorder all run on a :class:`RunConfig` and hold requests as :class:`Running`;
they live here so that none of them has to import another for its vocabulary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvpool.impl.request import Request


@dataclass
class Running:
    """A request in flight: its block table per KV-cache group."""

    request: Request
    tables: dict[int, list[int]]
    cached: dict[int, int]


@dataclass
class RunConfig:
    """The shape of one run."""

    num_blocks: int
    caching: bool
    hash_block_size: int
    block_sizes: dict[int, int]  # group id -> block size (a multiple of hash_block_size)
    events: bool
    extra_keys: bool
    metrics: bool = False
    """Whether the pool is built with a metrics collector, compared call by call."""

    @classmethod
    def draw(cls, rng: random.Random, run: int | None = None, blocks: int | None = None) -> RunConfig:
        """A random shape; runs with events on always carry extra keys, which the events publish.

        ``blocks`` is the pool's size (the rest is drawn as without it, from the same dice).

        ``run`` (a campaign's seed) fixes what decides which branches of the
        pool run at all, so that any four runs in a row see all of it: every
        fourth run has no prefix caching, the others give the first group
        blocks of three, two and one hash chunks (partial entries need
        several); one run in three has no events (over twelve runs in a
        row, every pairing); every fourth run, starting with the first, has
        a second KV-cache group (its keys and events carry a group id other
        than zero); odd runs get at least 8 blocks, so that a pool
        small enough to run dry (even runs) does not starve the shapes that
        need blocks to spare.  Without ``run`` all of it is drawn (caching
        85%, events 70%).
        """
        hbs = rng.choice([1, 2, 4])
        groups = rng.choice([1, 1, 2])
        sizes = {g: hbs * rng.choice([1, 2, 3]) for g in range(groups)}
        num_blocks, caching, events = rng.randint(2, 24), rng.random() < 0.85, rng.random() < 0.7
        extra_keys, metrics = rng.random() < 0.4, rng.random() < 0.5
        if run is not None:
            caching, events = run % 4 != 3, run % 3 != 1
            num_blocks = max(num_blocks, 8) if run % 2 else num_blocks
            sizes[0] = hbs * (3, 2, 1, 3)[run % 4]
            if run % 4 == 0 and len(sizes) == 1:
                sizes[1] = hbs * rng.choice([1, 2, 3])
        if blocks is not None:
            num_blocks = blocks
        return cls(num_blocks=num_blocks, caching=caching, hash_block_size=hbs, block_sizes=sizes,
                   events=events, extra_keys=events or extra_keys, metrics=metrics)
