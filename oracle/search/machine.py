"""A Hypothesis state machine that drives the model and any pool in lockstep.

:func:`machine_for` builds a ``RuleBasedStateMachine`` for one
:class:`~kvpool.oracle.core.adapter.Adapter`.  Every call goes through a
:class:`~kvpool.oracle.core.lockstep.Lockstep`, which compares results, error
types, the whole observation, pending events and watcher firings, and checks
every model invariant after each call; the ``@invariant`` runs the same
check on the fresh pool (later states only arise through calls, each
checked as it happens).

Why dedicated rules rather than the random :class:`Workload`: Hypothesis can
only shrink and print what it draws as rule arguments.  A rule that draws a
seed and lets ``Workload`` roll dice prints ``admit(seed=83412)``, which says
nothing; here each rule names its inputs (which document a prompt reads,
how long it is, its LoRA/salt/image, whether to look up the cache, to cache a
partial block, which block mask), so the shrunk failure reads as a
scenario.  The bookkeeping that does not involve choices is reused from
``Workload`` (its documents, block hasher, hash resolution, growing a block
table, releasing a request) and from ``Running`` / ``RunConfig``.

Realistic inputs: prompts take prefixes of two fixed documents, requests
are served and finished between steps, finished conversations go on with a
follow-up turn and live ones are sampled again (parallel sampling), so
lookups hit (idle blocks and blocks in use); one or two KV-cache groups whose block size is a multiple of
``hash_block_size``; LoRA, cache-salt, session and multimodal extra keys
(several items, short or adjacent, several in one chunk); partial-block
entries at every chunk boundary (and, under vLLM 0.33, at a block's end),
their promotion when the block fills, their re-registration with
``replace_existing_hashes`` by a block's sole owner; block masks;
``cache_full_blocks`` asked for fewer blocks than are cached;
sliding-window placeholders (the null block) in block tables and as the
block of a partial entry; copy-on-write hash moves, of unhashed blocks too;
one block listed several times in one ``touch``, ``free_blocks`` or
``unpin_blocks``; unpinned blocks with named reuse watchers; evictions;
resets with and without blocks in use; events on or off; blocks of a second
pool of the same implementation (ids overlapping the first's), freed through
the first pool alone or mixed with its own blocks, as vLLM's ``free_blocks``
allows: each pool takes back its own.  Every call keeps to the model's caller
contracts, so a correct pool never diverges.  Misuse rules (only when the
adapter refuses misuse) make wrong calls the model refuses, one per refusal,
and compare error types, among them double frees of a second pool's blocks
through the first and the first pool's other operations on them (refused
like any block not of the pool: the model sees an id outside the pool, as
:class:`Lockstep`'s ``foreign`` block).

Use it from pytest as ``TestMyPool = machine_for(my_adapter).TestCase``, or
through ``kvpool conform`` (:mod:`kvpool.oracle.search.conform`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model import Refusal
from kvpool.model.state import NULL

from ..core.adapter import Adapter, adapter_factory
from ..core.lockstep import Lockstep
from ..generate.directed import SCENARIOS, Directed
from ..generate.entries import partial_spots, rekey, rewritable
from ..generate.features import FEATURES as FEATURE_NAMES
from ..generate.features import FeatureLog
from ..generate.runs import RunConfig, Running
from ..generate.two_pools import free_across
from ..generate.workload import Workload

LORA_IDS = {"lora1": 1, "lora2": 2}
MISUSES = (
    "free_idle", "over_free", "unpin_idle", "unpin_null", "touch_unknown", "too_many",
    "negative_count", "mask_length", "evict_unknown", "move_onto_hashed", "move_onto_null",
    "partial_bad_tokens", "cache_disabled", "insert_null", "insert_unnamed", "insert_no_tokens",
)
"""Deliberately wrong calls; the model refuses each with a typed error."""
CACHE_ENTRY_MISUSES = frozenset({"move_onto_hashed", "move_onto_null", "insert_null", "insert_unnamed",
                                 "insert_no_tokens"})
"""Kinds that need a pool with caching; without it they become ``cache_disabled``."""
ARGUMENT_MISUSES = (
    "bad_group", "bad_block_size", "uncallable_watcher", "full_beyond_list", "full_too_few_hashes",
    "cache_conflict", "partial_at_block_end", "partial_too_few_hashes", "emit_too_many",
)
"""Calls with one bad argument or a cache entry the model refuses; one fault each."""
OTHER_POOL_MISUSES = ("other_over_free", "other_touch", "other_unpin", "other_writable", "other_move")
"""Deliberately wrong calls on the first pool with a block of the second."""


@dataclass(frozen=True)
class Prompt:
    """What a request reads: a prefix of a document, a tail, and extra keys."""

    doc: int
    length: int
    tail: tuple[int, ...] = ()
    lora: str | None = None
    salt: str | None = None
    images: tuple[tuple[int, int], ...] = ()
    """Multimodal items in order, each as (gap after the previous one, length): gap 0 is adjacent."""
    session: str | None = None

    def features(self, num_tokens: int) -> list[MultiModalFeature]:
        """The items that fit in the prompt, as vLLM lists them (sorted by offset)."""
        out: list[MultiModalFeature] = []
        at = 0
        for k, (gap, length) in enumerate(self.images):
            at += gap
            if at + length > num_tokens:
                break
            out.append(MultiModalFeature(f"img{k}", PlaceholderRange(at, length)))
            at += length
        return out


@dataclass
class Table:
    """Blocks held without a request (scratch space, copies made by a hash move)."""

    ids: list[int]
    live: bool = True


@st.composite
def configs(draw: st.DrawFn) -> RunConfig:
    """Pool shapes; they shrink towards one small group with caching on."""
    hbs = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.integers(1, 2))
    sizes = {g: hbs * draw(st.integers(1, 4)) for g in range(groups)}
    caching = draw(st.integers(0, 4)) < 4  # mostly on: most of the pool is about caching
    return RunConfig(num_blocks=draw(st.integers(2, 24)), caching=caching,
                  hash_block_size=hbs, block_sizes=sizes, events=draw(st.booleans()),
                  extra_keys=True, metrics=draw(st.booleans()))


skips = st.integers(0, 3).map(lambda i: i == 3)
"""Whether an engine step leaves out its partial entry: now and then (the entry is the common case,
and the next step's entry replacing it needs two steps in a row that make one)."""

_NO_MASK = st.none()
_MASK = st.lists(st.booleans(), min_size=1, max_size=3).map(tuple)
masks = st.integers(0, 3).flatmap(lambda i: _NO_MASK if i < 3 else _MASK)
"""Mostly no mask: a masked-out block breaks the chain that later hits follow.

(The two branches are built once: a strategy built per draw is validated per draw.)"""

_NO_IMAGES: st.SearchStrategy[tuple[tuple[int, int], ...]] = st.just(())
_IMAGES = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=3).map(tuple)
images = st.integers(0, 2).flatmap(lambda i: _NO_IMAGES if i < 2 else _IMAGES)
"""Mostly none; else one to three items, often adjacent or shorter than a hash chunk."""

