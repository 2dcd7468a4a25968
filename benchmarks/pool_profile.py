"""One pool replaying a workload's recorded calls, for a profiler to watch.

Records the calls of a workload (``benchmarks/workloads.py``) on the plain build, binds
them to ``--rounds`` fresh pools, then replays them, as ``pool_throughput.py`` times them,
and prints how long each class took.  Three ways to watch the replay alone:

* the compiled build's entry points, with callgrind (instructions, independent of the
  machine's load; its wrappers are named ``CPyPy_pool___BlockPool___<method>``), then
  ``callgrind_summary.py`` for instructions per call and where they go::

    valgrind --tool=callgrind --collect-atstart=no \\
        --toggle-collect='CPyPy_pool___BlockPool___*' --callgrind-out-file=cg.out \\
        python benchmarks/pool_profile.py --workload serving
    python benchmarks/callgrind_summary.py cg.out

* one class of any pool, vLLM's included (``--pool vllm``): ``--collect lookup`` drains
  that class's runs with a ``deque``, whose C entry point callgrind then brackets
  (``--instr-atstart=no ... --toggle-collect=deque_init``, with ``--instrument`` to switch
  instrumentation on after the recording);

* wall time, sampled: ``--perf FILE`` runs ``perf record`` (cpu-clock, DWARF call graphs)
  on this process during the replays only; ``perf report -i FILE``.

``--pool plain`` replays on this checkout's ``impl/`` interpreted (beside an installed
compiled build).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from itertools import starmap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser
from pool_throughput import BLOCK_SIZE, OPS, Runs, bind, kvpool_pools, record, replay, vllm_pool
from workloads import WORKLOADS, add_options


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=1, instrument=(
        False, "turn callgrind's instrumentation on after recording (valgrind --instr-atstart=no)"))
    add_options(ap)
    ap.add_argument("--pool", choices=["installed", "plain", "vllm"], default="installed")
    ap.add_argument("--collect", choices=OPS, help="run this class's calls from C (see collect)")
    ap.add_argument("--perf", metavar="FILE", help="sample the replay alone with perf record into FILE")
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
    if args.instrument:
        subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True,
                       capture_output=True)
    sampler = None
    if args.perf:
        sampler = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "--call-graph", "dwarf,16384",
             "-o", args.perf, "-p", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)  # until it is attached
    try:
        for runs in rounds:
            ns = replay(runs) if args.collect is None else collect(runs, args.collect)
            print("  ".join(f"{op} {t / 1e6:.1f} ms" for op, t in ns.items()),
                  f"| all {sum(ns.values()) / 1e6:.1f} ms")
    finally:
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait()
        gc.enable()
    return 0


def collect(runs: Runs, op: str) -> dict[str, int]:
    """Replay ``runs``, the calls of class ``op`` drained by a ``deque`` and the others not.

    Under callgrind with ``--toggle-collect=deque_init``, what those calls execute is all
    that is counted, whatever the pool is written in.
    """
    ns: dict[str, int] = {}
    for name, method, arglist in runs:
        start = time.perf_counter_ns()
        if name == op:
            deque(starmap(method, arglist), maxlen=0)
        else:
            list(starmap(method, arglist))
        ns[name] = ns.get(name, 0) + time.perf_counter_ns() - start
    return ns


if __name__ == "__main__":
    raise SystemExit(main())
