"""Throughput and memory of kvpool's two builds against vLLM's BlockPool, in one process.

A workload (``benchmarks/workloads.py``: ``mixed`` or ``serving``) is played live on every
pool once, recording each call, its arguments and its result: the pools must make the
same calls and return the same results and events (else the script stops).  The
recorded calls are then replayed on a fresh pool of each kind, in interleaved rounds
(kvpool, vLLM, then vLLM, kvpool, ...), with the clock read around each run of
consecutive calls of one operation class (a run of several calls made from C), so the
driver's own work is not timed and a lookup run of 30 calls reads the clock twice, not 60
times.  Reported per class and
for the whole mix: the median over rounds of each round's vLLM/kvpool time ratio
(with the lowest and highest), and the median ns per call.  The ``net`` ratio takes the
clock floor (timing a call of nothing, measured each round) off every timed run of both
pools: what is left is the pools' own calls, which matters for classes timed one call at
a time (``touch``, ``take_events``).  The collector is off while a
round runs (as timeit does; ``--gc`` leaves it on), and on between rounds.  The events
``take_events`` returns are freed after the clock is read, as a caller frees them once
published (``event_cost.py`` times building and freeing events).

The pools: the installed ``kvpool.impl`` and, when that is the compiled build
(``KVPOOL_COMPILE=1 pip install .``), the plain build loaded from this checkout's
``impl/`` (the same source, interpreted); vLLM when it is importable (see
scripts/install-vllm.sh), configured as a running engine configures it
(environment-variable cache on).  ``--no-events`` turns KV events off in every pool;
``--vllm-events`` makes kvpool emit vLLM's event classes, as it does under its vLLM
plugin.
Memory is ``tracemalloc`` over an empty pool, and over the pool after the workload
(its index full of cached blocks), per block.

    python benchmarks/pool_throughput.py [--workload mixed|serving|all] [--repeat 7] [--no-events]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import statistics
import sys
import time
import tracemalloc
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from itertools import starmap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser
from workloads import BLOCK_SIZE, WORKLOADS, Workload, add_options

OPS = ["lookup", "touch", "allocate", "cache", "free", "emit", "events"]


class Blocks(tuple[int, ...]):
    """A list of blocks in a recorded call, by id (each pool replays it with its own blocks)."""


def encode(value: Any, event_fields: Callable[[Any], dict[str, Any]]) -> Any:
    """A call's argument or result, comparable across pools: blocks by id, events by field."""
    if not isinstance(value, list):
        return value
    if value and all(hasattr(v, "block_id") for v in value):
        return Blocks(v.block_id for v in value)
    if value and type(value[0]).__name__ in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        return [event_fields(e) for e in value]
    return list(value)


Trace = list[tuple[str, int, str, tuple[Any, ...]]]
"""(operation class, blocks moved, method name, encoded arguments) per call."""


def record(pool: Any, workload: Workload, data: Any, seed: int) -> tuple[Trace, list[Any]]:
    """Play ``workload`` live on ``pool``: its calls and their encoded results."""
    from kvpool.impl.events import event_fields

    trace: Trace = []
    results: list[Any] = []

    def call(op: str, nblocks: int, method: Callable[..., Any], *args: Any) -> Any:
        out = method(*args)
        trace.append((op, nblocks, method.__name__, tuple(encode(a, event_fields) for a in args)))
        results.append(encode(out, event_fields))
        return out

    workload.drive(pool, data, seed, call)
    return trace, results


Runs = list[tuple[str, Callable[..., Any], list[tuple[Any, ...]]]]
"""Runs of consecutive calls of one class: the class, its method (bound), each call's arguments."""


def bind(trace: Trace, pool: Any) -> Runs:
    """The recorded calls as ``pool``'s bound methods and arguments, in runs of one method."""
    runs: Runs = []
    blocks = pool.blocks
    for op, _n, name, args in trace:
        real = tuple([blocks[i] for i in a] if type(a) is Blocks else
                     list(a) if type(a) is list else a for a in args)
        if runs and runs[-1][0] == op and runs[-1][1].__name__ == name:
            runs[-1][2].append(real)
        else:
            runs.append((op, getattr(pool, name), [real]))
    return runs


