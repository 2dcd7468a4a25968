"""A random but realistic workload, played like vLLM's KV-cache manager plays it.

Requests share prefixes so that lookups hit; they are admitted (lookup,
touch, allocate, cache), decode token by token (allocate, cache, partial
entries and their promotion), finish (free, or unpin for a reader), and get
preempted when the pool runs dry.  Evictions, resets, hash moves, event
takes and deliberate misuse are mixed in.  Every call goes through a
:class:`~kvpool.oracle.lockstep.Lockstep`, which compares pool and model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import Refusal
from kvpool.model.request import hashes_at
from kvpool.model.state import NULL

from .lockstep import Lockstep


@dataclass
class Running:
    """A request in flight: its block table per KV-cache group."""

    request: Request
    tables: dict[int, list[int]]
    cached: dict[int, int]


@dataclass
class Config:
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
    def draw(cls, rng: random.Random) -> Config:
        hbs = rng.choice([1, 2, 4])
        groups = rng.choice([1, 1, 2])
        sizes = {g: hbs * rng.choice([1, 2, 3]) for g in range(groups)}
        return cls(
            num_blocks=rng.randint(2, 24), caching=rng.random() < 0.85, hash_block_size=hbs,
            block_sizes=sizes, events=rng.random() < 0.7, extra_keys=rng.random() < 0.4,
            metrics=rng.random() < 0.5,
        )


@dataclass
class Workload:
    """Plays random steps against a lockstep pair."""

    rng: random.Random
    cfg: Config
    pair: Lockstep
    running: dict[str, Running] = field(default_factory=dict)
    copies: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)
    """Blocks held twice by one holder (listed twice, freed in one call)."""
    documents: list[list[int]] = field(default_factory=list)
    counter: int = 0
    misuse_on: bool = True

    def __post_init__(self) -> None:
        self.documents = [[self.rng.randrange(50) for _ in range(48)] for _ in range(3)]
        self.hasher = get_request_block_hasher(self.cfg.hash_block_size)

    # -------------------------------------------------------------- requests

    def _new_request(self) -> Request:
        self.counter += 1
        doc = self.rng.choice(self.documents)
        tokens = doc[: self.rng.randint(1, 24)] + [
            self.rng.randrange(50) for _ in range(self.rng.choice([0, 0, 1, 3]))]
        kw: dict[str, Any] = {}
        if self.cfg.extra_keys:
            if self.rng.random() < 0.3:
                kw["lora_request"] = LoRARequest(f"lora{self.rng.randint(1, 2)}", 7, "/a")
            if self.rng.random() < 0.2:
                kw["cache_salt"] = self.rng.choice(["s1", "s2"])
            if self.rng.random() < 0.2 and len(tokens) > 3:
                offset = self.rng.randrange(len(tokens) - 2)
                kw["mm_features"] = [MultiModalFeature(
                    f"img{self.rng.randint(1, 2)}", PlaceholderRange(offset, 2))]
        return Request(f"r{self.counter}", tokens, block_hasher=self.hasher,
                       session_id=self.rng.choice([None, "sess"]), **kw)

    def _hashes(self, req: Request, group: int) -> Any:
        return hashes_at(req, self.cfg.hash_block_size, self.cfg.block_sizes[group])

    def _cache(self, run: Running, group: int) -> None:
        bs = self.cfg.block_sizes[group]
        req = run.request
        full = req.num_tokens // bs
        if self.cfg.caching:
            self.pair.call("cache_full_blocks", req, run.tables[group], run.cached[group],
                           full, bs, group)
            run.cached[group] = max(run.cached[group], full)
        partial = (req.num_tokens // self.cfg.hash_block_size) * self.cfg.hash_block_size
        if (self.cfg.caching and bs > self.cfg.hash_block_size and partial % bs
                and self.rng.random() < 0.5):
            self.pair.call("cache_partial_block", req, run.tables[group][partial // bs],
                           partial, group, bs)

    def _grow(self, run: Running, group: int) -> bool:
        bs = self.cfg.block_sizes[group]
        need = -(-run.request.num_tokens // bs) - len(run.tables[group])
        if need <= 0:
            return True
        got = self.pair.call("get_new_blocks", need)
        if isinstance(got, Refusal):
            return False
        run.tables[group].extend(got)
        return True

    # ---------------------------------------------------------------- steps

    def admit(self) -> None:
        req = self._new_request()
        run = Running(req, {}, {})
        for group, bs in self.cfg.block_sizes.items():
            hits: list[int] = []
            if self.cfg.caching:
                for block_hash in self._hashes(req, group):
                    found = self.pair.call("get_cached_block", block_hash, [group])
                    if found is None or (len(hits) + 1) * bs >= req.num_tokens:
                        break
                    hits.extend(found)
            self.pair.call("touch", hits)
            run.tables[group] = hits
            run.cached[group] = len(hits)
            if hits and self.cfg.events and self.rng.random() < 0.5:
                self.pair.call("emit_cached_block_events", req, len(hits), bs, group)
            if not self._grow(run, group):
                self._release(run, unpin=False)
                return
            self._cache(run, group)
        self.running[req.request_id] = run

    def decode(self) -> None:
        if not self.running:
            return
        run = self.running[self.rng.choice(list(self.running))]
        run.request.append_output_token_ids(
            [self.rng.randrange(50) for _ in range(self.rng.randint(1, 3))])
        for group in run.tables:
            if not self._grow(run, group):
                del self.running[run.request.request_id]
                self._release(run, unpin=False)  # preempted
                return
            self._cache(run, group)

    def finish(self) -> None:
        if not self.running:
            return
        rid = self.rng.choice(list(self.running))
        self._release(self.running.pop(rid), unpin=self.rng.random() < 0.2)

    def _release(self, run: Running, unpin: bool) -> None:
        for _group, table in run.tables.items():
            blocks = list(reversed(table))  # the tail of a prefix is evicted first
            if unpin:  # a reader keeps the real blocks; null placeholders are not pinned
                self.pair.call("unpin_blocks", [b for b in blocks if b != NULL],
                               self.pair.watcher(run.request.request_id))
            else:
                self.pair.call("free_blocks", blocks)

    def slide(self) -> None:
        """Sliding-window attention: blocks that left the window become the null block.

        vLLM's sliding-window manager frees them and keeps the null block in
        their place, so later frees of the table include the null block.
        """
        candidates = [(run, g) for run in self.running.values() for g, t in run.tables.items()
                      if len(t) > 2]
        if not candidates:
            return
        run, group = self.rng.choice(candidates)
        table = run.tables[group]
        cut = self.rng.randint(1, len(table) - 2)
        gone = [b for b in table[:cut] if b != NULL]
        table[:cut] = [NULL] * cut
        if gone:
            self.pair.call("free_blocks", list(reversed(gone)))

    def move(self) -> None:
        candidates = [
            (run, g) for run in self.running.values() for g, t in run.tables.items()
            if t and self.pair.model.primary[t[-1]] is not None
        ]
        if not candidates:
            return
        run, group = self.rng.choice(candidates)
        got = self.pair.call("get_new_blocks", 1)
        if isinstance(got, Refusal):
            return
        self.pair.call("move_block_hashes", run.tables[group][-1], got[0])
        self.copies.append(got[0])

    def drop_copies(self) -> None:
        self.pair.call("free_blocks", self.copies)
        self.copies = []

    def share(self) -> None:
        """A holder that lists one block twice, as a sliding-window table with offloading does.

        It takes two references in one ``touch`` and drops both in one
        ``free_blocks`` later: legal, and the shape in which a pool that
        queues a block once per listing corrupts its free queue.
        """
        if self.shared:
            self.pair.call("free_blocks", self.shared)
            self.shared = []
            return
        m = self.pair.model
        pick = [b for b in range(1, m.num_blocks) if m.ref[b] > 0 or m.primary[b] is not None]
        if pick:
            b = self.rng.choice(pick)
            self.pair.call("touch", [b, b])
            self.shared = [b, b]

    def partial_inside(self) -> None:
        """A partial entry at a chunk boundary inside a block already cached further.

        The block keeps its primary key and gains a secondary one: the shape
        that eviction, promotion and moves must treat as a whole.
        """
        hbs = self.cfg.hash_block_size
        options = [(run, g) for run in self.running.values() for g, bs in self.cfg.block_sizes.items()
                   if self.cfg.caching and bs > hbs and run.cached.get(g, 0) > 0]
        if not options:
            return
        run, group = self.rng.choice(options)
        bs = self.cfg.block_sizes[group]
        i = self.rng.randrange(run.cached[group])
        if run.tables[group][i] == NULL:
            return
        tokens = i * bs + hbs * self.rng.randint(1, bs // hbs - 1)
        self.pair.call("cache_partial_block", run.request, run.tables[group][i], tokens, group, bs)

    def placeholders(self) -> None:
        """Null placeholders in the range to cache (sliding window): skipped, never hashed."""
        if not self.cfg.caching:
            return
        req = self._new_request()
        bs = self.cfg.block_sizes[0]
        n = min(self.rng.randint(1, 3), len(self._hashes(req, 0)))
        self.pair.call("cache_full_blocks", req, [NULL] * n, 0, n, bs, 0)

    def evict(self) -> None:
        m = self.pair.model
        hashed = [b for b in range(m.num_blocks) if m.primary[b] is not None]
        if hashed and self.rng.random() < 0.5:
            ids = self.rng.sample(hashed, k=min(len(hashed), self.rng.randint(1, 2)))
        else:
            ids = self.rng.sample(range(self.cfg.num_blocks), k=self.rng.randint(0, 3)
                                  if self.cfg.num_blocks > 3 else 1)
        self.pair.call("evict_blocks", ids)

    def reset(self) -> None:
        if self.rng.random() < 0.5:
            for rid in list(self.running):
                self._release(self.running.pop(rid), unpin=False)
            self.drop_copies()
            if self.shared:
                self.share()  # frees the block it holds twice
        self.pair.call("reset_prefix_cache")

    def query(self) -> None:
        self.pair.call("get_usage")
        self.pair.call("get_num_free_blocks")
        self.pair.call("is_block_writable", self.rng.randrange(self.cfg.num_blocks))

    def take(self) -> None:
        self.pair.call("take_events")

    def misuse(self) -> None:
        """A deliberately wrong call; both sides must refuse it the same way."""
        m = self.pair.model
        idle = [b for b in range(1, m.num_blocks) if m.ref[b] == 0]
        used = [b for b in range(1, m.num_blocks) if m.ref[b] > 0]
        req = self._new_request()
        bs = self.cfg.block_sizes[0]
        choice = self.rng.randrange(11)
        if choice == 0 and idle:
            self.pair.call("free_blocks", [self.rng.choice(idle)])
        elif choice == 1 and used:
            b = self.rng.choice(used)
            self.pair.call("free_blocks", [b] * (m.ref[b] + 1))
        elif choice == 2:
            self.pair.call("unpin_blocks", [0], self.pair.watcher("bad"))
        elif choice == 3:  # refused after taking earlier blocks: it must give them back
            self.pair.call("touch", [*used[:1], *idle[-1:], m.num_blocks + self.rng.randint(0, 3)])
        elif choice == 4:
            self.pair.call("get_new_blocks", self.rng.choice([-1, len(m.free) + 1]))
        elif choice == 5 and used:
            self.pair.call("cache_full_blocks", req, [self.rng.choice(used)], 0, 1, bs, 0,
                           [True, False])
        elif choice == 6:
            self.pair.call("evict_blocks", [self.rng.choice([-1, m.num_blocks])])
        elif choice == 7 and used:
            hashed = [b for b in range(1, m.num_blocks) if m.primary[b] is not None]
            if hashed:
                self.pair.call("move_block_hashes", self.rng.choice(used), self.rng.choice(hashed))
        elif choice == 8 and used:
            self.pair.call("cache_partial_block", req, self.rng.choice(used),
                           self.rng.choice([0, -self.cfg.hash_block_size]), 0, bs * 2)
        elif choice == 9:
            self.pair.call("cache_full_blocks", req, [0] * 4, 3, 1, bs, 0)
        elif choice == 10:
            hashed = [b for b in range(1, m.num_blocks) if m.primary[b] is not None]
            if hashed:
                self.pair.call("move_block_hashes", self.rng.choice(hashed), NULL)

    STEPS = (("admit", 6), ("decode", 8), ("finish", 4), ("slide", 1), ("move", 1),
             ("drop_copies", 1), ("share", 1), ("partial_inside", 1), ("placeholders", 1),
             ("evict", 1), ("reset", 1), ("query", 2), ("take", 2), ("misuse", 2))

    def step(self) -> str:
        steps = self.STEPS if self.misuse_on else [x for x in self.STEPS if x[0] != "misuse"]
        names, weights = zip(*steps, strict=True)
        name: str = self.rng.choices(names, weights)[0]
        getattr(self, name)()
        return name
