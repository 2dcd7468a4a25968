"""A long-lived pool under heavy churn: the workload of :mod:`.workload`, played as a busy engine plays it.

The short runs start a fresh, small pool every few thousand calls, so a
defect of a pool's own data structures that shows only after many
operations on one pool (a free queue with lazy deletion that compacts, an
index that rehashes, a free list that grows) goes unseen.  :class:`LongLived`
keeps one pool for the whole run and adds to the workload's steps what a
long-lived engine does to it (each step says how): many hits on idle cached
blocks between allocations (``revisit``, ``hit_storm``), long-running
requests (which ``finish`` leaves alone until they hold :data:`LONG_TOKENS`
tokens), eviction and re-caching of the same blocks (``evict_recache``), and
bursts that drain the free queue (``burst``).

Every call keeps to the model's caller contracts, misuse on or off as in
the workload; each step costs the same on any pool size (the workload's
:meth:`~.workload.Workload.scope`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvpool.impl.request import Request
from kvpool.model import Refusal

from .runs import Running
from .workload import MAX_RUNNING, Workload

LONG_TOKENS = 160
"""A long-running request finishes once it holds this many tokens."""
SERVED = 32
"""How many served prompts are remembered for ``revisit`` and ``hit_storm``."""
BURST_ADMITS = 4
"""Requests a burst admits (or releases) per step."""
STORM = 24
"""Lookups in one ``hit_storm`` at most."""
LONG_LIVED_BLOCKS = (256, 1024, 64)
"""A long-lived run's pool size by seed (``seed % 3``), unless one is given: deep enough for
idle cached blocks to wait long in the free queue, so any three runs in a row see three sizes."""
LONG_LIVED_STEPS = 10_000
"""Workload steps of a long-lived run unless told (a step makes several calls)."""
LONG_LIVED_RUNS = 3
"""Long-lived runs unless told: one pool each."""


@dataclass
class LongLived(Workload):
    """The workload on one long-lived pool, with heavy churn (see the module docstring)."""

    long: set[str] = field(default_factory=set)
    """Requests that run long."""
    served: deque[tuple[tuple[int, ...], Request]] = field(default_factory=lambda: deque(maxlen=SERVED))
    """Prompts served lately, with their requests (finished or not): what hits idle cached blocks."""
    bursting: list[Running] = field(default_factory=list)
    """A burst's requests, held outside :attr:`running` (none of the other steps touch them)."""
    draining: bool = False
    """Whether the burst is releasing what it took (the free queue ran dry)."""

    # ---------------------------------------------------------------- requests

    def _again(self) -> Request | None:
        """A new request reading a served prompt, now and then with a tail of its own."""
        if not self.served:
            return None
        prompt, old = self.rng.choice(self.served)
        self.counter += 1
        n = len(prompt)
        tokens = list(prompt[: self.rng.choice([n, n, self.rng.randint(1, n)])])
        tokens += [self.rng.randrange(50) for _ in range(self.rng.choice([0, 0, 1, 2]))]
        return Request(f"r{self.counter}", tokens, block_hasher=self.hasher, lora_request=old.lora_request,
                       cache_salt=old.cache_salt, session_id=old.session_id,
                       mm_features=[f for f in old.mm_features if f.mm_position.offset + f.mm_position.length
                                    <= len(tokens)])

    def admit(self, req: Request | None = None) -> Running | None:
        run = super().admit(req)
        if run is not None:
            self.served.append((tuple(run.request.all_token_ids), run.request))
            if self.rng.random() < 0.15:
                self.long.add(run.request.request_id)
        return run

    def finish(self) -> None:
        """A request finishes; long-running ones only once they are long enough."""
        done = [rid for rid, run in self.running.items()
                if rid not in self.long or run.request.num_tokens >= LONG_TOKENS]
        if not done:
            return
        rid = self.rng.choice(done)
        self.long.discard(rid)
        self._release(self.running.pop(rid), unpin=self.rng.random() < 0.2)

    def decode(self) -> None:
        """A decode step, more often for a long-running request (it has more to say)."""
        if self.long and self.rng.random() < 0.5:
            rid = self.rng.choice(sorted(self.long))
            if rid in self.running:
                self._decode(self.running[rid])
                return
            self.long.discard(rid)  # preempted, or finished by a reset
        super().decode()

    # ---------------------------------------------------------------- churn

    def revisit(self) -> None:
        """A served prompt comes back: its idle cached blocks are hit, the rest allocated."""
        req = self._again()
        if req is not None:
            self.admit(req)

    def hit_storm(self) -> None:
        """Several requests for served prompts that take their hits and let them go again.

        Requests admitted while the engine is full and preempted before they
        computed anything: each takes its hits (idle cached blocks leave the
        middle of the free queue), now and then a fresh block or two for its
        tail, and gives them all back (the hits rejoin the queue's tail, the
        unwritten blocks its head).  Hits are taken far more often than blocks
        are handed out.
        """
        held: list[list[int]] = []
        for _ in range(self.rng.randint(2, STORM)):
            req = self._again()
            if req is None:
                return
            group = self.rng.choice(list(self.cfg.block_sizes))
            table = self.lookup(req, group)
            if table:
                self.pair.call("touch", table)
            if self.rng.random() < 0.4:
                got = self.pair.call("get_new_blocks", self.rng.randint(1, 2))
                if not isinstance(got, Refusal):
                    table = table + got
                    self.seen.extend(got)
            if table:
                held.append(table)
            if held and self.rng.random() < 0.5:  # released in any order, each table tail first
                self.pair.call("free_blocks", list(reversed(held.pop(self.rng.randrange(len(held))))))
        for table in held:
            self.pair.call("free_blocks", list(reversed(table)))

    def evict_recache(self) -> None:
        """The same blocks evicted and cached again.

        Either a running request's cached blocks lose their entries (a KV
        connector reported them invalid) and the request caches them again,
        same blocks, same keys; or a served prompt's idle blocks are evicted
        and the prompt is served again, re-caching its keys in fresh blocks.
        """
        cached = [(run, g) for run in self.running.values() for g, n in run.cached.items() if n > 0]
        if cached and self.rng.random() < 0.6:
            run, group = self.rng.choice(cached)
            upto = run.cached[group]
            blocks = [b for b in run.tables[group][:upto] if b]
            self.pair.call("evict_blocks", blocks)
            self.pair.call("cache_full_blocks", run.request, run.tables[group], 0, upto,
                           self.cfg.block_sizes[group], group)
            return
        req = self._again()
        if req is None:
            return
        hits = self.lookup(req, 0)
        if hits:
            self.pair.call("evict_blocks", hits)
        self.admit(req)

    def burst(self) -> None:
        """A burst of requests that drains the free queue, then lets it fill again.

        While filling, a few requests are admitted per step (held apart from
        the running ones) until an allocation is refused: the queue ran dry.
        Then a few are released per step until none is left.
        """
        if self.draining:
            for _ in range(min(BURST_ADMITS, len(self.bursting))):
                self._release(self.bursting.pop(self.rng.randrange(len(self.bursting))), unpin=False)
            self.draining = bool(self.bursting)
            return
        for _ in range(BURST_ADMITS):
            req = self._again() if self.rng.random() < 0.5 else None
            run = self._admit_apart(req or self._new_request())
            if run is None:
                self.draining = bool(self.bursting)
                return
            self.bursting.append(run)

    def _admit_apart(self, req: Request) -> Running | None:
        """:meth:`admit` for a burst: not counted among the running requests; None when dry."""
        running, self.running = self.running, {}
        try:
            run = Workload.admit(self, req)
        finally:
            self.running = running
        return run

    def reset(self) -> None:
        """A reset; half the time everything is let go first (the burst too), so that it succeeds."""
        if self.bursting and self.rng.random() < 0.5:
            for run in self.bursting:
                self._release(run, unpin=False)
            self.bursting, self.draining = [], False
        self.long.clear()
        super().reset()

    STEPS: tuple[tuple[str, float], ...] = (
             ("admit", 4), ("decode", 8), ("finish", 3), ("revisit", 6), ("hit_storm", 3),
             ("evict_recache", 2), ("burst", 2), ("slide", 1), ("move", 1), ("drop_copies", 1),
             ("share", 1), ("partial_inside", 1), ("rewrite", 1), ("sparse", 1), ("placeholders", 1),
             ("other_pool", 1), ("offload", 1), ("evict", 1), ("reset", 0.2), ("query", 2), ("take", 4),
             ("misuse", 2))


def pool_blocks(seed: int, blocks: int | None, long_lived: bool) -> int | None:
    """A run's pool size: ``blocks`` if given, else a long-lived run's by seed, else None (drawn)."""
    if blocks is not None or not long_lived:
        return blocks
    return LONG_LIVED_BLOCKS[seed % len(LONG_LIVED_BLOCKS)]


def workload_class(long_lived: bool) -> type[Workload]:
    """The workload that plays a run: :class:`LongLived` or the short runs' :class:`Workload`."""
    return LongLived if long_lived else Workload


__all__ = ["BURST_ADMITS", "LONG_LIVED_BLOCKS", "LONG_LIVED_RUNS", "LONG_LIVED_STEPS", "LONG_TOKENS",
           "MAX_RUNNING", "SERVED", "STORM", "LongLived", "pool_blocks", "workload_class"]
