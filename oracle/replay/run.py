"""What an engine loop of ``kvpool replay`` shares: the settings, arrivals on a simulated clock, and
what the run says (hit rates, evictions, preemptions, the calls checked, a series over time).

No model runs, so no step has a duration of its own: a step takes
``max(step_ms, scheduled tokens / tokens_per_s)``, and a request enters the
engine's queue once the clock passes its arrival, at most ``max_waiting``
ahead of the engine (so a trace that outruns the engine waits in the file,
not in memory).  An idle engine jumps to the next arrival.

Everything kept grows with nothing but the pool: counters, the series
(at most :data:`MAX_POINTS` points, thinned as the run goes), and a digest of
how each request was scheduled (its hits, preemptions and steps), which two
runs of the same trace compare (``keep_requests`` keeps the records too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .requests import TraceRequest

MAX_POINTS = 400
"""Points a series keeps: when full, every other one goes and the spacing doubles."""


@dataclass(frozen=True)
class Settings:
    """An engine loop's configuration (the command's options)."""

    num_blocks: int = 32768
    block_size: int = 16
    token_budget: int = 8192
    max_seqs: int = 256
    events: bool = False
    tokens_per_s: float = 100_000.0
    step_ms: float = 5.0
    max_waiting: int = 64

    def problems(self) -> list[str]:
        """What is wrong with these settings, one phrase each (empty: nothing)."""
        out = [f"{name.replace('_', '-')} must be positive"
               for name in ("num_blocks", "block_size", "token_budget", "max_seqs", "max_waiting")
               if getattr(self, name) < 1]
        if self.num_blocks < 2:
            out.append("num-blocks must be at least 2 (block 0 is the null block)")
        if not self.tokens_per_s > 0 or self.step_ms < 0:
            out.append("tokens-per-s must be positive and step-ms not negative")
        return out


class Arrivals:
    """The trace's requests, let into the engine as the simulated clock passes their arrival."""

    def __init__(self, requests: Iterator[TraceRequest], max_waiting: int) -> None:
        self.source = requests
        self.max_waiting = max_waiting
        self.next: TraceRequest | None = next(requests, None)

    @property
    def done(self) -> bool:
        return self.next is None

    def due(self, clock_ms: float, waiting: int) -> list[TraceRequest]:
        """The requests arrived by ``clock_ms`` that fit in the engine's queue (``waiting`` in it)."""
        out: list[TraceRequest] = []
        while (self.next is not None and self.next.arrival_ms <= clock_ms
               and waiting + len(out) < self.max_waiting):
            out.append(self.next)
            self.next = next(self.source, None)
        return out


@dataclass
class RequestRecord:
    """How one request was scheduled: what two runs of one trace compare."""

    index: int
    prompt_tokens: int
    hit_tokens: int = -1
    """Tokens found cached at its first admission (-1: not admitted yet)."""
    preemptions: int = 0
    steps: int = 0
    """Steps it was scheduled in."""
    finished_step: int = -1

    def key(self) -> tuple[int, int, int, int, int]:
        return self.index, self.hit_tokens, self.preemptions, self.steps, self.finished_step


@dataclass
class RouterTally:
    """One router profile's answers at each request's first admission against what the pool served."""

    name: str
    queries: int = 0
    over_requests: int = 0
    """Requests it claims more cached leading blocks for than the pool serves (routed there, they miss)."""
    over_tokens: int = 0
    under_requests: int = 0
    """Requests it claims fewer for (a hit given away)."""
    under_tokens: int = 0
    reactions: int = 0
    """Events it did not index as meant."""


@dataclass
class Series:
    """Points over the run, thinned to at most :data:`MAX_POINTS`."""

    columns: tuple[str, ...]
    points: list[tuple[float, ...]] = field(default_factory=list)
    every: int = 1
    seen: int = 0

    def add(self, point: tuple[float, ...]) -> None:
        if self.seen % self.every == 0:
            self.points.append(point)
            if len(self.points) >= MAX_POINTS:
                self.points = self.points[::2]
                self.every *= 2
        self.seen += 1