def replay(runs: Runs) -> dict[str, int]:
    """Nanoseconds per operation class, the clock read around each run of calls (a run of several
    made from C), the events ``take_events`` hands over freed after the clock is read."""
    ns: dict[str, int] = defaultdict(int)
    clock = time.perf_counter_ns
    for op, method, arglist in runs:
        if op == "events":
            for args in arglist:
                start = clock()
                taken = method(*args)
                ns[op] += clock() - start
                del taken
        elif len(arglist) == 1:
            args = arglist[0]
            start = clock()
            method(*args)
            ns[op] += clock() - start
        else:
            start = clock()
            deque(starmap(method, arglist), maxlen=0)
            ns[op] += clock() - start
    return ns


def clock_floor(samples: int = 2001) -> float:
    """What timing one call of nothing costs, median ns: every timed run includes about this."""
    clock = time.perf_counter_ns
    spans = []
    method, args = int, ()
    for _ in range(samples):
        start = clock()
        method(*args)
        spans.append(clock() - start)
    return statistics.median(spans)


def vllm_pool() -> Callable[..., Any] | None:
    """vLLM's BlockPool, configured as a running engine configures it (None: vLLM absent)."""
    try:
        envs = importlib.import_module("vllm.envs")
        pool_mod = importlib.import_module("vllm.v1.core.block_pool")
    except Exception as exc:  # vLLM absent or not importable on this machine
        print(f"vLLM not importable ({type(exc).__name__}: {exc}); measuring kvpool alone")
        return None
    getattr(envs, "enable_envs_cache", lambda: None)()
    return pool_mod.BlockPool  # type: ignore[no-any-return]


