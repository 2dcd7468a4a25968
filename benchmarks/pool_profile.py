"""One pool replaying a workload's recorded calls, for a profiler to watch.

Records the calls of a workload (``benchmarks/workloads.py``) on the plain build, binds
them to ``--rounds`` fresh pools, then replays them, as ``pool_throughput.py`` times them,
and prints how long each class took.  Under callgrind, the compiled build's entry points
(``CPyPy_pool___BlockPool___<method>``) give instructions per call, independent of the
machine's load, and ``callgrind_summary.py`` where they go::

    valgrind --tool=callgrind --collect-atstart=no \\
        --toggle-collect='CPyPy_pool___BlockPool___*' --callgrind-out-file=cg.out \\
        python benchmarks/pool_profile.py --workload serving
    python benchmarks/callgrind_summary.py cg.out

``--pool plain`` replays on this checkout's ``impl/`` interpreted (beside an installed
compiled build).
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser
from pool_throughput import BLOCK_SIZE, bind, kvpool_pools, record, replay, vllm_pool
from workloads import WORKLOADS, add_options


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=1)
    add_options(ap)
    ap.add_argument("--pool", choices=["installed", "plain", "vllm"], default="installed")
    args = ap.parse_args(argv)

    workload = WORKLOADS[args.workload]
    builds = kvpool_pools()
    cls = (vllm_pool() if args.pool == "vllm" else builds["plain"] if args.pool == "plain"
           else builds.get("compiled", builds["plain"]))
    if cls is None:
        return 1
    nblocks = args.blocks or workload.default_blocks
    data = workload.make(args.requests or workload.default_requests, args.seed)

    def fresh(pool_class: Any = cls) -> Any:
        return pool_class(nblocks, True, BLOCK_SIZE, enable_kv_cache_events=not args.no_events)

    # Recorded on the plain build, so that a profiler of compiled code sees the replay only.
    trace, _results = record(fresh(builds["plain"]), workload, data, args.seed)
    counts = Counter(op for op, _n, _name, _args in trace)
    print("calls:", "  ".join(f"{op} {n}" for op, n in counts.items()))
    # Every round's pool and calls made first, so that the profiled part is the replays alone.
    rounds = [bind(trace, fresh()) for _ in range(args.rounds)]
    gc.collect()
    gc.disable()
    try:
        for runs in rounds:
            ns = replay(runs)
            print("  ".join(f"{op} {t / 1e6:.1f} ms" for op, t in ns.items()),
                  f"| all {sum(ns.values()) / 1e6:.1f} ms")
    finally:
        gc.enable()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
