"""Random lockstep campaigns: many runs of the workload against a pool class."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TextIO

from .abstraction import same_refusal
from .lockstep import Divergence, Lockstep
from .workload import Config, Workload, second_pool


def run_one(
    pool_factory: Callable[..., Any], seed: int, steps: int, *, misuse: bool = True,
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
    reference: str = "0.31", observe: Callable[..., Any] | None = None,
) -> Lockstep:
    """One run of ``steps`` workload steps; raises :class:`Divergence` on a difference.

    ``misuse=False`` leaves out deliberately wrong calls (for pools, like
    vLLM's, that do not refuse them); ``errors_match`` pairs refusals;
    ``observe`` is an adapter's own observation, if it has one.
    """
    rng = random.Random(seed)
    cfg = Config.draw(rng, seed)
    pair = Lockstep.fresh(pool_factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size,
                          cfg.events, reference, metrics=cfg.metrics)
    pair.errors_match = errors_match
    pair.observe = observe
    work = Workload(rng, cfg, pair, misuse_on=misuse,
                    second=second_pool(pool_factory, cfg, reference, errors_match))
    for _ in range(steps):
        work.step()
    pair.check()  # the whole pool once more at the end
    return pair


def run_campaign(
    pool_factory: Callable[..., Any], steps: int, runs: int, seed: int, out: TextIO, *,
    misuse: bool = True,
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
    reference: str = "0.31",
) -> int:
    """Run ``runs`` seeded runs; print a line each; 0 if all agree, 1 otherwise."""
    failures = 0
    total_calls = 0
    started = time.perf_counter()
    for run in range(runs):
        try:
            pair = run_one(pool_factory, seed + run, steps, misuse=misuse,
                           errors_match=errors_match, reference=reference)
            total_calls += pair.steps
            print(f"run {run + 1}/{runs} seed {seed + run}: ok ({pair.steps} calls)", file=out)
        except Divergence as exc:
            failures += 1
            print(f"run {run + 1}/{runs} seed {seed + run}: DIVERGED\n{exc}", file=out)
    elapsed = time.perf_counter() - started
    rate = total_calls / elapsed if elapsed else 0.0
    print(f"{runs - failures}/{runs} runs agree; {total_calls} calls in {elapsed:.1f}s "
          f"({rate:,.0f} calls/s)", file=out)
    return 1 if failures else 0