prompts = st.builds(
    Prompt,
    doc=st.integers(0, 1),
    length=st.integers(1, 32),
    tail=st.lists(st.integers(0, 49), max_size=2).map(tuple),
    lora=st.integers(0, 5).map(lambda i: (None, "lora1", "lora2")[max(0, i - 3)]),
    salt=st.integers(0, 3).map(lambda i: "s1" if i == 3 else None),
    images=images,
    session=st.integers(0, 3).map(lambda i: "sess" if i == 3 else None),
)
"""Prefixes of two documents, so requests share prefixes; extra keys now and then."""


class PoolMachine(RuleBasedStateMachine):
    """The rules; :func:`machine_for` binds an adapter in a subclass."""

    ADAPTER: ClassVar[Adapter]
    MISUSE: ClassVar[bool] = False
    REFERENCE: ClassVar[str] = "0.31"
    FEATURES: ClassVar[FeatureLog | None] = None
    """Where the calls' shape features go, over all examples (:mod:`.features`; None: nowhere)."""

    runs = Bundle("runs")
    """Requests in flight, each with its block table per KV-cache group."""
    finished = Bundle("finished")
    """Finished requests, whose conversation may go on (see ``follow_up``)."""
    tables = Bundle("tables")
    """Blocks allocated outside any request."""
    others = Bundle("others")
    """Blocks of the second pool, held to be freed through the first."""

    cfg: RunConfig
    work: Workload

    def __init__(self) -> None:
        super().__init__()
        self.pair: Lockstep | None = None
        self.other: Lockstep | None = None
        self.live: dict[str, Running] = {}
        self.held: list[Table] = []
        self.counter = 0

    # ------------------------------------------------------------ helpers

    @property
    def lock(self) -> Lockstep:
        assert self.pair is not None, "setup runs first"
        return self.pair

    def _request(self, prompt: Prompt) -> Request:
        self.counter += 1
        tokens = self.work.documents[prompt.doc][: prompt.length] + list(prompt.tail)
        kw: dict[str, Any] = {}
        if prompt.lora:
            kw["lora_request"] = LoRARequest(prompt.lora, LORA_IDS[prompt.lora], "/a")
        if prompt.salt:
            kw["cache_salt"] = prompt.salt
        return Request(f"r{self.counter}", tokens, block_hasher=self.work.hasher,
                       mm_features=prompt.features(len(tokens)), session_id=prompt.session, **kw)

    def _alive(self, run: Running) -> bool:
        return self.live.get(run.request.request_id) is run

    def _cache(self, run: Running, group: int, skip_partial: bool,
               mask: tuple[bool, ...] | None) -> None:
        """Index what filled up, and (unless skipped) the partial last block.

        Like the engine after each step: when ``hash_block_size`` is smaller
        than the block size, the prefix that ends inside the last block is
        made reachable too, and promoted when the block fills; under vLLM
        0.33 also a prefix that ends at a block's end.
        """
        cfg, req = self.cfg, run.request
        bs = cfg.block_sizes[group]
        full = req.num_tokens // bs
        if not cfg.caching:
            return
        new = full - run.cached[group]
        args: list[Any] = [req, run.tables[group], run.cached[group], full, bs, group]
        if mask is not None and new > 0:
            args.append([mask[i % len(mask)] for i in range(new)])
        self.lock.call("cache_full_blocks", *args)
        run.cached[group] = max(run.cached[group], full)
        upto = (req.num_tokens // cfg.hash_block_size) * cfg.hash_block_size
        if not skip_partial and upto and (upto % bs or self.lock.model.boundary_partials):
            self.lock.call("cache_partial_block", req, run.tables[group][(upto - 1) // bs], upto,
                           group, bs)

    def _slide(self, run: Running, group: int, cut: int) -> None:
        """Sliding window: cached blocks before ``cut`` are freed and become the null block."""
        table = run.tables[group]
        limit = len(table) - 1
        if self.cfg.caching:
            limit = min(limit, run.cached[group])
        cut = min(cut, limit)
        gone = [b for b in table[:cut] if b != NULL]
        if cut > 0 and gone:
            table[:cut] = [NULL] * cut
            self.lock.call("free_blocks", list(reversed(gone)))

    def _drop(self, run: Running) -> None:
        self.live.pop(run.request.request_id, None)
        self.work._release(run, unpin=False)

    def _cached_blocks(self) -> list[int]:
        return [b for b, p in enumerate(self.lock.model.primary) if p is not None]

    def _any_cached(self) -> bool:
        return self.pair is not None and any(p is not None for p in self.pair.model.primary)

    def _second(self) -> Lockstep:
        """The second pool and its own model, shaped like the first; built on first use."""
        if self.other is None:
            cfg = self.cfg
            pair = Lockstep.fresh(adapter_factory(self.ADAPTER), cfg.num_blocks, cfg.caching,
                                  cfg.hash_block_size, cfg.events, self.REFERENCE, metrics=cfg.metrics)
            pair.errors_match = self.ADAPTER.errors_match
            pair.observe = getattr(self.ADAPTER, "observe", None)
            pair.which, pair.features = 1, self.FEATURES
            pair.check()
            self.other = pair
        return self.other

    def _free_across(self, mine: list[int], theirs: list[int], interleave: bool) -> None:
        """One ``free_blocks`` on the first pool listing blocks of both pools (``workload.free_across``)."""
        first, second = self.lock, self._second()
        listed = [(first, b) for b in mine] + [(second, b) for b in theirs]
        if interleave:
            listed = listed[1::2] + listed[::2]
        free_across(first, second, listed)

    # -------------------------------------------------------------- rules

    @initialize(cfg=configs())
    def setup(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        pair = Lockstep.fresh(adapter_factory(self.ADAPTER), cfg.num_blocks, cfg.caching,
                              cfg.hash_block_size, cfg.events, self.REFERENCE, metrics=cfg.metrics)
        pair.errors_match = self.ADAPTER.errors_match
        pair.observe = getattr(self.ADAPTER, "observe", None)
        pair.features = self.FEATURES
        self.pair = pair
        # Fixed documents and hasher; this Workload's dice are never rolled.
        self.work = Workload(random.Random(0), cfg, pair, misuse_on=self.MISUSE, second=self._second)

    @rule(target=finished, prompt=prompts)
    def served(self, prompt: Prompt) -> Any:
        """A short request admitted and finished at once: its prefix stays cached and idle.

        Later requests hit it (touching idle blocks, announcing hits) and
        ``follow_up`` continues the conversation.
        """
        run = self._admit(self._request(self._fitted(prompt)), False, False, False, None, 0)
        if not isinstance(run, Running):
            return multiple()
        self._drop(run)
        return run

    @rule(target=runs, prompt=prompts, skip_lookup=st.booleans(), emit=st.booleans(),
          skip_partial=skips, mask=masks, window=st.integers(0, 2))
    def admit(self, prompt: Prompt, skip_lookup: bool, emit: bool, skip_partial: bool,
              mask: tuple[bool, ...] | None, window: int) -> Any:
        """Schedule a new request: look up its prefix, touch the hits, allocate, cache.

        ``window`` leading hits become the null block, as a sliding-window
        manager does for blocks that left the window; ``emit`` announces the
        hits to event consumers.  A prompt is cut to half of what the pool
        holds, as a scheduler admits no request the pool cannot hold (a
        small pool still runs dry, with several requests).
        """
        return self._admit(self._request(self._fitted(prompt)), skip_lookup, emit, skip_partial, mask,
                           window)

    def _fitted(self, prompt: Prompt) -> Prompt:
        """``prompt`` cut to half the tokens the pool's real blocks hold in every group."""
        cfg = self.cfg
        per_group = (cfg.num_blocks - 1) // len(cfg.block_sizes)
        half = max(1, per_group * min(cfg.block_sizes.values()) // 2)
        return prompt if prompt.length <= half else replace(prompt, length=half)

    @rule(target=runs, run=consumes(finished), more=st.lists(st.integers(0, 49), max_size=4),
          skip_lookup=st.booleans(), emit=st.booleans(), skip_partial=skips, mask=masks,
          window=st.integers(0, 2))
    def follow_up(self, run: Running, more: list[int], skip_lookup: bool, emit: bool,
                  skip_partial: bool, mask: tuple[bool, ...] | None, window: int) -> Any:
        """The next turn of a finished conversation: its whole text plus ``more`` tokens.

        It hits what the finished request cached and what is still cached
        (decoded blocks and partial entries included), touching idle blocks;
        ``window`` leading hits are null placeholders (sliding window).
        """
        old = run.request
        self.counter += 1
        req = Request(f"r{self.counter}", [*old.all_token_ids, *more],
                      block_hasher=self.work.hasher, lora_request=old.lora_request,
                      cache_salt=old.cache_salt, mm_features=list(old.mm_features),
                      session_id=old.session_id)
        return self._admit(req, skip_lookup, emit, skip_partial, mask, window)

    @rule(target=runs, run=runs, more=st.lists(st.integers(0, 49), max_size=2), emit=st.booleans(),
          skip_partial=skips, window=st.integers(0, 2))
    def fork(self, run: Running, more: list[int], emit: bool, skip_partial: bool, window: int) -> Any:
        """Another sample of a live request's prompt (parallel sampling, n > 1).

        It reads the same text with the same extra keys, so it hits the
        blocks the first one cached while they are in use: both hold them.
        ``window`` leading hits are null placeholders (sliding window), so
        the null block is touched.
        """
        if not self._alive(run):
            return multiple()
        old = run.request
        self.counter += 1
        req = Request(f"r{self.counter}", [*old.all_token_ids, *more],
                      block_hasher=self.work.hasher, lora_request=old.lora_request,
                      cache_salt=old.cache_salt, mm_features=list(old.mm_features),
                      session_id=old.session_id)
        return self._admit(req, False, emit, skip_partial, None, window)

    def _admit(self, req: Request, skip_lookup: bool, emit: bool, skip_partial: bool,
               mask: tuple[bool, ...] | None, window: int) -> Any:
        run = Running(req, {}, {})
        for group, bs in self.cfg.block_sizes.items():
            hits: list[int] = []
            if not skip_lookup and self.cfg.caching:
                for block_hash in self.work._hashes(req, group):
                    found = self.lock.call("get_cached_block", block_hash, [group])
                    if found is None or (len(hits) + 1) * bs >= req.num_tokens:
                        break
                    hits.extend(found)
            cut = min(window, max(len(hits) - 1, 0))
            hits[:cut] = [NULL] * cut
            self.lock.call("touch", hits)
            run.tables[group] = hits
            run.cached[group] = len(hits)
            if emit:  # with no hits, or events off, there is nothing to announce
                self.lock.call("emit_cached_block_events", req, len(hits), bs, group)
            if not self.work._grow(run, group):
                self.work._release(run, unpin=False)
                return multiple()
            self._cache(run, group, skip_partial, mask)
        self.live[req.request_id] = run
        return run

    @rule(run=runs, tokens=st.lists(st.integers(0, 49), min_size=1, max_size=6),
          per_step=st.integers(1, 4), skip_partial=skips, mask=masks, slide=st.integers(0, 4))
    def decode(self, run: Running, tokens: list[int], per_step: int, skip_partial: bool,
               mask: tuple[bool, ...] | None, slide: int) -> None:
        """Engine steps: slide the window, then ``per_step`` tokens a step (append, grow, cache).

        ``slide`` above 2 frees ``slide - 2`` leading blocks (sliding window).
        Several tokens a step are speculative decoding; several steps in a
        row grow the partial entry of the last block until it fills and is
        promoted.  A step the pool cannot grow preempts the request.
        """
        if not self._alive(run):
            return
        for group in run.tables:
            self._slide(run, group, slide - 2)
        for start in range(0, len(tokens), per_step):
            run.request.append_output_token_ids(tokens[start:start + per_step])
            for group in run.tables:
                if not self.work._grow(run, group):
                    self._drop(run)  # preempted
                    return
                self._cache(run, group, skip_partial, mask)

    @rule(target=finished, run=consumes(runs),
          reader=st.sampled_from([None, "reader1", "reader2"]))
    def finish(self, run: Running, reader: str | None) -> Any:
        """Free a finished request's blocks, tail first; or unpin them for a ``reader``.

        Unpinned blocks stay readable until reused; the reader's watcher fires then.
        """
        if not self._alive(run):
            return multiple()
        if reader is None:
            self._drop(run)
            return run
        self.live.pop(run.request.request_id)
        for table in run.tables.values():
            self.lock.call("unpin_blocks", [b for b in reversed(table) if b != NULL],
                           self.lock.watcher(reader))
        return run

    @rule(target=tables, n=st.integers(0, 3))
    def allocate(self, n: int) -> Any:
        """Blocks held outside any request (e.g. scratch for a copy)."""
        got = self.lock.call("get_new_blocks", n)
        if isinstance(got, Refusal):
            return multiple()
        table = Table(list(got))
        self.held.append(table)
        return table

    @rule(target=tables, run=runs, group=st.integers(0, 1))
    def copy_last_block(self, run: Running, group: int) -> Any:
        """Copy-on-write: the hashes of a request's last block move to a fresh copy.

        A last block without hashes has nothing to move: the copy stays unhashed.
        """
        if not self._alive(run) or group not in run.tables or not run.tables[group]:
            return multiple()
        src = run.tables[group][-1]
        got = self.lock.call("get_new_blocks", 1)
        if isinstance(got, Refusal):
            return multiple()
        self.lock.call("move_block_hashes", src, got[0])
        table = Table(list(got))
        self.held.append(table)
        return table

    @rule(target=tables, run=runs, group=st.integers(0, 1), upto=st.integers(1, 16),
          shorter=st.none() | st.integers(1, 16))
    def offload_copy(self, run: Running, group: int, upto: int, shorter: int | None) -> Any:
        """vLLM's CPU offload pool: a fresh block receives KV another pool cached, under its keys.

        The key of one of the request's prefixes becomes the copy's primary
        key; a shorter (or the same) prefix's key may follow as a secondary.
        """
        hbs = self.cfg.hash_block_size
        chunks = len(run.request.block_hashes)
        if (not self._alive(run) or not chunks or group not in self.cfg.block_sizes
                or not self.cfg.caching or not self.lock.supports("_insert_block_hash")):
            return multiple()
        got = self.lock.call("get_new_blocks", 1)
        if isinstance(got, Refusal):
            return multiple()
        upto = hbs * (1 + (upto - 1) % chunks)
        self.lock.call("_insert_block_hash", run.request, upto, group, got[0], upto)
        if shorter is not None:
            self.lock.call("_insert_block_hash", run.request, hbs * (1 + (shorter - 1) % (upto // hbs)),
                           group, got[0], None)
        table = Table(list(got))
        self.held.append(table)
        return table

    @rule(table=consumes(tables))
    def release(self, table: Table) -> None:
        """Free held blocks in one call; a block held several times is listed as often."""
        if table.live:
            table.live = False
            self.lock.call("free_blocks", table.ids)

    @rule(table=consumes(tables), reader=st.sampled_from(["reader1", "reader2"]))
    def unpin_held(self, table: Table, reader: str) -> None:
        """Held blocks handed to a ``reader`` in one ``unpin_blocks``, each listing one reference.

        A block held several times (see ``share``) is listed as often; if a
        request still holds it too, it stays in use with the watcher set.
        """
        if table.live:
            table.live = False
            self.lock.call("unpin_blocks", table.ids, self.lock.watcher(reader))

    @rule(target=tables, pick=st.integers(0, 15), times=st.integers(2, 3))
    def share(self, pick: int, times: int) -> Any:
        """One holder takes ``times`` references on one block in a single ``touch``.

        A sliding-window table with offloading lists a block twice; the block
        (in use, or cached and idle) is later released by listing it as many
        times in one ``free_blocks`` (``release``, ``release_mixed``) or
        ``unpin_blocks`` (``unpin_held``): the shape in which a pool that
        queues a block once per listing corrupts its free queue.
        """
        m = self.lock.model
        candidates = [b for b in range(1, m.num_blocks) if m.ref[b] > 0 or m.primary[b] is not None]
        if not candidates:
            return multiple()
        table = Table([candidates[pick % len(candidates)]] * times)
        self.lock.call("touch", table.ids)
        self.held.append(table)
        return table

    @rule(target=others, n=st.integers(1, 3), prompt=st.none() | prompts)
    def allocate_other(self, n: int, prompt: Prompt | None) -> Any:
        """Blocks of a second pool (an engine with several pools), cached there if ``prompt``.

        Freed through the first pool (``release_other``, ``release_mixed``):
        cached ones must go to the tail of the second pool's queue.
        """
        second = self._second()
        got = second.call("get_new_blocks", n)
        if isinstance(got, Refusal):
            return multiple()
        if prompt is not None and self.cfg.caching:
            req = self._request(prompt)
            bs = self.cfg.block_sizes[0]
            second.call("cache_full_blocks", req, list(got), 0, min(len(got), req.num_tokens // bs), bs, 0)
        return Table(list(got))

    @rule(theirs=consumes(others), reverse=st.booleans())
    def release_other(self, theirs: Table, reverse: bool) -> None:
        """Free the second pool's blocks through the first pool: the second takes them back."""
        if theirs.live:
            theirs.live = False
            self._free_across([], theirs.ids[::-1] if reverse else theirs.ids, False)

    @rule(theirs=consumes(others), mine=consumes(tables), interleave=st.booleans())
    def release_mixed(self, theirs: Table, mine: Table, interleave: bool) -> None:
        """One ``free_blocks`` call with the first pool's blocks and the second's, maybe interleaved."""
        own = mine.ids if mine.live else []
        other = theirs.ids if theirs.live else []
        mine.live = theirs.live = False
        self._free_across(own, other, interleave)

    @rule(prompt=prompts, placeholders=st.integers(1, 3), partial=st.booleans())
    def cache_placeholders(self, prompt: Prompt, placeholders: int, partial: bool) -> None:
        """Null placeholders in the range to cache are skipped, never hashed.

        With ``partial``, the null block is offered as the block of a partial
        entry: nothing is registered and the call returns ``None``.
        """
        bs = self.cfg.block_sizes[0]
        req = self._request(prompt)
        if partial and req.block_hashes:
            self.lock.call("cache_partial_block", req, NULL, self.cfg.hash_block_size, 0, bs)
        elif self.cfg.caching:
            n = min(placeholders, len(self.work._hashes(req, 0)))
            self.lock.call("cache_full_blocks", req, [NULL] * n, 0, n, bs, 0)

    @rule(run=runs, group=st.integers(0, 1), pick=st.integers(0, 31), again=st.booleans())
    def partial_inside(self, run: Running, group: int, pick: int, again: bool) -> None:
        """A partial entry at a chunk boundary of one of a request's blocks, up to what it wrote.

        A block cached further keeps its primary key and gains a secondary
        one (the shape eviction, promotion and moves must treat as a
        whole); the last, partly written block gains an entry shorter than
        its own, or its first, which the next step's entry replaces; at the
        boundary a block is cached at (its end, under vLLM 0.33), nothing
        changes.  With ``again`` it is registered twice: no change, no
        second event.
        """
        if not self.cfg.caching or not self._alive(run) or group not in run.tables:
            return
        spots = partial_spots(run, group, self.cfg, self.lock.model.boundary_partials)
        if not spots:
            return
        i, tokens = spots[pick % len(spots)]
        for _ in range(1 + again):
            self.lock.call("cache_partial_block", run.request, run.tables[group][i], tokens, group,
                           self.cfg.block_sizes[group])

    @rule(run=runs, group=st.integers(0, 1), pick=st.integers(0, 15), position=st.integers(0, 15))
    def rewrite(self, run: Running, group: int, pick: int, position: int) -> None:
        """A request rewrote a block it alone holds (a state checkpoint) and re-keys it.

        The entries the block had are evicted first, which makes it writable
        (the model's ``is_block_writable``), then ``replace_existing_hashes``
        registers it at a chunk boundary of what the request has written
        into it, its end included.
        """
        if not self.cfg.caching or not self._alive(run) or group not in run.tables:
            return
        options = rewritable(self.lock, run, group, self.cfg)
        if not options:
            return
        i, chunks = options[pick % len(options)]
        rekey(self.lock, run, group, self.cfg, i, 1 + position % chunks)

    @rule(run=runs, group=st.integers(0, 1), fewer=st.integers(0, 15))
    def sparse_cache(self, run: Running, group: int, fewer: int) -> None:
        """vLLM's sparse-attention coordinator asks to cache fewer blocks than are cached: a no-op."""
        if not self._alive(run) or group not in run.tables or not run.cached[group]:
            return
        cached = run.cached[group]
        self.lock.call("cache_full_blocks", run.request, run.tables[group], cached, fewer % cached,
                       self.cfg.block_sizes[group], group)

    @rule(kind=st.sampled_from([name for name, _weight in Workload.STEPS]), dice=st.integers(0, 2**16))
    def workload_step(self, kind: str, dice: int) -> None:
        """One step of the campaign's workload, by name, its dice seeded by ``dice``.

        Every kind of campaign step exists here (admit, decode, finish,
        slide, move, share, offload, other_pool, misuse, ...), on requests
        and blocks of its own beside the other rules' (the calls go to the
        same pools), so a bug the campaign finds the machine finds too, and
        shrinks to the steps it needs.
        """
        if kind == "misuse" and not self.MISUSE:
            return
        self.work.rng = random.Random(dice)
        getattr(self.work, kind)()

    @rule(ops=st.lists(st.sampled_from(sorted({op for op, _s in SCENARIOS})), min_size=1, max_size=3,
                       unique=True),
          leave_out=st.lists(st.sampled_from(sorted(FEATURE_NAMES)), max_size=3, unique=True))
    def directed(self, ops: list[str], leave_out: list[str]) -> None:
        """Calls of ``ops`` with many features at once, each on fresh pools (:mod:`.directed`).

        For each operation, one call per largest set of its features that can
        meet, less ``leave_out``: a failure shrinks to the operation and the
        features it needs.
        """
        scratch = getattr(self.ADAPTER, "scratch", None)  # a process-backed pool: its own processes
        maker = Directed(adapter_factory(scratch() if scratch else self.ADAPTER), self.REFERENCE,
                         self.ADAPTER.errors_match,
                         getattr(self.ADAPTER, "observe", None))
        for op, wanted in SCENARIOS:
            if op in ops:
                maker.make(op, wanted - frozenset(leave_out), self.FEATURES)

    @precondition(lambda self: self._any_cached())
    @rule(picks=st.lists(st.integers(0, 15), max_size=3), also_uncached=st.booleans())
    def evict(self, picks: list[int], also_uncached: bool) -> None:
        """Drop cached blocks from the index (picked among the cached ones)."""
        cached = self._cached_blocks()
        ids = [cached[i % len(cached)] for i in picks]
        if also_uncached:
            ids += [b for b in range(self.cfg.num_blocks) if b not in cached][:1]
        if len(ids) == 1 and self.lock.supports("_maybe_evict_cached_block"):
            self.lock.call("_maybe_evict_cached_block", ids[0])  # vLLM's checkpointed-state manager
        else:
            self.lock.call("evict_blocks", ids)

    @precondition(lambda self: self._any_cached() or (self.pair is not None and self.pair.model.watchers))
    @rule(drain=st.booleans())
    def reset(self, drain: bool) -> None:
        """Reset the prefix cache; refused (False) while blocks are in use."""
        if drain:
            for run in list(self.live.values()):
                self._drop(run)
            for table in self.held:
                if table.live:
                    table.live = False
                    self.lock.call("free_blocks", table.ids)
        self.lock.call("reset_prefix_cache")

    @rule(block=st.integers(0, 15))
    def queries(self, block: int) -> None:
        """The read-only operations, and taking the pending events."""
        self.lock.call("take_events")
        self.lock.call("get_usage")
        self.lock.call("get_num_free_blocks")
        self.lock.call("is_block_writable", block % self.cfg.num_blocks)

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(MISUSES), pick=st.integers(0, 7))
    def misuse(self, kind: str, pick: int) -> None:
        """One deliberately wrong call; both sides must refuse it alike (and change nothing)."""
        m = self.lock.model
        idle = [b for b in range(1, m.num_blocks) if m.ref[b] == 0]
        used = [b for b in range(1, m.num_blocks) if m.ref[b] > 0]
        hashed = [b for b in range(1, m.num_blocks) if m.primary[b] is not None]
        block = 1 + pick % (m.num_blocks - 1)  # any real block: each call is refused before it writes
        bs = self.cfg.block_sizes[0]
        call = self.lock.call
        if not self.cfg.caching and kind in CACHE_ENTRY_MISUSES:
            kind = "cache_disabled"  # as the campaign's: without caching, any cache entry is refused as such
        if kind == "free_idle" and idle:
            call("free_blocks", [idle[pick % len(idle)]])
        elif kind == "over_free" and used:
            b = used[pick % len(used)]
            call("free_blocks", [a for a in used if a != b][:1] + [b] * (m.ref[b] + 1))
        elif kind == "unpin_idle" and idle:
            call("unpin_blocks", [idle[pick % len(idle)]], self.lock.watcher("bad"))
        elif kind == "unpin_null":
            call("unpin_blocks", [NULL], self.lock.watcher("bad"))
        elif kind == "touch_unknown":
            call("touch", [*used[:1], m.num_blocks + pick])
        elif kind == "too_many":
            call("get_new_blocks", len(m.free) + 1 + pick)
        elif kind == "negative_count":
            call("get_new_blocks", -1 - pick)
        elif kind == "mask_length":
            call("cache_full_blocks", self._request(Prompt(0, 8)), [block], 0, 1, bs, 0, [True, False])
        elif kind == "evict_unknown":
            call("evict_blocks", [m.num_blocks + pick if pick % 2 else -1 - pick])
        elif kind == "move_onto_hashed" and hashed:
            call("move_block_hashes", block, hashed[pick % len(hashed)])
        elif kind == "move_onto_null" and hashed:
            call("move_block_hashes", hashed[pick % len(hashed)], NULL)
        elif kind == "partial_bad_tokens":
            call("cache_partial_block", self._request(Prompt(0, 8)), block,
                 -self.cfg.hash_block_size * (pick % 2), 0, bs * 2)
        elif kind == "cache_disabled" and not self.cfg.caching:  # both cache operations refused
            req = self._request(Prompt(0, 8))
            call("cache_full_blocks", req, [block], 0, 1, bs, 0)
            call("cache_partial_block", req, block, self.cfg.hash_block_size, 0, 2 * self.cfg.hash_block_size)
            if self.lock.supports("_insert_block_hash"):
                call("_insert_block_hash", req, self.cfg.hash_block_size, 0, block, self.cfg.hash_block_size)
        elif kind.startswith("insert_") and self.cfg.caching and self.lock.supports("_insert_block_hash"):
            hbs = self.cfg.hash_block_size
            unhashed = [b for b in range(1, m.num_blocks) if m.primary[b] is None] or [NULL]
            target, upto, tokens = {  # onto the null block; a primary with no token count; no key
                "insert_null": (NULL, hbs, hbs),
                "insert_no_tokens": (unhashed[pick % len(unhashed)], hbs, None),
                "insert_unnamed": (block, 0, hbs)}[kind]
            call("_insert_block_hash", self._request(Prompt(0, 8)), upto, 0, target, tokens)

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(ARGUMENT_MISUSES), pick=st.integers(0, 7))
    def misuse_argument(self, kind: str, pick: int) -> None:
        """A call with one bad argument, or a cache entry the model refuses; refused alike, no change.

        A group id beyond 32 bits, a block size that is no multiple of the
        hash chunk, a watcher that cannot be called, more full blocks than
        listed, a request without the hashes asked for, a block cached again
        at the prefix it is cached at, a partial entry at a block's end
        (vLLM 0.31), announcing more hits than the request has blocks.  Each call has one fault, so the
        refusal it must get is not a matter of which check a pool makes first.
        """
        m = self.lock.model
        hbs, bs = self.cfg.hash_block_size, self.cfg.block_sizes[0]
        block = 1 + pick % (m.num_blocks - 1)  # any real block: each call is refused before it writes
        unhashed = [b for b in range(1, m.num_blocks) if m.primary[b] is None]
        cached_whole = [b for b, p in enumerate(m.primary) if p is not None and p.num_tokens >= bs]
        prompt = self._request(Prompt(0, 12))
        call = self.lock.call
        if kind == "bad_group":
            group = (-1, 2**32)[pick % 2]
            call("cache_full_blocks", prompt, [block], 0, 1, bs, group)
        elif kind == "bad_block_size":
            call("cache_full_blocks", prompt, [block], 0, 1, (0, -hbs, hbs + 1)[pick % (2 + (hbs > 1))], 0)
        elif kind == "uncallable_watcher":
            call("unpin_blocks", [block], None)
        elif kind == "full_beyond_list" and self.cfg.caching:
            call("cache_full_blocks", prompt, [block], 0, 2, bs, 0)
        elif kind == "full_too_few_hashes" and unhashed and self.cfg.caching:
            call("cache_full_blocks", self._request(Prompt(0, 0)), [unhashed[pick % len(unhashed)]],
                 0, 1, bs, 0)
        elif kind == "cache_conflict" and cached_whole:
            call("cache_full_blocks", self._request(Prompt(pick % 2, 32)),
                 [cached_whole[pick % len(cached_whole)]], 0, 1, bs, 0)
        elif kind == "partial_at_block_end" and self.cfg.caching and not m.boundary_partials:
            call("cache_partial_block", prompt, block, hbs * (1 + pick % 3), 0, hbs)
        elif kind == "partial_too_few_hashes" and unhashed:
            call("cache_partial_block", self._request(Prompt(0, 0)), unhashed[pick % len(unhashed)],
                 hbs, 0, 2 * hbs)
        elif kind == "emit_too_many":  # refused only with events on
            call("emit_cached_block_events", prompt, len(prompt.block_hashes) + 1 + pick, hbs, 0)

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(OTHER_POOL_MISUSES), theirs=others, pick=st.integers(0, 7))
    def misuse_other(self, kind: str, theirs: Table, pick: int) -> None:
        """A wrong call on the first pool with a block of the second; both refuse, neither changes.

        Freeing it more often than it is referenced is a double free (the
        second model says so); every other operation refuses it as a block
        not of this pool, which the first model sees as an id outside the
        pool, handed to the pool as this block (``Lockstep.foreign``).
        """
        if not theirs.live:
            return
        second = self._second()
        b = theirs.ids[pick % len(theirs.ids)]
        if kind == "other_over_free":
            used = [a for a in range(1, self.cfg.num_blocks) if self.lock.model.ref[a] > 0]
            self._free_across(used[:1], [b] * (second.model.ref[b] + 1), pick % 2 == 1)
            return
        m = self.lock.model
        stand_in = m.num_blocks + pick  # an id the first model does not know
        used = [a for a in range(1, m.num_blocks) if m.ref[a] > 0]
        saved, self.lock.foreign = self.lock.foreign, second.pool.blocks[b]
        try:
            if kind == "other_touch":
                self.lock.call("touch", [*used[:1], stand_in])
            elif kind == "other_unpin":
                self.lock.call("unpin_blocks", [*used[:1], stand_in], self.lock.watcher("bad"))
            elif kind == "other_writable":
                self.lock.call("is_block_writable", stand_in)
            elif kind == "other_move":
                self.lock.call("move_block_hashes", pick % m.num_blocks, stand_in)
        finally:
            self.lock.foreign = saved
        second.check()

    @invariant()
    def pool_agrees_with_model(self) -> None:
        """Compare the observations and check the model's invariants.

        Every lockstep call already checks after itself and state changes
        only through calls, so this checks only when no call has been
        checked yet (the fresh pool); the rest would repeat the same work.
        """
        if self.pair is not None and self.pair.steps == 0:
            self.pair.check()


def machine_for(adapter: Adapter, *, misuse: bool | None = None,
                reference: str = "0.31") -> type[PoolMachine]:
    """A state machine class driving ``adapter``'s pool against the model.

    ``misuse`` defaults to what the adapter supports and is never turned on
    for an adapter that does not refuse misuse.  ``reference`` names the vLLM
    version whose behaviour the model reproduces.
    """
    misuse_on = adapter.supports_misuse if misuse is None else misuse and adapter.supports_misuse
    attrs: dict[str, Any] = {"ADAPTER": adapter, "MISUSE": misuse_on, "REFERENCE": reference,
                             "__doc__": f"Lockstep state machine for {adapter.name}."}
    return type(f"PoolMachine_{_ident(adapter.name)}", (PoolMachine,), attrs)


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.rsplit(":", 1)[-1]) or "pool"


@dataclass
class MachineFailure:
    """A shrunk failure: the Hypothesis steps and the lockstep's message."""

    message: str
    steps: list[str] = field(default_factory=list)

    @classmethod
    def from_exception(cls, exc: BaseException) -> MachineFailure:
        """Read the minimal example Hypothesis attached to the exception as notes."""
        notes = [str(n) for n in getattr(exc, "__notes__", ())]
        steps = [n for n in notes if n.startswith("state.") or " = state." in n]
        noise = {"state.teardown()", "state.pool_agrees_with_model()"}
        steps = [" ".join(s.split()) for s in steps if s not in noise]
        return cls(f"{type(exc).__name__}: {exc}", steps)


__all__ = ["ARGUMENT_MISUSES", "MISUSES", "OTHER_POOL_MISUSES", "MachineFailure", "PoolMachine", "Prompt",
           "Table", "configs", "machine_for"]
