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
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import OPERATIONS, QUERIES, Refusal
from kvpool.model.request import hashes_at
from kvpool.model.state import NULL

from ..core.abstraction import refusal_name
from ..core.lockstep import CallRecord, Lockstep
from .features import call_features

SCAN_LIMIT = 256
"""Pools up to this size are scanned whole when a step picks blocks; on a larger pool a step
picks among the blocks the workload handled lately (:meth:`Workload.scope`), so that it costs
the same however large the pool is."""
MAX_RUNNING = 24
"""Requests in flight at most (an engine's ``max_num_seqs``).  A pool of the default shapes (at
most 24 blocks) never holds this many, each request holding a block it allocated itself; an
engine-sized one would otherwise admit requests without end."""
SECOND_POOL_BLOCKS = 64
"""The second pool's size at most: blocks of another pool need not be as many as this pool's."""


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


def second_pool(pool_factory: Callable[..., Any], cfg: RunConfig, reference: str,
                errors_match: Callable[[Exception, Exception | None], bool]) -> Callable[[], Lockstep]:
    """How a run builds its second pool: the same class and shape, with its own model."""

    def build() -> Lockstep:
        pair = Lockstep.fresh(pool_factory, min(cfg.num_blocks, SECOND_POOL_BLOCKS), cfg.caching,
                              cfg.hash_block_size, cfg.events, reference, metrics=cfg.metrics)
        pair.errors_match = errors_match
        pair.which = 1
        return pair

    return build


def free_across(first: Lockstep, second: Lockstep, listed: list[tuple[Lockstep, int]]) -> None:
    """One ``free_blocks`` on the first pool listing blocks of both pools, in ``listed`` order.

    vLLM's ``free_blocks`` hands a block of another pool back to that pool.
    :class:`Lockstep` names blocks by id within one pool, so this call is
    checked here: the first model frees the first pool's ids, the second
    model the second's (each in listed order); a refusal by either model (a
    double free) must be the pool's refusal with neither pool changed.
    Then each pool is compared with its model as after any call (the footprint; the whole
    pool when due).
    """
    free = OPERATIONS["free_blocks"]
    mine, theirs = [b for p, b in listed if p is first], [b for p, b in listed if p is second]
    shape = None if first.features is None else call_features(
        first.model, "free_blocks", (mine,), second=True, metrics=first.metrics is not None)
    footprints = [(pair, free.footprint(pair.model, ids)) for pair, ids in ((first, mine), (second, theirs))]
    noted = [(pair, fp, pair._note(fp)) for pair, fp in footprints]
    m_error: Exception | None = None
    try:  # both guards first: a refusal by either changes neither model
        free.prepare(first.model, (mine,))
        free.prepare(second.model, (theirs,))
    except Refusal as exc:
        m_error = exc
    p_error: Exception | None = None
    try:
        first.pool.free_blocks([p.pool.blocks[b] for p, b in listed])
    except Exception as exc:
        p_error = exc
    first.steps += 1
    second.steps += 1
    if first.log is not None:
        first.log.add_across([(0 if p is first else 1, b) for p, b in listed])
    names = [str(b) if p is first else f"second:{b}" for p, b in listed]
    for pair in (first, second):  # either may be the one found to differ: both traces show the call
        pair.trace.append(CallRecord("free_blocks", (names,), refusal_name(m_error) if m_error else "None"))
    if (m_error is None) != (p_error is None) or (
            m_error is not None and not first.errors_match(m_error, p_error)):
        raise first._diverged("free_blocks", f"model raised {m_error!r}, pool raised {p_error!r}",
                              ["refusal"])
    if m_error is None:
        free.next(first.model, mine)
        free.next(second.model, theirs)
        if shape is not None and first.features is not None:
            first.features.add(shape)
    for pair, fp, before in noted:  # as after any call: the footprint, the whole pool when due
        if pair.steps - pair.last_full >= (pair.full_every or 1):
            pair.check()
        else:
            pair._check_footprint("free_blocks", fp, before)


def partial_offsets(block_size: int, hash_block_size: int, boundary: bool) -> list[int]:
    """Where a partial entry may end, counted from its block's start.

    At every hash-chunk boundary inside the block; at the block's end too
    when the reference allows block-boundary partials (vLLM 0.33).
    """
    inside = list(range(hash_block_size, block_size, hash_block_size))
    return [*inside, block_size] if boundary else inside