def kvpool_pools() -> dict[str, Callable[..., Any]]:
    """The installed build of kvpool.impl, and the plain one beside a compiled one."""
    impl = importlib.import_module("kvpool.impl")
    if not getattr(impl, "COMPILED", False):
        return {"plain": impl.BlockPool}
    source = Path(__file__).resolve().parents[1] / "impl"
    spec = importlib.util.spec_from_file_location(
        "kvpool_pure_impl", source / "__init__.py", submodule_search_locations=[str(source)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the plain build from {source}")
    pure = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pure
    spec.loader.exec_module(pure)
    return {"plain": pure.BlockPool, "compiled": impl.BlockPool}


def bytes_per_block(make: Callable[[], Any], num_blocks: int) -> float:
    """Memory of a new pool, per block."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pool = make()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del pool
    return (after - before) / num_blocks


def bytes_added(pool: Any, trace: Trace) -> float:
    """Memory the calls of ``trace`` leave in ``pool`` (its index, keys, hashes), per block."""
    runs = bind(trace, pool)  # before tracing: the arguments belong to the trace
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        replay(runs)
        pool.take_events()
        del runs
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(pool.blocks)


def measure(workload: Workload, args: argparse.Namespace, pools: dict[str, Callable[..., Any]]) -> int:
    nreq = args.requests or workload.default_requests
    nblocks = args.blocks or workload.default_blocks
    events = not args.no_events
    data = workload.make(nreq, args.seed)

    def fresh(cls: Callable[..., Any]) -> Any:
        return cls(nblocks, True, BLOCK_SIZE, enable_kv_cache_events=events)

    trace: Trace | None = None
    expected: list[Any] = []
    for name, cls in pools.items():
        got, results = record(fresh(cls), workload, data, args.seed)
        if trace is None:
            trace, expected = got, results
        elif got != trace or results != expected:
            where = next(i for i, (a, b) in enumerate(zip([*got, None], [*trace, None], strict=False))
                         if a != b or results[i] != expected[i])
            print(f"{workload.name}: {name} differs from {next(iter(pools))} at call {where}: "
                  "the pools do not behave alike", file=sys.stderr)
            return 1
    assert trace is not None

    names = list(pools)
    rounds: list[dict[str, dict[str, int]]] = []
    floors: list[float] = []
    for r in range(args.repeat):
        floors.append(clock_floor())
        this: dict[str, dict[str, int]] = {}
        for name in (names if r % 2 == 0 else names[::-1]):
            pool = fresh(pools[name])
            runs = bind(trace, pool)
            gc.collect()
            if not args.gc:
                gc.disable()  # as timeit does: collector pauses would land on random calls
            try:
                this[name] = replay(runs)
            finally:
                gc.enable()
            del pool, runs
        rounds.append(this)

    calls = Counter(op for op, _n, _name, _args in trace)
    blocks: Counter[str] = Counter()
    for op, n, _name, _args in trace:
        blocks[op] += n
    ops = [op for op in OPS if calls[op]]
    runs_of = Counter(op for op, _method, _arglist in bind(trace, pools[names[0]](nblocks, True, BLOCK_SIZE)))
    # The clock is read around each run, and around each take_events alone (see replay).
    spans = Counter({op: calls[op] if op == "events" else runs_of[op] for op in ops})
    for count in (calls, blocks, runs_of, spans):
        count["mix"] = sum(count.values())
    print(f"\nworkload {workload.name}: {nreq} requests, {nblocks} blocks of {BLOCK_SIZE} tokens, "
          f"{len(trace)} pool calls, events {'off' if args.no_events else 'on'}"
          f"{' (kvpool emits vLLM classes)' if args.vllm_events and not args.no_events else ''}, "
          f"collector {'on' if args.gc else 'off'}; median of {args.repeat} interleaved rounds; "
          f"clock floor {statistics.median(floors):.0f} ns per timed run (included; 'net': "
          "each round's floor taken off every timed run of both pools)")
    header = (f"{'operation':<10}{'calls':>8}{'runs':>8}{'blocks':>9}"
              + "".join(f"{n + ' ns/call':>18}" for n in names))
    builds = [n for n in names if n != "vllm"]
    if "vllm" in pools:
        header += "".join(f"{n + '/vLLM (range)':>28}{'net':>7}" for n in builds)
    print(header)
    for op in [*ops, "mix"]:
        def total(rnd: dict[str, dict[str, int]], name: str, op: str = op) -> int:
            return sum(rnd[name].values()) if op == "mix" else rnd[name][op]

        def net(r: int, name: str, op: str = op) -> float:
            return max(total(rounds[r], name) - floors[r] * spans[op], 1.0)
        line = f"{op:<10}{calls[op]:>8}{runs_of[op]:>8}{blocks[op]:>9}"
        for n in names:
            line += f"{statistics.median(total(rnd, n) for rnd in rounds) / calls[op]:>18,.1f}"
        if "vllm" in pools:
            for n in builds:
                ratios = [total(rnd, "vllm") / total(rnd, n) for rnd in rounds]
                line += f"{statistics.median(ratios):>13.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                nets = [net(r, "vllm") / net(r, n) for r in range(len(rounds))]
                line += f"{statistics.median(nets):>6.2f}x"
        print(line)
    for name, cls in pools.items():
        empty = bytes_per_block(lambda cls=cls: cls(nblocks, True, BLOCK_SIZE), nblocks)
        full = empty + bytes_added(fresh(cls), trace)
        print(f"memory {name}: {empty:.0f} bytes per block empty, {full:.0f} after the workload "
              f"({nblocks} blocks)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, repeat=(7, "interleaved rounds"),
                vllm_events=(False, "kvpool emits vLLM's event classes, as under its vLLM plugin"),
                gc=(False, "leave the garbage collector on while timing"))
    add_options(ap, every=True)
    args = ap.parse_args(argv)

    pools = kvpool_pools()
    if args.vllm_events:
        for cls in pools.values():
            events = importlib.import_module(cls.__module__.rsplit(".", 1)[0] + ".events")
            events.use_vllm_event_classes()
    vllm = vllm_pool()
    if vllm is not None:
        pools["vllm"] = vllm
    chosen = list(WORKLOADS.values()) if args.workload == "all" else [WORKLOADS[args.workload]]
    for workload in chosen:
        if measure(workload, args, pools):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
