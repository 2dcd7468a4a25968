"""A random but realistic workload, played like vLLM's KV-cache manager plays it.

Requests share prefixes so that lookups hit; they are admitted (lookup,
touch, allocate, cache), decode token by token (allocate, cache, partial
entries and their promotion), finish (free, or unpin for a reader), and get
preempted when the pool runs dry.  Evictions, resets, hash moves, event
takes and deliberate misuse are mixed in.  Every call goes through a
:class:`~kvpool.oracle.core.lockstep.Lockstep`, which compares pool and model.

Every legal shape of a call is made, misuse or not, because a pool can be
wrong on any of them: a block listed several times in one ``free_blocks``,
``touch`` or ``unpin_blocks``; requests with LoRA, a cache salt, a session
and several multimodal items (short, adjacent, several in one chunk); block
masks; partial entries at every chunk boundary inside a block (and at the
block boundary under vLLM 0.33), on the null block, and with
``replace_existing_hashes``; ``cache_full_blocks`` asked for fewer blocks
than are cached; hash moves of unhashed blocks; blocks of a second pool of
the same class freed through the first.  Each call keeps to the model's
caller contracts (a block is written only with its owner's prefix, replaced
only by its sole owner), so a correct pool never diverges.

This module holds the engine-like steps and the loop that draws them; what
they draw on is in :mod:`.runs`, :mod:`.requests`, :mod:`.entries`,
:mod:`.two_pools` and :mod:`.misuse` (the package says which holds what).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.model import Refusal
from kvpool.model.request import hashes_at
from kvpool.model.state import NULL

from ..core.lockstep import Lockstep
from .capabilities import SKIPPED
from .defaults import default_call, unwritten
from .entries import partial_spots, rekey, rewritable, writable
from .misuse import wrong_call
from .requests import draw_documents, random_request
from .runs import RunConfig, Running
from .two_pools import free_across

SCAN_LIMIT = 256
"""Pools up to this size are scanned whole when a step picks blocks; on a larger pool a step
picks among the blocks the workload handled lately (:meth:`Workload.scope`), so that it costs
the same however large the pool is."""
MAX_RUNNING = 24
"""Requests in flight at most (an engine's ``max_num_seqs``).  A pool of the default shapes (at
most 24 blocks) never holds this many, each request holding a block it allocated itself; an
engine-sized one would otherwise admit requests without end."""
DEFAULT_SHARE = 1 / 48
"""The share of steps that call an operation no step calls (:meth:`Workload.default`), when there
is one: about as often as a step of weight one."""


@dataclass
class Workload:
    """Plays random steps against a lockstep pair."""

    rng: random.Random
    cfg: RunConfig
    pair: Lockstep
    running: dict[str, Running] = field(default_factory=dict)
    copies: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)
    """One block held by one holder several times (listed as often, released in one call)."""
    documents: list[list[int]] = field(default_factory=list)
    counter: int = 0
    misuse_on: bool = True
    second: Callable[[], Lockstep] | None = None
    """Builds a second pool of the same class, on first use.  None where the run is
    written as a trace (``kvpool record``): see :attr:`traceable_only`."""
    other: Lockstep | None = None
    theirs: list[int] = field(default_factory=list)
    """Blocks of the second pool held for a free through the first, as they will be listed."""
    seen: deque[int] = field(default_factory=lambda: deque(maxlen=SCAN_LIMIT))
    """The blocks handed out, hit and released lately: where a step on a large pool picks."""
    defaulted: list[str] = field(default_factory=list)
    """The pool's operations no step calls (:mod:`.defaults`), known at the first step."""
    default_dice: random.Random | None = None
    """The dice of :meth:`default`, apart from the steps' own (made at the first step)."""

    def __post_init__(self) -> None:
        self.documents = draw_documents(self.rng)
        self.hasher = get_request_block_hasher(self.cfg.hash_block_size)

    @property
    def traceable_only(self) -> bool:
        """Whether only calls a trace can write are made (a run the recorder gives no second pool).

        The trace format names one pool's blocks, and a watcher by its name
        (replayed as a callable): another pool's blocks and a watcher that
        cannot be called are left out.
        """
        return self.second is None

    # -------------------------------------------------------------- requests

    @property
    def lacks(self) -> frozenset[str]:
        """What the pool lacks (closed): the steps leave it out (:mod:`.capabilities`)."""
        return self.pair.lacks or frozenset()

    def _new_request(self) -> Request:
        self.counter += 1
        return random_request(self.rng, self.documents, self.hasher, f"r{self.counter}", self.cfg.extra_keys,
                              self.lacks)

    def _hashes(self, req: Request, group: int) -> Any:
        return hashes_at(req, self.cfg.hash_block_size, self.cfg.block_sizes[group])

    def _cache(self, run: Running, group: int) -> None:
        """Index what filled up, then maybe the partial entry of the last whole chunk.

        Now and then under a block mask, as vLLM's sliding-window and Mamba
        managers skip blocks no hit can reach.  The mask keeps the range's
        last block (the tail a hit at the current end needs), so the parent
        the next call's ``BlockStored`` names was announced.
        """
        if not self.cfg.caching:
            return
        bs = self.cfg.block_sizes[group]
        req = run.request
        full = req.num_tokens // bs
        new = full - run.cached[group]
        mask = ([self.rng.random() < 0.6 for _ in range(new - 1)] + [True]
                if new > 1 and self.rng.random() < 0.15 else None)
        if "mask" in self.lacks:
            mask = None
        made = self.pair.maybe("cache_full_blocks", req, run.tables[group], run.cached[group], full, bs,
                               group, *([mask] if mask is not None else []))
        if made is not SKIPPED:
            run.cached[group] = max(run.cached[group], full)
        if self.rng.random() < 0.75:
            self._partial_last(run, group)

    def _partial_last(self, run: Running, group: int) -> None:
        """A partial entry where the request's last whole hash chunk ends, as the engine makes it.

        Inside a block always; at a block's end only under vLLM 0.33, or with
        ``replace_existing_hashes`` when the block is the request's alone to
        write (its owner re-registers what it rewrote).
        """
        hbs, bs = self.cfg.hash_block_size, self.cfg.block_sizes[group]
        upto = (run.request.num_tokens // hbs) * hbs
        if not upto:
            return
        block = run.tables[group][(upto - 1) // bs]
        replace = writable(self.pair, block) and self.rng.random() < 0.2
        if upto % bs or replace or self.pair.model.boundary_partials:
            self.pair.maybe("cache_partial_block", run.request, block, upto, group, bs,
                            *([True] if replace else []))  # replace_existing_hashes, shown in traces

    def _grow(self, run: Running, group: int) -> bool:
        bs = self.cfg.block_sizes[group]
        need = -(-run.request.num_tokens // bs) - len(run.tables[group])
        if need <= 0:
            return True
        got = self.pair.maybe("get_new_blocks", need)
        if got is SKIPPED or isinstance(got, Refusal):
            return False
        run.tables[group].extend(got)
        self.seen.extend(got)
        return True

    def scope(self) -> Sequence[int]:
        """The blocks a step picks among, in id order: every block of a pool of at most
        :data:`SCAN_LIMIT` blocks; of a larger one, those handed out, hit or released lately."""
        n = self.pair.model.num_blocks
        return range(n) if n <= SCAN_LIMIT else sorted(set(self.seen))

    def _held(self) -> list[int]:
        """Real blocks in use (ref > 0), in :meth:`scope`."""
        m = self.pair.model
        return [b for b in self.scope() if b != NULL and m.ref[b] > 0]

    # ---------------------------------------------------------------- steps

    def lookup(self, req: Request, group: int) -> list[int]:
        """The prefix-cache hits of ``req`` in ``group``, as vLLM's manager looks them up: block
        by block until a miss, short of the last token (which is always computed), and short of a
        block hit already (a key copied in by offload can name a block at a second position: one
        table holds a block once)."""
        bs = self.cfg.block_sizes[group]
        hits: list[int] = []
        if self.cfg.caching:
            for block_hash in self._hashes(req, group):
                found = self.pair.maybe("get_cached_block", block_hash, [group])
                if (found is None or found is SKIPPED or (len(hits) + 1) * bs >= req.num_tokens
                        or found[0] in hits):
                    break
                hits.extend(found)
        self.seen.extend(hits)
        return hits

    def admit(self, req: Request | None = None) -> Running | None:
        """A new request (``req``, or a random one): looked up, touched, allocated, cached; None
        when the pool ran dry (it is then released) or :data:`MAX_RUNNING` are in flight."""
        if len(self.running) >= MAX_RUNNING:
            return None
        req = req or self._new_request()
        run = Running(req, {}, {})
        for group, bs in self.cfg.block_sizes.items():
            hits = self.lookup(req, group)
            window = min(self.rng.choice([0, 0, 0, 1, 2]), max(len(hits) - 1, 0))
            if "null_block" not in self.lacks:
                hits[:window] = [NULL] * window  # a sliding-window hit: blocks out of the window are null
            if not self.pair.can("touch", hits):
                hits = []  # hits the pool cannot take (an idle one, a watched one): computed again
            self.pair.call("touch", hits)
            run.tables[group] = hits
            run.cached[group] = len(hits)
            if self.rng.random() < 0.5:  # events off or no hits: nothing to announce, still legal
                self.pair.maybe("emit_cached_block_events", req, len(hits), bs, group)
            if not self._grow(run, group):
                self._release(run, unpin=False)
                return None
            self._cache(run, group)
        self.running[req.request_id] = run
        return run

    def decode(self) -> None:
        if not self.running:
            return
        self._decode(self.running[self.rng.choice(list(self.running))])

    def _decode(self, run: Running) -> None:
        """One decode step of ``run``: new tokens, new blocks, caching; preempted when the pool is dry."""
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
            self.seen.extend(blocks)
            pinned = [b for b in blocks if b != NULL]  # a reader keeps the real blocks, not placeholders
            watcher = self.pair.watcher(run.request.request_id)
            if unpin and self.pair.can("unpin_blocks", pinned, watcher):
                self.pair.call("unpin_blocks", pinned, watcher)
            else:
                self.pair.maybe("free_blocks", blocks)

    def slide(self) -> None:
        """Sliding-window attention: blocks that left the window become the null block.

        vLLM's sliding-window manager frees them and keeps the null block in
        their place, so later frees of the table include the null block.
        """
        candidates = [(run, g) for run in self.running.values() for g, t in run.tables.items()
                      if len(t) > 2]
        if not candidates or "null_block" in self.lacks:
            return
        run, group = self.rng.choice(candidates)
        table = run.tables[group]
        cut = self.rng.randint(1, len(table) - 2)
        gone = [b for b in table[:cut] if b != NULL]
        table[:cut] = [NULL] * cut
        if gone:
            self.pair.call("free_blocks", list(reversed(gone)))

    def move(self) -> None:
        """Copy-on-write: a request's block is copied and its hashes move to the copy.

        Mostly a hashed block (vLLM copies the block of a partial hit, anywhere
        in the table); now and then the last block without hashes, which moves nothing.
        """
        model = self.pair.model
        hashed = [
            b for run in self.running.values() for t in run.tables.values() for b in t
            if b != NULL and model.primary[b] is not None]
        unhashed = [
            t[-1] for run in self.running.values() for t in run.tables.values()
            if t and t[-1] != NULL and model.primary[t[-1]] is None]
        candidates = unhashed if unhashed and (not hashed or self.rng.random() < 0.2) else hashed
        if not candidates:
            return
        source = self.rng.choice(candidates)
        got = self.pair.maybe("get_new_blocks", 1)
        if got is SKIPPED or isinstance(got, Refusal):
            return
        self.pair.maybe("move_block_hashes", source, got[0])
        self.copies.append(got[0])
        self.seen.append(got[0])

    def offload(self) -> None:
        """vLLM's CPU offload pool: a fresh block receives a copy of KV that another pool cached.

        It is indexed under that pool's keys: the key of a prefix of a running
        request (any prefix: the other pool cached it, this one need not have),
        as primary with its token count, then now and then a shorter prefix's
        key as a secondary, or the same key again (which changes nothing).
        """
        if not self.cfg.caching or not self.running or not self.pair.supports("_insert_block_hash"):
            return
        run = self.rng.choice(list(self.running.values()))
        hbs, group = self.cfg.hash_block_size, self.rng.choice(list(self.cfg.block_sizes))
        chunks = len(run.request.block_hashes)
        if not chunks:
            return
        got = self.pair.maybe("get_new_blocks", 1)
        if got is SKIPPED or isinstance(got, Refusal):
            return
        upto = hbs * self.rng.randint(1, chunks)
        self.pair.maybe("_insert_block_hash", run.request, upto, group, got[0], upto)
        if self.rng.random() < 0.5:
            again = hbs * self.rng.randint(1, upto // hbs)
            self.pair.maybe("_insert_block_hash", run.request, again, group, got[0], None)
        self.copies.append(got[0])
        self.seen.append(got[0])

    def drop_copies(self) -> None:
        if self.pair.maybe("free_blocks", self.copies) is not SKIPPED:
            self.copies = []

    def share(self) -> None:
        """A holder that lists one block several times, as a sliding-window table with offloading does.

        It takes two or three references in one ``touch`` and drops them all
        in one ``free_blocks`` (or one ``unpin_blocks``, for a reader) later:
        legal, and the shape in which a pool that queues a block once per
        listing corrupts its free queue.
        """
        if self.shared:
            sharer = self.pair.watcher("sharer")
            if self.rng.random() < 0.3 and self.pair.can("unpin_blocks", self.shared, sharer):
                self.pair.call("unpin_blocks", self.shared, sharer)
            else:
                self.pair.maybe("free_blocks", self.shared)
            self.shared = []
            return
        if "listed_twice" in self.lacks:
            return
        m = self.pair.model
        pick = [b for b in self.scope() if b != NULL and (m.ref[b] > 0 or m.primary[b] is not None)]
        if pick:
            b = self.rng.choice(pick)
            self.shared = [b] * self.rng.choice([2, 2, 3])
            self.pair.call("touch", self.shared)

    def partial_inside(self) -> None:
        """A partial entry at any chunk boundary of a request's blocks, up to what it has written.

        A block cached further keeps its primary key and gains a secondary
        one (the shape that eviction, promotion and moves must treat as a
        whole); the last, partly written block gains an entry shorter than
        its own, or its first; at a position a block already names, nothing
        changes.  Any boundary inside a block, and its end under vLLM 0.33;
        now and then registered twice.
        """
        if not self.cfg.caching:
            return
        boundary = self.pair.model.boundary_partials
        options = [(run, g, spot) for run in self.running.values() for g in run.tables
                   for spot in partial_spots(run, g, self.cfg, boundary)]
        if not options:
            return
        run, group, (i, tokens) = self.rng.choice(options)
        for _ in range(self.rng.choice([1, 1, 2])):  # registered again: no change, no second event
            self.pair.maybe("cache_partial_block", run.request, run.tables[group][i], tokens, group,
                            self.cfg.block_sizes[group])

    def rewrite(self) -> None:
        """A request rewrote a block it alone holds and registers it with ``replace_existing_hashes``.

        The block is its sole owner's (entries it had are evicted first, so it
        is writable) and the entry ends at any chunk boundary of what the
        request has written into it, the block's end included.
        """
        if not self.cfg.caching:
            return
        options = [(run, group, spot) for run in self.running.values() for group in run.tables
                   for spot in rewritable(self.pair, run, group, self.cfg)]
        if not options:
            return
        run, group, (i, chunks) = self.rng.choice(options)
        rekey(self.pair, run, group, self.cfg, i, self.rng.randint(1, chunks))

    def sparse(self) -> None:
        """vLLM's sparse-attention coordinator asks to cache fewer blocks than are cached: a no-op."""
        options = [(run, g) for run in self.running.values() for g, n in run.cached.items() if n > 0]
        if not options:
            return
        run, group = self.rng.choice(options)
        cached = run.cached[group]
        self.pair.maybe("cache_full_blocks", run.request, run.tables[group], cached,
                        self.rng.randrange(cached), self.cfg.block_sizes[group], group)

    def placeholders(self) -> None:
        """Null placeholders (sliding window) offered for caching: skipped, never hashed.

        In the range of ``cache_full_blocks``, or as the block of a partial
        entry (which registers nothing and returns ``None``).
        """
        req = self._new_request()
        bs = self.cfg.block_sizes[0]
        if self.rng.random() < 0.3 and req.block_hashes:
            self.pair.maybe("cache_partial_block", req, NULL, self.cfg.hash_block_size, 0, bs)
            return
        if not self.cfg.caching:
            return
        n = min(self.rng.randint(1, 3), len(self._hashes(req, 0)))
        self.pair.maybe("cache_full_blocks", req, [NULL] * n, 0, n, bs, 0)

    def other_pool(self) -> None:
        """Blocks of a second pool of the same class, freed through this one.

        An engine with several pools frees a table through one of them, and
        each pool takes back its own.  First take one to three blocks there
        (cached under a request now and then, so they rejoin the tail of
        their queue; one of them referenced twice now and then, so it is
        listed twice); next time free them through this pool, alone or
        mixed with this pool's own copies, in any order.
        """
        if self.second is None:
            return
        other = self.other = self.other or self.second()
        if self.theirs:
            listed = [(other, b) for b in self.theirs]
            if self.copies and self.rng.random() < 0.5:
                listed += [(self.pair, b) for b in self.copies]
                self.copies = []
                self.rng.shuffle(listed)
            self.theirs = []
            free_across(self.pair, other, listed)
            return
        got = other.maybe("get_new_blocks", self.rng.randint(1, 3))
        if got is SKIPPED or isinstance(got, Refusal):
            return
        if self.cfg.caching and self.rng.random() < 0.5:
            req = self._new_request()
            bs = self.cfg.block_sizes[0]
            other.maybe("cache_full_blocks", req, got, 0, min(len(got), req.num_tokens // bs), bs, 0)
        if self.rng.random() < 0.3 and "listed_twice" not in self.lacks and other.can("touch", got[:1]):
            other.call("touch", got[:1])
            got = got + got[:1]
        self.theirs = got

    def evict(self) -> None:
        m = self.pair.model
        hashed = [b for b in self.scope() if m.primary[b] is not None]
        if hashed and self.rng.random() < 0.5:
            ids = self.rng.sample(hashed, k=min(len(hashed), self.rng.randint(1, 2)))
        else:
            ids = self.rng.sample(range(self.cfg.num_blocks), k=self.rng.randint(0, 3)
                                  if self.cfg.num_blocks > 3 else 1)
        if (len(ids) == 1 and self.rng.random() < 0.5 and self.pair.supports("_maybe_evict_cached_block")
                and self.pair.can("_maybe_evict_cached_block", ids[0])):
            self.pair.maybe("_maybe_evict_cached_block", ids[0])  # vLLM's checkpointed-state manager
        else:
            self.pair.maybe("evict_blocks", ids)

    def reset(self) -> None:
        if self.rng.random() < 0.5:
            for rid in list(self.running):
                self._release(self.running.pop(rid), unpin=False)
            self.drop_copies()
            if self.shared:
                self.share()  # releases the block it holds several times
        self.pair.maybe("reset_prefix_cache")

    def query(self) -> None:
        self.pair.maybe("get_usage")
        self.pair.call("get_num_free_blocks")
        self.pair.call("is_block_writable", self.rng.randrange(self.cfg.num_blocks))

    def take(self) -> None:
        self.pair.maybe("take_events")

    def misuse(self) -> None:
        """A deliberately wrong call, of a kind drawn among :data:`.misuse.MISUSES`."""
        wrong_call(self)

    def default(self) -> None:
        """A call of an operation no step here makes, drawn from its arguments' kinds (:mod:`.defaults`)."""
        ops, dice = self._defaults()
        if ops:
            default_call(self.pair, dice.choice(ops), dice.choice, self._new_request(),
                         list(self.cfg.block_sizes), self.misuse_on)

    def _defaults(self) -> tuple[list[str], random.Random]:
        """The pool's operations no step calls, and the dice that call them: seeded from the steps'
        dice without rolling them, so that those fall as they would without them."""
        if self.default_dice is None:
            self.defaulted = [name for name in unwritten() if self.pair.supports(name)]
            self.default_dice = random.Random(repr(self.rng.getstate()))
        return self.defaulted, self.default_dice

    STEPS: tuple[tuple[str, float], ...] = (
             ("admit", 6), ("decode", 8), ("finish", 4), ("slide", 1), ("move", 1),
             ("drop_copies", 1), ("share", 1), ("partial_inside", 1), ("rewrite", 1), ("sparse", 1),
             ("placeholders", 1), ("other_pool", 1), ("offload", 1), ("evict", 1), ("reset", 1), ("query", 2),
             ("take", 6), ("misuse", 3))

    def step(self) -> str:
        """One step, drawn by :attr:`STEPS`' weights (or, when the pool has an operation no step
        calls, now and then :meth:`default`).

        On a pool larger than :data:`SCAN_LIMIT` a reset is rarer in proportion: it
        costs the pool (and the model's footprint) every block it indexes, so
        that a call costs the same on average on any pool size.
        """
        ops, dice = self._defaults()
        if ops and dice.random() < DEFAULT_SHARE:
            self.default()
            return "default"
        steps: list[tuple[str, float]] = [x for x in self.STEPS if self.misuse_on or x[0] != "misuse"]
        scale = min(1.0, SCAN_LIMIT / self.pair.model.num_blocks)
        if scale < 1:
            steps = [(n, w * scale if n == "reset" else w) for n, w in steps]
        names, weights = zip(*steps, strict=True)
        name: str = self.rng.choices(names, weights)[0]
        getattr(self, name)()
        return name
