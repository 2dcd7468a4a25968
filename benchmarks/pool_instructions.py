"""Instructions per call of each operation class, kvpool's builds against vLLM's pool (callgrind).

Wall-clock ratios on a shared machine swing with its load; the instructions a call executes
do not.  For each pool this script starts one ``valgrind --tool=callgrind`` process that
records a workload of ``benchmarks/workloads.py`` (instrumentation off), then replays its
calls on a fresh pool as ``pool_throughput.py`` does, with instrumentation on.  Each
operation class's runs of calls are drained by a C function of its own (a ``deque``'s
``extend``, ``operator.countOf``, ``functools.reduce``, ...), and callgrind collects
only inside those functions, so one process counts every class: what the pool's calls
execute, callees included, plus the drain's own step per call.

The ``none`` row replays the same runs through the same drains on a method that does
nothing (``"".format``): the cost of calling anything there, the analogue of the clock
floor of ``pool_throughput.py``.  Ratios are vLLM's instructions over the build's, as
counted (``raw``) and with that floor taken off both (``net``).

    python benchmarks/pool_instructions.py [--workload mixed|serving] [--requests N] [--no-events]
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import operator
import os
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable
from itertools import starmap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from callgrind_summary import parse
from harness import parser
from pool_throughput import BLOCK_SIZE, OPS, Runs, bind, kvpool_pools, record, vllm_pool
from workloads import WORKLOADS, add_options

_SENTINEL = object()
_SINK: deque[Any] = deque(maxlen=0)
_KEPT: list[Any] = []

# Per class: the C function callgrind collects in (as libpython names it), and a drain that
# enters it once per run.  None of them is called by a pool (``check`` in main makes sure:
# a pool calling one would toggle the collection off inside it).
DRAINS: dict[str, tuple[str, Callable[[Iterable[Any]], Any]]] = {
    "lookup": ("deque_extend", _SINK.extend),
    "touch": ("deque_extendleft", _SINK.extendleft),
    "allocate": ("_operator_countOf", lambda it: operator.countOf(it, _SENTINEL)),
    "cache": ("_operator_contains", lambda it: operator.contains(it, _SENTINEL)),
    "free": ("functools_reduce", lambda it: functools.reduce(operator.is_, it, None)),
    "emit": ("builtin_min", lambda it: min(it, key=id, default=None)),
    "events": ("list_extend", _KEPT.extend),  # keeps the events: freed after, as pool_throughput does
}
POOLS = ["none", "compiled", "plain", "vllm"]


def child(args: argparse.Namespace) -> int:
    """Inside valgrind: record, bind, switch instrumentation on, replay through the drains."""
    workload = WORKLOADS[args.workload]
    plain = kvpool_pools()["plain"]
    nblocks = args.blocks or workload.default_blocks
    events = not args.no_events

    def fresh(cls: Callable[..., Any]) -> Any:
        return cls(nblocks, True, BLOCK_SIZE, enable_kv_cache_events=events)

    data = workload.make(args.requests or workload.default_requests, args.seed)
    trace, _results = record(fresh(plain), workload, data, args.seed)
    if args.child == "none":  # the plain pool's runs, every method doing nothing
        runs: Runs = [(op, "".format, arglist) for op, _method, arglist in bind(trace, fresh(plain))]
    else:
        cls = vllm_pool() if args.child == "vllm" else kvpool_pools().get(args.child)
        if cls is None:
            raise SystemExit(f"no {args.child} pool here")
        runs = bind(trace, fresh(cls))
    counts = {op: [0, 0] for op in OPS}  # calls, runs
    for op, _method, arglist in runs:
        counts[op][0] += len(arglist)
        counts[op][1] += 1
    Path(args.counts).write_text(json.dumps(counts))
    gc.collect()
    gc.disable()
    subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True, capture_output=True)
    for op, method, arglist in runs:
        DRAINS[op][1](starmap(method, arglist))
    # Out at once, nothing more run: interpreter's own exit (or a subprocess) may call a drain's function.
    os._exit(0)


def measure(pool: str, args: argparse.Namespace, out: Path) -> dict[str, tuple[int, int, int]]:
    """Run one pool's child under callgrind: per class (calls, runs, instructions)."""
    counts_file = out.with_suffix(".json")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
           *[f"--toggle-collect={fn}" for fn, _drain in DRAINS.values()],
           f"--callgrind-out-file={out}", sys.executable, "-P", __file__, "--child", pool,
           "--counts", str(counts_file), "--workload", args.workload, "--seed", str(args.seed),
           "--requests", str(args.requests), "--blocks", str(args.blocks),
           *(["--no-events"] if args.no_events else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts = json.loads(counts_file.read_text())
    into, _callees = parse(out)
    result: dict[str, tuple[int, int, int]] = {}
    for op, (fn, _drain) in DRAINS.items():
        calls, nruns = counts[op]
        entered, ir = into.get(fn, [0, 0])
        if entered != nruns:  # a pool called the drain's function itself: the count is wrong
            raise SystemExit(f"{pool}: {fn} entered {entered} times for {nruns} runs of {op}")
        result[op] = (calls, nruns, ir)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, pools=(",".join(POOLS), "of " + ",".join(POOLS)))
    add_options(ap)
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the callgrind files there (callgrind_summary.py reads the compiled one)")
    ap.add_argument("--child", choices=POOLS, help=argparse.SUPPRESS)
    ap.add_argument("--counts", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    wanted = [p for p in args.pools.split(",") if p]
    have = {*kvpool_pools(), "none"} | ({"vllm"} if vllm_pool() is not None else set())
    pools = [p for p in POOLS if p in wanted and p in have]
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        got = {p: measure(p, args, where / f"{p}.cg") for p in pools}
    workload = WORKLOADS[args.workload]
    print(f"workload {args.workload}: {args.requests or workload.default_requests} requests, "
          f"{args.blocks or workload.default_blocks} blocks, events {'off' if args.no_events else 'on'}; "
          "instructions per call (callgrind), the drain's step included")
    builds = [p for p in pools if p not in ("none", "vllm")]
    header = f"{'class':<10}{'calls':>8}{'runs':>7}" + "".join(f"{p:>11}" for p in pools)
    if "vllm" in got:
        header += "".join(f"{b + '/vLLM raw':>17}{'net':>7}" for b in builds)
    print(header)
    for by_op in got.values():
        by_op["mix"] = tuple(sum(v[i] for v in by_op.values()) for i in range(3))  # type: ignore[assignment]
    for op in [*OPS, "mix"]:
        calls, nruns, _ir = got[pools[0]][op]
        if not calls:
            continue
        ir = {p: got[p][op][2] for p in pools}
        line = f"{op:<10}{calls:>8}{nruns:>7}" + "".join(f"{ir[p] / calls:>11,.0f}" for p in pools)
        if "vllm" in got:
            floor = ir.get("none", 0)
            for b in builds:
                net = (ir["vllm"] - floor) / max(ir[b] - floor, 1)
                line += f"{ir['vllm'] / ir[b]:>16.2f}x{net:>6.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