@dataclass
class Replay:
    """What a replay says."""

    engine: str
    pool: str
    settings: Settings
    requests: int = 0
    """Requests finished."""
    prompt_tokens: int = 0
    hit_tokens: int = 0
    requests_with_hits: int = 0
    generated_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0
    steps: int = 0
    clock_ms: float = 0.0
    calls: int = 0
    """Pool calls checked against the model."""
    divergences: int = 0
    findings: list[str] = field(default_factory=list)
    """One line per divergence, broken contract or stopped check."""
    cpu_s: float = 0.0
    """CPU time of the engine's loop (this process; a checker process's is ``checker_cpu_s``)."""
    checker_cpu_s: float = 0.0
    wall_s: float = 0.0
    routers: list[RouterTally] = field(default_factory=list)
    series: Series = field(default_factory=lambda: Series(("step", "clock_s", "finished", "hit_rate",
                                                           "free_blocks")))
    """Over the run; a router's cumulative over- and under-claimed tokens are two columns more each."""
    records: list[RequestRecord] | None = None
    """Every request's record, when asked for (else only :attr:`digest`)."""
    trace: str | None = None
    """The trace file written (``--trace``), if any."""
    _digest: Any = field(default_factory=hashlib.sha256, repr=False)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.requests_with_hits / self.requests if self.requests else 0.0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def digest(self) -> str:
        """Of every finished request's record, in finishing order: equal for equal scheduling."""
        return str(self._digest.copy().hexdigest()[:16])

    def fits(self, tr: TraceRequest) -> bool:
        """Whether the request fits in the pool; if not, it is skipped, said in the findings."""
        s = self.settings
        if len(tr.prompt) + tr.output_length <= (s.num_blocks - 1) * s.block_size:
            return True
        self.findings.append(f"request {tr.index}: {len(tr.prompt) + tr.output_length} tokens "
                             f"do not fit in {s.num_blocks - 1} blocks of {s.block_size}; skipped")
        return False

    def finished(self, record: RequestRecord) -> None:
        self.requests += 1
        self.prompt_tokens += record.prompt_tokens
        self.hit_tokens += max(0, record.hit_tokens)
        self.requests_with_hits += record.hit_tokens > 0
        self._digest.update(repr(record.key()).encode())
        if self.records is not None:
            self.records.append(record)

    def add_router(self, name: str) -> RouterTally:
        """A router profile to tally (before the first sample)."""
        tally = RouterTally(name)
        self.routers.append(tally)
        self.series.columns += (f"{name} over_tokens", f"{name} under_tokens")
        return tally

    def sample(self, free_blocks: int) -> None:
        point: tuple[float, ...] = (self.steps, self.clock_ms / 1000, self.requests, self.token_hit_rate,
                                    free_blocks)
        for r in self.routers:
            point += (r.over_tokens, r.under_tokens)
        self.series.add(point)

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        return {
            "engine": self.engine, "pool": self.pool,
            "settings": vars(s),
            "requests": self.requests, "prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate, "requests_with_hits": self.requests_with_hits,
            "request_hit_rate": self.request_hit_rate, "generated_tokens": self.generated_tokens,
            "evictions": self.evictions, "preemptions": self.preemptions, "steps": self.steps,
            "simulated_s": self.clock_ms / 1000, "calls": self.calls, "divergences": self.divergences,
            "findings": self.findings, "cpu_s": self.cpu_s, "checker_cpu_s": self.checker_cpu_s,
            "wall_s": self.wall_s, "calls_per_s": self.calls_per_s, "digest": self.digest,
            "routers": [vars(r) for r in self.routers], "trace": self.trace,
            "series": {"columns": list(self.series.columns), "points": self.series.points},
        }


__all__ = ["MAX_POINTS", "Arrivals", "Replay", "RequestRecord", "RouterTally", "Series", "Settings"]
