"""The shadow's added cost per call, as a multiple of vLLM's bare pool on the same calls.

    .venv-vllm/bin/python benchmarks/shadow_overhead.py [--steps 4000] [--seeds 4]

The seeded workload (misuse off, no key copies: a pool alone) plays vLLM's own
``BlockPool`` twice, bare and under the shadow checking on the calling thread (``oracle/shadow/``
strict, hence inline: the model, the footprint comparison, the whole pool every ``num_blocks``
calls, each call's operation and arguments written to a file).  The default shadow checks in a
process of its own; ``benchmarks/replay_trace.py`` measures that one inside vLLM's scheduler.
Only the time spent inside the pool's methods is counted, so the workload's own cost is left
out; both runs make the same calls.
Printed: per-call CPU times and ``added / bare``, the median over the seeds of each seed's
ratio, bare and shadowed run back to back (target at most 15).  Pools of the
engine-like size ``--blocks`` (default 4096) unless ``--blocks 0`` (the drawn shapes).
"""

from __future__ import annotations

import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import met, parser

from kvpool.oracle.core.adapter import vllm_adapter
from kvpool.oracle.core.lockstep import Lockstep
from kvpool.oracle.generate.runs import RunConfig
from kvpool.oracle.generate.workload import Workload
from kvpool.oracle.shadow import shadow_of, shadowed_class

TARGET = 15.0


class Engine(Workload):
    STEPS = tuple(s for s in Workload.STEPS if s[0] not in ("offload", "other_pool"))


OPS = frozenset(("get_new_blocks", "free_blocks", "touch", "unpin_blocks", "evict_blocks",
                 "reset_prefix_cache", "cache_full_blocks", "cache_partial_block", "move_block_hashes",
                 "emit_cached_block_events", "take_events", "_maybe_evict_cached_block",
                 "get_cached_block", "is_block_writable", "get_num_free_blocks", "get_usage"))
"""The pool's operations whose time is counted."""


class Timed:
    """The pool, every operation's time inside it added up."""

    def __init__(self, pool: Any) -> None:
        self._pool, self.seconds, self.calls = pool, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if name not in OPS:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()  # CPU time: other processes on the machine do not count
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - started
                self.calls += 1

        return timed


def run(pool_class: type, seed: int, steps: int, blocks: int | None) -> tuple[float, int]:
    rng = random.Random(seed)
    cfg = RunConfig.draw(rng, seed, blocks)
    made: list[Timed] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        made.append(Timed(pool_class(*args, **kwargs)))
        return made[-1]

    pair = Lockstep.fresh(factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events)
    pair.errors_match = vllm_adapter().errors_match
    pair.supports = lambda op: op != "_insert_block_hash" and Lockstep.supports(pair, op)  # type: ignore[method-assign]
    work = Engine(rng, cfg, pair, misuse_on=False)
    for _ in range(steps):
        work.step()
    found = shadow_of(made[0]._pool)
    if found is not None and not found.active:
        raise SystemExit(f"the shadow stopped on seed {seed}: see its log line")
    # the outer lockstep observes the pool through its internals, not its operations: only
    # the workload's calls are timed
    return made[0].seconds, made[0].calls


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, steps=4000, seeds=4,
                  blocks=(4096, "pool size (0: the drawn shapes)")).parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    from vllm.v1.core.block_pool import BlockPool

    directory = Path(tempfile.mkdtemp(prefix="kvpool-shadow-bench-"))
    shadowed = shadowed_class(BlockPool, directory=directory, strict=True)
    blocks = args.blocks or None
    bare_s = shadow_s = 0.0
    calls, ratios = 0, []
    for seed in range(args.seeds):  # bare and shadowed interleaved, seed by seed
        b, n = run(BlockPool, seed, args.steps, blocks)
        s, m = run(shadowed, seed, args.steps, blocks)
        if n != m:
            raise SystemExit(f"seed {seed}: {n} calls bare, {m} shadowed: not the same calls")
        bare_s, shadow_s, calls = bare_s + b, shadow_s + s, calls + n
        ratios.append((s - b) / b)
    ratio = statistics.median(ratios)
    print(f"{calls} calls on vLLM's BlockPool ({args.seeds} seeds x {args.steps} steps, "
          f"{blocks or 'drawn'} blocks)")
    print(f"  bare pool:     {1e6 * bare_s / calls:8.1f} us/call")
    print(f"  under shadow:  {1e6 * shadow_s / calls:8.1f} us/call")
    print(f"  added / bare:  {ratio:8.1f}x, median of the seeds' ratios (target at most {TARGET:.0f}x): "
          f"{met(ratio <= TARGET)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
