"""Random lockstep campaigns: many runs of the workload against a pool class."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, TextIO

from kvpool.model import OPERATIONS

from ..core.abstraction import same_refusal
from ..core.lockstep import Divergence, Lockstep
from ..generate.capabilities import Capabilities, Unmakeable
from ..generate.directed import Directed, missed_share
from ..generate.features import FeatureLog
from ..generate.long_lived import pool_blocks, workload_class
from ..generate.runs import RunConfig
from ..generate.two_pools import second_pool
from .shrink import CallLog


def run_one(
    pool_factory: Callable[..., Any], seed: int, steps: int, *, misuse: bool = True,
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
    reference: str = "0.31", observe: Callable[..., Any] | None = None,
    blocks: int | None = None, long_lived: bool = False, keep_log: bool = False,
    features: FeatureLog | None = None, share: tuple[int, int] | None = None,
    lacks: frozenset[str] = frozenset(),
) -> Lockstep:
    """One run of ``steps`` workload steps; raises :class:`Divergence` on a difference.

    ``misuse=False`` leaves out deliberately wrong calls (for pools, like vLLM's, that do not
    refuse them); ``observe`` is an adapter's own observation; ``blocks`` the pool's size (None:
    drawn, or :data:`~.long_lived.LONG_LIVED_BLOCKS`); ``long_lived`` plays
    :class:`~.long_lived.LongLived`'s churn.  With ``keep_log`` a divergence carries every call as
    its ``log`` (:class:`~.shrink.CallLog`).  ``features`` collects each call's shape features; with
    ``share`` (``(run, runs)``) the run then makes the pairs of its share it missed (:mod:`.directed`,
    counted in ``pair.directed``).  ``lacks`` (:mod:`.capabilities`) is left out of the run's shape
    and calls, and a workload step that would make such a call stops before it.
    """
    rng = random.Random(seed)
    caps = Capabilities.of(lacks)
    cfg = caps.fit(RunConfig.draw(rng, seed, pool_blocks(seed, blocks, long_lived)))

    def lacking(made: Lockstep) -> Lockstep:
        made.lacks = caps.lacks | (made.lacks or frozenset())  # and what the pool itself declares
        return made

    def first() -> Lockstep:
        return lacking(Lockstep.fresh(pool_factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size,
                                      cfg.events, reference, metrics=cfg.metrics, errors_match=errors_match,
                                      observe=observe))

    second = second_pool(pool_factory, cfg, reference, errors_match)
    pair = first()
    log = CallLog(first, second, misuse, blocks=cfg.num_blocks) if keep_log else None
    pair.log, pair.features = log, features

    def logged_second() -> Lockstep:
        made = second()
        made.log, made.features = log, features
        return lacking(made)

    work = workload_class(long_lived)(rng, cfg, pair, misuse_on=misuse and caps.has("misuse"),
                                      second=logged_second if caps.has("second_pool") else None)
    try:
        for number in range(steps):
            if log is not None:
                log.step = number
            with contextlib.suppress(Unmakeable):  # the step drew what the pool lacks: none of it made
                work.step()
        pair.check()  # the whole pool once more at the end
    except Divergence as exc:
        exc.log = log
        raise
    if features is not None and share is not None:
        aimed = Directed(pool_factory, reference, errors_match, observe, lacks=caps.lacks)
        have = [op for op in OPERATIONS if pair.supports(op)]
        try:
            aimed.cover(missed_share(features, *share, ops=have, lacks=caps.lacks), features)
        finally:
            pair.directed = aimed.calls
    return pair


def run_campaign(
    pool_factory: Callable[..., Any], steps: int, runs: int, seed: int, out: TextIO, *,
    misuse: bool = True,
    errors_match: Callable[[Exception, Exception | None], bool] = same_refusal,
    reference: str = "0.31", blocks: int | None = None, long_lived: bool = False,
    lacks: frozenset[str] = frozenset(),
) -> int:
    """Run ``runs`` seeded runs; print a line each; 0 if all agree, 1 otherwise."""
    failures = 0
    total_calls = 0
    started = time.perf_counter()
    for run in range(runs):
        try:
            pair = run_one(pool_factory, seed + run, steps, misuse=misuse,
                           errors_match=errors_match, reference=reference, blocks=blocks,
                           long_lived=long_lived, lacks=lacks)
            total_calls += pair.steps
            print(f"run {run + 1}/{runs} seed {seed + run}: ok ({pair.steps} calls, "
                  f"{pair.model.num_blocks} blocks)", file=out)
        except Divergence as exc:
            failures += 1
            print(f"run {run + 1}/{runs} seed {seed + run}: DIVERGED\n{exc}", file=out)
    elapsed = time.perf_counter() - started
    rate = total_calls / elapsed if elapsed else 0.0
    print(f"{runs - failures}/{runs} runs agree; {total_calls} calls in {elapsed:.1f}s "
          f"({rate:,.0f} calls/s)", file=out)
    return 1 if failures else 0