def partial_spots(run: Running, group: int, cfg: RunConfig, boundary: bool) -> list[tuple[int, int]]:
    """Every legal partial entry of a request's blocks in ``group``: (table index, tokens).

    At each chunk boundary (:func:`partial_offsets`) of each real block, up
    to the last whole chunk the request has written: the entry names a
    prefix of what the block holds, so the block's contents stay as they are.
    """
    hbs, bs = cfg.hash_block_size, cfg.block_sizes[group]
    upto = (run.request.num_tokens // hbs) * hbs
    return [(i, i * bs + off) for i, b in enumerate(run.tables[group]) if b != NULL
            for off in partial_offsets(bs, hbs, boundary) if i * bs + off <= upto]


def rewritable(pair: Lockstep, run: Running, group: int, cfg: RunConfig) -> list[tuple[int, int]]:
    """The blocks of a request's table in ``group`` it alone holds: (table index, chunks it wrote there).

    Only these may be rewritten (re-keyed with ``replace_existing_hashes``):
    a write into a block is its sole owner's.
    """
    hbs, bs = cfg.hash_block_size, cfg.block_sizes[group]
    upto = (run.request.num_tokens // hbs) * hbs
    return [(i, (min(upto, (i + 1) * bs) - i * bs) // hbs) for i, b in enumerate(run.tables[group])
            if b != NULL and pair.model.ref[b] == 1 and i * bs < upto]


def rekey(pair: Lockstep, run: Running, group: int, cfg: RunConfig, i: int, chunks: int) -> None:
    """The request rewrote block ``i`` of its table up to ``chunks`` chunks in: re-key it.

    A block with hashes is not writable (the model's ``is_block_writable``),
    so its entries are evicted first, as vLLM does before it overwrites a
    state block; then ``replace_existing_hashes`` registers what it holds now.
    """
    block, bs = run.tables[group][i], cfg.block_sizes[group]
    if not writable(pair, block):
        pair.call("evict_blocks", [block])
    pair.call("cache_partial_block", run.request, block, i * bs + cfg.hash_block_size * chunks, group, bs,
              True)  # replace_existing_hashes, positional so that traces show it


def writable(pair: Lockstep, block: int) -> bool:
    """Whether the model says the block's sole owner may write into it (ref 1, no hash)."""
    result: bool = QUERIES["is_block_writable"](pair.model, block)
    return result


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

    def __post_init__(self) -> None:
        self.documents = [[self.rng.randrange(50) for _ in range(48)] for _ in range(3)]
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
            if self.rng.random() < 0.25 and len(tokens) > 1:
                kw["mm_features"] = self._images(len(tokens))
        return Request(f"r{self.counter}", tokens, block_hasher=self.hasher,
                       session_id=self.rng.choice([None, "sess"]), **kw)

    def _images(self, num_tokens: int) -> list[MultiModalFeature]:
        """One to three multimodal items in the prompt, sorted by offset, never overlapping.

        One to four tokens long, often adjacent: items shorter than a hash
        chunk, several items in one chunk, and chunks that cut an item.
        """
        items: list[MultiModalFeature] = []
        at = self.rng.randrange(num_tokens - 1)
        for _ in range(self.rng.randint(1, 3)):
            size = self.rng.randint(1, 4)
            if at + size > num_tokens:
                break
            items.append(MultiModalFeature(f"img{self.rng.randint(1, 2)}", PlaceholderRange(at, size)))
            at += size + self.rng.choice([0, 0, 1, 3])
        return items

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
        self.pair.call("cache_full_blocks", req, run.tables[group], run.cached[group], full, bs, group,
                       *([mask] if mask is not None else []))
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
            self.pair.call("cache_partial_block", run.request, block, upto, group, bs,
                           *([True] if replace else []))  # replace_existing_hashes, shown in traces

    def _grow(self, run: Running, group: int) -> bool:
        bs = self.cfg.block_sizes[group]
        need = -(-run.request.num_tokens // bs) - len(run.tables[group])
        if need <= 0:
            return True
        got = self.pair.call("get_new_blocks", need)
        if isinstance(got, Refusal):
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
        by block until a miss, short of the last token (which is always computed)."""
        bs = self.cfg.block_sizes[group]
        hits: list[int] = []
        if self.cfg.caching:
            for block_hash in self._hashes(req, group):
                found = self.pair.call("get_cached_block", block_hash, [group])
                if found is None or (len(hits) + 1) * bs >= req.num_tokens:
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
            hits[:window] = [NULL] * window  # a sliding-window hit: blocks out of the window are null
            self.pair.call("touch", hits)
            run.tables[group] = hits
            run.cached[group] = len(hits)
            if self.rng.random() < 0.5:  # events off or no hits: nothing to announce, still legal
                self.pair.call("emit_cached_block_events", req, len(hits), bs, group)
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
        got = self.pair.call("get_new_blocks", 1)
        if isinstance(got, Refusal):
            return
        self.pair.call("move_block_hashes", source, got[0])
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
        got = self.pair.call("get_new_blocks", 1)
        if isinstance(got, Refusal):
            return
        upto = hbs * self.rng.randint(1, chunks)
        self.pair.call("_insert_block_hash", run.request, upto, group, got[0], upto)
        if self.rng.random() < 0.5:
            again = hbs * self.rng.randint(1, upto // hbs)
            self.pair.call("_insert_block_hash", run.request, again, group, got[0], None)
        self.copies.append(got[0])
        self.seen.append(got[0])

    def drop_copies(self) -> None:
        self.pair.call("free_blocks", self.copies)
        self.copies = []

    def share(self) -> None:
        """A holder that lists one block several times, as a sliding-window table with offloading does.

        It takes two or three references in one ``touch`` and drops them all
        in one ``free_blocks`` (or one ``unpin_blocks``, for a reader) later:
        legal, and the shape in which a pool that queues a block once per
        listing corrupts its free queue.
        """
        if self.shared:
            if self.rng.random() < 0.3:
                self.pair.call("unpin_blocks", self.shared, self.pair.watcher("sharer"))
            else:
                self.pair.call("free_blocks", self.shared)
            self.shared = []
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
            self.pair.call("cache_partial_block", run.request, run.tables[group][i], tokens, group,
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
        self.pair.call("cache_full_blocks", run.request, run.tables[group], cached,
                       self.rng.randrange(cached), self.cfg.block_sizes[group], group)

    def placeholders(self) -> None:
        """Null placeholders (sliding window) offered for caching: skipped, never hashed.

        In the range of ``cache_full_blocks``, or as the block of a partial
        entry (which registers nothing and returns ``None``).
        """
        req = self._new_request()
        bs = self.cfg.block_sizes[0]
        if self.rng.random() < 0.3 and req.block_hashes:
            self.pair.call("cache_partial_block", req, NULL, self.cfg.hash_block_size, 0, bs)
            return
        if not self.cfg.caching:
            return
        n = min(self.rng.randint(1, 3), len(self._hashes(req, 0)))
        self.pair.call("cache_full_blocks", req, [NULL] * n, 0, n, bs, 0)

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
        got = other.call("get_new_blocks", self.rng.randint(1, 3))
        if isinstance(got, Refusal):
            return
        if self.cfg.caching and self.rng.random() < 0.5:
            req = self._new_request()
            bs = self.cfg.block_sizes[0]
            other.call("cache_full_blocks", req, got, 0, min(len(got), req.num_tokens // bs), bs, 0)
        if self.rng.random() < 0.3:
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
        if len(ids) == 1 and self.rng.random() < 0.5 and self.pair.supports("_maybe_evict_cached_block"):
            self.pair.call("_maybe_evict_cached_block", ids[0])  # vLLM's checkpointed-state manager
        else:
            self.pair.call("evict_blocks", ids)

    def reset(self) -> None:
        if self.rng.random() < 0.5:
            for rid in list(self.running):
                self._release(self.running.pop(rid), unpin=False)
            self.drop_copies()
            if self.shared:
                self.share()  # releases the block it holds several times
        self.pair.call("reset_prefix_cache")

    def query(self) -> None:
        self.pair.call("get_usage")
        self.pair.call("get_num_free_blocks")
        self.pair.call("is_block_writable", self.rng.randrange(self.cfg.num_blocks))

    def take(self) -> None:
        self.pair.call("take_events")

    # ---------------------------------------------------------------- misuse

    def misuse(self) -> None:
        """A deliberately wrong call; both sides must refuse it the same way (and change nothing).

        One per refusal of the model: unknown, idle, over-freed, null and
        foreign blocks; bad counts, group ids, block sizes, watchers, masks
        and lengths; hashes a request lacks; conflicting, disabled and
        misplaced cache entries.
        """
        m = self.pair.model
        scope = self.scope()
        idle = [b for b in scope if b != NULL and m.ref[b] == 0]
        used = self._held()
        unhashed = [b for b in scope if b != NULL and m.primary[b] is None] or [NULL]
        bs = self.cfg.block_sizes[0]
        cached_whole = [b for b in scope if (p := m.primary[b]) is not None and p.num_tokens >= bs]
        req = self._new_request()
        hbs = self.cfg.hash_block_size
        kind = self.rng.choice(self.MISUSES)
        if not self.cfg.caching and kind in self.CACHE_ENTRY_MISUSES:
            kind = "cache_disabled"  # a pool without caching refuses any cache entry as such
        call = self.pair.call
        if kind == "free_idle" and idle:
            call("free_blocks", [self.rng.choice(idle)])
        elif kind == "over_free" and used:
            b = self.rng.choice(used)
            call("free_blocks", [b] * (m.ref[b] + 1))
        elif kind == "unpin_null":
            call("unpin_blocks", [0], self.pair.watcher("bad"))
        elif kind == "touch_unknown":  # refused after taking earlier blocks: it must give them back
            call("touch", [*used[:1], *idle[-1:], m.num_blocks + self.rng.randint(0, 3)])
        elif kind == "bad_count":
            call("get_new_blocks", self.rng.choice([-1, len(m.free) + 1]))
        elif kind == "mask_length" and used:  # without caching: refused as disabled
            call("cache_full_blocks", req, [self.rng.choice(used)], 0, 1, bs, 0, [True, False])
        elif kind == "evict_unknown":
            call("evict_blocks", [self.rng.choice([-1, m.num_blocks])])
        elif kind == "move_onto_hashed" and used:
            hashed = [b for b in scope if b != NULL and m.primary[b] is not None]
            if hashed:
                call("move_block_hashes", self.rng.choice(used), self.rng.choice(hashed))
        elif kind == "partial_bad_tokens" and used:
            call("cache_partial_block", req, self.rng.choice(used), self.rng.choice([0, -hbs]), 0, bs * 2)
        elif kind == "move_onto_null":
            hashed = [b for b in scope if b != NULL and m.primary[b] is not None]
            if hashed:
                call("move_block_hashes", self.rng.choice(hashed), NULL)
        elif kind == "bad_group":
            group, op = self.rng.choice([-1, 2**32]), self.rng.randrange(3)
            if op == 0:
                call("cache_full_blocks", req, used[:1], 0, 1, bs, group)
            elif op == 1:
                call("emit_cached_block_events", req, 0, bs, group)
            else:
                call("get_cached_block", b"\0" * 32, [0, group])
        elif kind == "bad_block_size":
            sizes = [0, -hbs] + ([hbs + 1] if hbs > 1 else [])  # not a positive multiple of hbs
            call("cache_full_blocks", req, used[:1], 0, 1, self.rng.choice(sizes), 0)
        elif kind == "uncallable_watcher" and used and not self.traceable_only:
            call("unpin_blocks", used[:1], None)
        elif kind == "full_beyond_list" and used:
            call("cache_full_blocks", req, used[:1], 0, 2, bs, 0)
        elif kind == "full_too_few_hashes":  # on an unhashed block: one fault per call
            call("cache_full_blocks", self._empty_request(), [self.rng.choice(unhashed)], 0, 1, bs, 0)
        elif kind == "partial_too_few_hashes":
            call("cache_partial_block", self._empty_request(), self.rng.choice(unhashed), hbs, 0, 2 * bs)
        elif kind == "emit_too_many":  # refused only with events on
            call("emit_cached_block_events", req, len(req.block_hashes) + 1, hbs, 0)
        elif kind == "cache_conflict" and cached_whole:
            self._cache_again(self.rng.choice(cached_whole))
        elif kind == "partial_at_block_end" and not m.boundary_partials:  # refused before it writes
            call("cache_partial_block", self._request_of(bs), self.rng.randrange(1, m.num_blocks), bs, 0, bs)
        elif kind == "cache_disabled":  # both would be legal on a pool with caching
            block = self.rng.randrange(1, m.num_blocks)
            call("cache_full_blocks", self._request_of(bs), [block], 0, 1, bs, 0)
            call("cache_partial_block", self._request_of(hbs), block, hbs, 0, 2 * hbs)
            if self.pair.supports("_insert_block_hash"):
                call("_insert_block_hash", self._request_of(hbs), hbs, 0, block, hbs)
        elif kind == "insert_bad" and self.pair.supports("_insert_block_hash"):
            # the null block, a primary key without its token count, a key naming no prefix
            for target, upto, tokens in ((NULL, hbs, hbs), (self.rng.choice(unhashed), hbs, None),
                                         (self.rng.choice(used or unhashed), 0, hbs)):
                call("_insert_block_hash", self._request_of(hbs), upto, 0, target, tokens)
        elif kind == "other_over_free" and self.theirs and self.other is not None:
            other, b = self.other, self.theirs[0]
            once_too_often = [(other, b)] * (other.model.ref[b] + 1)
            free_across(self.pair, other, [(self.pair, a) for a in used[:1]] + once_too_often)

    MISUSES = ("free_idle", "over_free", "unpin_null", "touch_unknown", "bad_count", "mask_length",
               "evict_unknown", "move_onto_hashed", "partial_bad_tokens", "move_onto_null", "bad_group",
               "bad_block_size", "uncallable_watcher", "full_beyond_list", "full_too_few_hashes",
               "partial_too_few_hashes", "emit_too_many", "cache_conflict", "partial_at_block_end",
               "insert_bad", "other_over_free")
    """The kinds of deliberately wrong call, drawn uniformly."""
    CACHE_ENTRY_MISUSES = frozenset({"move_onto_hashed", "move_onto_null", "cache_conflict",
                                     "partial_at_block_end", "insert_bad"})
    """Kinds that need a pool with caching; without it they become ``cache_disabled``."""

    def _empty_request(self) -> Request:
        """A request without tokens, so without block hashes."""
        return self._request_of(0)

    def _request_of(self, num_tokens: int) -> Request:
        """A plain request reading the first ``num_tokens`` tokens of a document."""
        self.counter += 1
        return Request(f"r{self.counter}", self.documents[0][:num_tokens], block_hasher=self.hasher)

    def _cache_again(self, block: int) -> None:
        """Index a cached block again as a request's first block: it is cached at a prefix this long."""
        bs = self.cfg.block_sizes[0]
        self.pair.call("cache_full_blocks", self._request_of(bs), [block], 0, 1, bs, 0)

    STEPS: tuple[tuple[str, float], ...] = (
             ("admit", 6), ("decode", 8), ("finish", 4), ("slide", 1), ("move", 1),
             ("drop_copies", 1), ("share", 1), ("partial_inside", 1), ("rewrite", 1), ("sparse", 1),
             ("placeholders", 1), ("other_pool", 1), ("offload", 1), ("evict", 1), ("reset", 1), ("query", 2),
             ("take", 6), ("misuse", 3))

    def step(self) -> str:
        """One step, drawn by :attr:`STEPS`' weights.

        On a pool larger than :data:`SCAN_LIMIT` a reset is rarer in proportion: it
        costs the pool (and the model's footprint) every block it indexes, so
        that a call costs the same on average on any pool size.
        """
        steps: list[tuple[str, float]] = [x for x in self.STEPS if self.misuse_on or x[0] != "misuse"]
        scale = min(1.0, SCAN_LIMIT / self.pair.model.num_blocks)
        if scale < 1:
            steps = [(n, w * scale if n == "reset" else w) for n, w in steps]
        names, weights = zip(*steps, strict=True)
        name: str = self.rng.choices(names, weights)[0]
        getattr(self, name)()
        return name
