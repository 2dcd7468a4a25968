"""kvpool's own continuous-batching loop around any pool, in lockstep with the model (``--engine kvpool``).

A small engine of the kind vLLM's scheduler is, written here so that a pool
can be replayed against production traffic without vLLM: requests are let in
by arrival (:class:`~.run.Arrivals`); a new one looks up its prefix
(``get_cached_block`` block by block until a miss, at most all but its last
token, and ``touch`` on what it hit), then is prefilled in chunks under a
token budget shared by the step; running requests come first, one token a
step once their prompt is in; each step's full blocks are cached
(``cache_full_blocks``); a request that needs a block when none is free
preempts the latest admitted one (its blocks freed, tail first; it starts
again later, as vLLM's recompute does); a finished request frees its blocks
tail first.  Every pool call goes through :class:`~kvpool.oracle.core.lockstep.Lockstep`
(or, with ``--trace``, a recording lockstep): the model runs it too and a
divergence stops the run with the call that differs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import LoRARequest, Request

from ..core.lockstep import Divergence, Lockstep
from ..shadow.working import ENCODE, RequestLines, Sink
from ..trace.record import recording_pair
from ..trace.write import model_event_to_json
from .requests import TraceRequest
from .routers import RouterWatch
from .run import Arrivals, Replay, RequestRecord, Settings

OUTPUT_BASE = 1 << 40
"""Generated tokens are ``OUTPUT_BASE * (request index + 1) + k``: no prompt holds them, no two
requests share one (a decoded block is never a hit of another request)."""


@dataclass
class Seq:
    """A request inside the engine."""

    trace: TraceRequest
    request: Request
    record: RequestRecord
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    cached: int = 0
    """Full blocks cached so far (``cache_full_blocks``)."""
    generated: int = 0
    admitted: bool = False

    @property
    def tokens(self) -> int:
        return len(self.request.all_token_ids)


class KvpoolEngine:
    """The loop over one pool (a lockstep pair with the model)."""

    def __init__(self, pair: Lockstep, settings: Settings, replay: Replay, routers: RouterWatch | None,
                 lines: RequestLines | None = None) -> None:
        self.pair, self.s, self.replay, self.routers, self.lines = pair, settings, replay, routers, lines
        self.hasher = get_request_block_hasher(settings.block_size)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.clock = 0.0

    def call(self, op: str, *args: Any) -> Any:
        if self.lines is not None:
            self.lines.forget_gone()
        self.replay.calls += 1
        return self.pair.call(op, *args)

    # ------------------------------------------------------------ one step

    def run(self, arrivals: Arrivals) -> None:
        s = self.s
        while not arrivals.done or self.waiting or self.running:
            if not self.waiting and not self.running and arrivals.next is not None:
                self.clock = max(self.clock, arrivals.next.arrival_ms)  # idle: the next arrival
            for tr in arrivals.due(self.clock, len(self.waiting)):
                self.arrive(tr)
            scheduled = self.schedule()
            self.execute(scheduled)
            if s.events:
                events = self.call("take_events")
                if self.routers is not None:
                    self.routers.feed([model_event_to_json(e) for e in events], self.replay.steps)
            self.replay.steps += 1
            tokens = sum(n for _, n in scheduled)
            self.clock += max(s.step_ms, 1000.0 * tokens / s.tokens_per_s)
            self.replay.clock_ms = self.clock
            if self.replay.steps % 16 == 0:
                self.replay.sample(self.call("get_num_free_blocks"))

    def arrive(self, tr: TraceRequest) -> None:
        if not self.replay.fits(tr):
            return
        lora = None if tr.lora is None else LoRARequest(tr.lora, 1 + abs(hash(tr.lora)) % (1 << 30), tr.lora)
        req = Request(f"r{tr.index}", tr.prompt, lora_request=lora, cache_salt=tr.cache_salt,
                      block_hasher=self.hasher)
        self.waiting.append(Seq(tr, req, RequestRecord(tr.index, len(tr.prompt))))

    def schedule(self) -> list[tuple[Seq, int]]:
        """This step's requests and how many tokens each computes."""
        budget = self.s.token_budget
        scheduled: list[tuple[Seq, int]] = []
        preempted = False
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq not in self.running:  # preempted by a request before it this step
                continue
            n = min(seq.tokens - seq.computed, budget)
            while not self.grow(seq, seq.computed + n):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq in self.running:
                scheduled.append((seq, n))
                budget -= n
        while (self.waiting and budget > 0 and len(self.running) < self.s.max_seqs and not preempted):
            seq = self.waiting[0]
            n = self.admit(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def admit(self, seq: Seq, budget: int) -> int:
        """Look up the prefix, take blocks for the first chunk; the chunk's tokens (0: no room)."""
        bs = self.s.block_size
        hits: list[int] = []
        cap = (seq.tokens - 1) // bs  # at least one token is computed (it gives the next one)
        hashes = seq.request.block_hashes
        for i in range(min(cap, len(hashes))):
            found = self.call("get_cached_block", hashes[i], [0])
            if not found:
                break
            hits.append(found[0])
        if hits:
            self.call("touch", hits)
        computed = len(hits) * bs
        n = min(seq.tokens - computed, budget)
        need = -(-(computed + n) // bs) - len(hits)
        if self.call("get_num_free_blocks") < need:
            if hits:
                self.call("free_blocks", hits[::-1])
            return 0
        if not seq.admitted:
            seq.admitted = True
            seq.record.hit_tokens = computed
            if self.routers is not None:
                self.routers.admitted(seq.request, len(hits), cap, self.replay.steps)
        seq.blocks = hits + (self.allocate(need) if need else [])
        seq.computed, seq.cached = computed, len(hits)
        return n

    def grow(self, seq: Seq, tokens: int) -> bool:
        """Blocks enough for ``tokens`` tokens (False: not enough free)."""
        need = -(-tokens // self.s.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        if self.call("get_num_free_blocks") < need:
            return False
        seq.blocks += self.allocate(need)
        return True

    def allocate(self, n: int) -> list[int]:
        """``n`` new blocks; the cached ones among them are evictions (counted from the model)."""
        model = self.pair.model
        evicted = sum(1 for b in model.free.first(n) if model.primary[b] is not None or model.secondary[b])
        got: list[int] = self.call("get_new_blocks", n)
        self.replay.evictions += evicted
        return got

    def preempt(self, seq: Seq) -> None:
        """Free its blocks, tail first; it starts again from its first token when room comes."""
        self.running.remove(seq)
        if seq.blocks:
            self.call("free_blocks", seq.blocks[::-1])
        seq.blocks, seq.computed, seq.cached = [], 0, 0
        seq.record.preemptions += 1
        self.replay.preemptions += 1
        self.waiting.appendleft(seq)

    def execute(self, scheduled: list[tuple[Seq, int]]) -> None:
        """The model's forward pass: the chunk's KV is in its blocks; a request whose tokens are all
        in gets its next token."""
        bs = self.s.block_size
        for seq, n in scheduled:
            seq.record.steps += 1
            seq.computed += n
            full = min(seq.computed // bs, len(seq.request.block_hashes))
            if full > seq.cached:
                self.call("cache_full_blocks", seq.request, seq.blocks, seq.cached, full, bs, 0)
                seq.cached = full
            if seq.computed < seq.tokens:
                continue  # a chunk of its prompt
            seq.generated += 1
            self.replay.generated_tokens += 1
            if seq.generated >= seq.trace.output_length:
                self.finish(seq)
            else:
                seq.request.append_output_token_ids(OUTPUT_BASE * (seq.trace.index + 1) + seq.generated)

    def finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.call("free_blocks", seq.blocks[::-1])
        seq.blocks = []
        seq.record.finished_step = self.replay.steps
        self.replay.finished(seq.record)


def run_kvpool(requests: Iterator[TraceRequest], settings: Settings, pool_factory: Callable[..., Any],
               pool_name: str, *, errors_match: Callable[[Exception, Exception | None], bool] | None = None,
               routers: list[str] | None = None, trace: str | Path | None = None,
               keep_requests: bool = False) -> Replay:
    """Replay ``requests`` through kvpool's loop around pools made by ``pool_factory``."""
    events = settings.events or bool(routers)
    settings = replace(settings, events=events)
    replay = Replay("kvpool", pool_name, settings, records=[] if keep_requests else None)
    watch = RouterWatch(routers, settings.block_size, replay) if routers else None
    sink: Sink | None = None
    lines = None
    if trace is None:
        pair = Lockstep.fresh(pool_factory, settings.num_blocks, True, settings.block_size, events,
                              metrics=True)
    else:
        recording, header = recording_pair(pool_factory, settings.num_blocks, True, settings.block_size,
                                           events, block_sizes={0: settings.block_size},
                                           meta={"made_by": "kvpool replay", "pool": pool_name})
        sink = Sink(open(trace, "w", encoding="utf-8"))  # noqa: SIM115 (closed below)
        sink.out.write(ENCODE(header) + "\n")
        lines = RequestLines(sink)
        recording.sink, recording.request_form, recording.keep_observations = sink, lines, False
        pair = recording
        replay.trace = str(trace)
    if errors_match is not None:
        pair.errors_match = errors_match
    pair.full_every = max(1, settings.num_blocks)  # a pool seen through calls too: not every call
    pair.local_invariants = False  # the invariants at the whole-pool checks, as the shadow checks them
    engine = KvpoolEngine(pair, settings, replay, watch, lines)
    started, wall = time.process_time(), time.perf_counter()
    try:
        engine.run(Arrivals(requests, settings.max_waiting))
        pair.check()
    except Divergence as found:
        replay.divergences += 1
        replay.findings.append(str(found).splitlines()[0])
    finally:
        replay.cpu_s = time.process_time() - started
        replay.wall_s = time.perf_counter() - wall
        replay.clock_ms = engine.clock
        if sink is not None:
            sink.flush()
            sink.out.close()
    return replay


__all__ = ["OUTPUT_BASE", "KvpoolEngine", "run_kvpool"]

