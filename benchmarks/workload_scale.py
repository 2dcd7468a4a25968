"""A lockstep call's cost on an engine-sized pool, against the same run on 64 blocks.

    python benchmarks/workload_scale.py [--steps 5000] [--blocks 1048576]

The seeded workload (``kvpool check``'s, and ``--long-lived``'s) runs on kvpool's pool in
lockstep with the model, once on 64 blocks and once on ``--blocks``; CPU seconds per call
of the steps (the pools' construction and the final whole-pool check left out, each once
per run).  Printed: both, and large over small (target: about 1, at most 2).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time

from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.core.lockstep import Lockstep
from kvpool.oracle.generate.long_lived import workload_class
from kvpool.oracle.generate.runs import RunConfig
from kvpool.oracle.generate.two_pools import second_pool


def per_call(blocks: int, steps: int, long_lived: bool, seed: int = 0) -> float:
    adapter = kvpool_adapter()
    rng = random.Random(seed)
    cfg = RunConfig.draw(rng, seed, blocks)
    pair = Lockstep.fresh(adapter.factory(), cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events,
                          metrics=cfg.metrics)
    second = second_pool(adapter.factory(), cfg, "0.31", adapter.errors_match)
    work = workload_class(long_lived)(rng, cfg, pair, second=second)
    started = time.process_time()
    for _ in range(steps):
        work.step()
    return (time.process_time() - started) / pair.steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--blocks", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    logging.getLogger("kvpool").setLevel(logging.ERROR)
    for long_lived in (False, True):
        small = per_call(64, args.steps, long_lived)
        large = per_call(args.blocks, args.steps, long_lived)
        print(f"{'long-lived' if long_lived else 'short     '}: 64 blocks {1e6 * small:6.0f} us/call, "
              f"{args.blocks} blocks {1e6 * large:6.0f} us/call: {large / small:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
