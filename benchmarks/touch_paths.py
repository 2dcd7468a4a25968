"""``touch`` on its two paths, kvpool against vLLM in the same process.

A prefix hit touches blocks that are either already referenced (another running
request shares the prefix: only the count moves) or idle (an evictable cached
prefix: the block also leaves the free queue).  The mixed workload of
``pool_throughput.py`` is 99.6% the first kind; this separates them.  Prints
nanoseconds per block, best of the repeats, and vLLM/kvpool ratios.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import best, parser
from pool_throughput import vllm_pool


def measure(cls: Any, blocks: int, repeats: int, loops: int) -> tuple[float, float]:
    """(referenced, idle) touch cost in ns per block for pool class ``cls``."""
    pool = cls(8192, True, 16)
    shared = pool.get_new_blocks(blocks)
    referenced = best(lambda: [pool.touch(shared) for _ in range(loops)], repeats) / loops / blocks
    other = cls(8192, True, 16)
    idle = other.get_new_blocks(blocks)
    other.free_blocks(idle)
    return referenced, _timed_after(lambda: other.touch(idle), lambda: other.free_blocks(idle),
                                    repeats, loops) / blocks


def _timed_after(timed: Callable[[], None], untimed: Callable[[], None], repeats: int,
                 loops: int) -> float:
    """ns per call of ``timed``, each call followed by ``untimed`` outside the clock."""
    best = float("inf")
    for _ in range(repeats):
        total = 0
        for _ in range(loops):
            start = time.perf_counter_ns()
            timed()
            total += time.perf_counter_ns() - start
            untimed()
        best = min(best, total / loops)
    return best


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, blocks=(32, "blocks per touch (32, as in the workload)"), repeat=30,
                  loops=300).parse_args(argv)
    from kvpool.impl import BlockPool

    pools: dict[str, Any] = {"kvpool": BlockPool}
    vllm = vllm_pool()
    if vllm is not None:
        pools["vllm"] = vllm
    gc.disable()
    try:
        results = {name: measure(cls, args.blocks, args.repeat, args.loops) for name, cls in pools.items()}
    finally:
        gc.enable()
    print(f"touch, {args.blocks} blocks per call, ns per block (best of {args.repeat})")
    for i, path in enumerate(("referenced", "idle")):
        line = f"{path:<11}" + "".join(f"{name} {r[i]:6.1f}   " for name, r in results.items())
        if "vllm" in results:
            line += f"ratio {results['vllm'][i] / results['kvpool'][i]:.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
