"""Soak: millions of realistic pool operations, invariants checked as it goes.

Requests sharing system prompts are admitted (lookup, touch, allocate, cache),
decode a few tokens (allocate, cache) and finish (free), against
kvpool.impl.BlockPool with KV events on.  Every ``--check-every`` operations
the pool's structural invariants are checked (kvpool.oracle.core.observe) and a
line reports throughput and memory, so drift or a leak shows as a trend.

    python benchmarks/soak.py [--ops 10000000] [--blocks 1536] [--check-every 10000]

Exits 1 on the first broken invariant, 0 otherwise; the last lines give the
start, end and peak resident memory.
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser, rss_mib
from workloads import BLOCK_SIZE, chain

from kvpool.impl import BlockPool, Request
from kvpool.oracle.core.observe import pool_invariant_errors


class Soak:
    """A scheduler-like driver that counts every pool call as one operation."""

    def __init__(self, blocks: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = BlockPool(blocks, True, BLOCK_SIZE, enable_kv_cache_events=True)
        self.prompts = [[self.rng.randrange(32000) for _ in range(self.rng.randint(64, 512))]
                        for _ in range(16)]
        self.running: deque[tuple[Request, list[Any]]] = deque()
        self.ops = 0
        self.counter = 0

    def admit(self) -> None:
        self.counter += 1
        tokens = self.rng.choice(self.prompts) + [self.rng.randrange(32000)
                                                  for _ in range(self.rng.randint(8, 200))]
        req = Request(f"r{self.counter}", tokens, block_hashes=chain(tokens))
        pool = self.pool
        hits: list[Any] = []
        for h in req.block_hashes:
            self.ops += 1
            if (found := pool.get_cached_block(h, [0])) is None:
                break
            hits.append(found[0])
        self.ops += 1
        pool.touch(hits)
        need = -(-len(tokens) // BLOCK_SIZE) - len(hits)
        while need > pool.get_num_free_blocks() and self.running:
            self.finish()
        if need > pool.get_num_free_blocks():
            self.ops += 1
            pool.free_blocks(hits)
            return
        self.ops += 2
        blocks = hits + pool.get_new_blocks(need)
        pool.cache_full_blocks(req, blocks, len(hits), len(req.block_hashes), BLOCK_SIZE, 0)
        self.running.append((req, blocks))

    def decode(self) -> None:
        req, blocks = self.running[self.rng.randrange(len(self.running))]
        req.all_token_ids.extend(self.rng.randrange(32000) for _ in range(BLOCK_SIZE))
        cached = len(req.block_hashes)
        req.block_hashes.extend(chain(req.all_token_ids[cached * BLOCK_SIZE:],
                                      req.block_hashes[-1] if req.block_hashes else b"root"))
        need = -(-len(req.all_token_ids) // BLOCK_SIZE) - len(blocks)
        if need > self.pool.get_num_free_blocks():
            return
        self.ops += 2
        blocks.extend(self.pool.get_new_blocks(need))
        self.pool.cache_full_blocks(req, blocks, cached, len(req.block_hashes), BLOCK_SIZE, 0)

    def finish(self) -> None:
        _, blocks = self.running.popleft()
        self.ops += 1
        self.pool.free_blocks(list(reversed(blocks)))

    def step(self) -> None:
        r = self.rng.random()
        if len(self.running) > 48:
            self.finish()
        elif not self.running or r < 0.3:
            self.admit()
        elif r < 0.8:
            self.decode()
        else:
            self.finish()
        if self.ops % 97 == 0:
            self.pool.take_events()


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, ops=10_000_000, blocks=1536, check_every=10_000, report_every=1_000_000,
                  seed=0).parse_args(argv)

    soak = Soak(args.blocks, args.seed)
    start_rss = peak_rss = rss_mib()
    t0 = last_t = time.perf_counter()
    last_ops = next_check = next_report = 0
    checks = 0
    print(f"soak: {args.ops:,} operations, {args.blocks} blocks; rss {start_rss:.1f} MiB")
    while soak.ops < args.ops:
        soak.step()
        if soak.ops >= next_check:
            next_check += args.check_every
            checks += 1
            if errors := pool_invariant_errors(soak.pool):
                print(f"after {soak.ops:,} operations: {'; '.join(errors)}")
                return 1
            peak_rss = max(peak_rss, rss_mib())
        if soak.ops >= next_report:
            next_report += args.report_every
            now = time.perf_counter()
            rate = (soak.ops - last_ops) / (now - last_t) if now > last_t else 0.0
            print(f"{soak.ops:>12,} ops  {rate:>10,.0f} ops/s  rss {rss_mib():7.1f} MiB  "
                  f"usage {soak.pool.get_usage():.2f}")
            last_ops, last_t = soak.ops, now
    elapsed = time.perf_counter() - t0
    print(f"done: {soak.ops:,} operations in {elapsed:.1f}s ({soak.ops / elapsed:,.0f} ops/s), "
          f"{checks} invariant checks passed")
    print(f"memory: start {start_rss:.1f} MiB, end {rss_mib():.1f} MiB, peak {peak_rss:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
