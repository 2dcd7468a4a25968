"""Throughput and memory of kvpool's two builds against vLLM's BlockPool, in one process.

One realistic mixed workload — requests sharing system prompts, so lookups
hit and miss; allocation with evictions once the pool is full of cached
blocks; caching of full blocks; touching hits; freeing; KV events on — is
played against each pool with the same seed.  Both pools behave identically,
so both see exactly the same sequence of calls (the script checks that).

Prints per-operation throughput (blocks/s), each kvpool build's ratio to vLLM
per operation class and for the whole mix, and bytes per block.  The pools: the
installed ``kvpool.impl`` and, when that is the compiled build (``KVPOOL_COMPILE=1
pip install .``), the plain build loaded from this checkout's ``impl/`` (the same
source, interpreted); vLLM when it is importable (see scripts/install-vllm.sh),
configured as a running engine configures it (environment-variable cache on).
``--no-events`` turns KV events off, to show what they cost.

    python benchmarks/pool_throughput.py [--requests 4000] [--blocks 8192] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import importlib.util
import random
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_SIZE = 16

if importlib.util.find_spec("kvpool") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Req:
    """The request attributes a block pool reads (vLLM's Request has the same)."""

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[bytes]
    lora_request: Any = None
    mm_features: list[Any] = field(default_factory=list)
    cache_salt: str | None = None
    session_id: str | None = None
    prompt_embeds: Any = None
    _prompt_embeds_per_block_hashes: dict[Any, Any] = field(default_factory=dict)


def _chain(tokens: list[int]) -> list[bytes]:
    out: list[bytes] = []
    parent = b"root"
    for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hashlib.sha256(parent + repr(tokens[i:i + BLOCK_SIZE]).encode()).digest()
        out.append(parent)
    return out


def make_requests(n: int, seed: int) -> list[Req]:
    """Requests = one of a few long system prompts + a user turn of its own."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(32000) for _ in range(rng.randint(256, 1024))] for _ in range(12)]
    reqs = []
    for i in range(n):
        tokens = rng.choice(prompts) + [rng.randrange(32000) for _ in range(rng.randint(16, 400))]
        reqs.append(Req(f"r{i}", tokens, _chain(tokens)))
    return reqs


class Timers:
    """Wall time and counts per operation class."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.blocks: dict[str, int] = defaultdict(int)
        self.trace: list[tuple[str, int]] = []

    def timed(self, op: str, nblocks: int, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = fn(*args)
        self.ns[op] += time.perf_counter_ns() - t0
        self.calls[op] += 1
        self.blocks[op] += nblocks
        self.trace.append((op, nblocks))
        return out


def play(pool: Any, reqs: list[Req], seed: int, max_running: int) -> Timers:
    """Admit, decode and finish requests like a scheduler; time every pool call."""
    rng = random.Random(seed)
    t = Timers()
    running: list[tuple[Req, list[Any], int]] = []
    for req in reqs:
        hits: list[Any] = []
        for h in req.block_hashes:
            found = t.timed("lookup", 1, pool.get_cached_block, h, [0])
            if found is None:
                break
            hits.append(found[0])
        if hits:
            t.timed("touch", len(hits), pool.touch, hits)
        need = -(-len(req.all_token_ids) // BLOCK_SIZE) - len(hits)
        while need > pool.get_num_free_blocks() and running:
            _, blocks, _ = running.pop(0)
            t.timed("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
        if need > pool.get_num_free_blocks():
            if hits:
                t.timed("free", len(hits), pool.free_blocks, hits)
            continue
        new = t.timed("allocate", need, pool.get_new_blocks, need)
        blocks = hits + new
        full = len(req.block_hashes)
        t.timed("cache", full - len(hits), pool.cache_full_blocks,
                req, blocks, len(hits), full, BLOCK_SIZE, 0)
        running.append((req, blocks, full))
        if len(running) > max_running or rng.random() < 0.3:
            _, blocks, _ = running.pop(rng.randrange(len(running)))
            t.timed("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
        if rng.random() < 0.05:
            pool.take_events()
    for _, blocks, _ in running:
        t.timed("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
    pool.take_events()
    return t


def bytes_per_block(factory: Callable[[], Any], num_blocks: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = factory()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del pool
    return (after - before) / num_blocks


def _vllm_pool() -> Callable[..., Any] | None:
    try:
        envs = importlib.import_module("vllm.envs")
        pool_mod = importlib.import_module("vllm.v1.core.block_pool")
    except Exception as exc:  # vLLM absent or not importable on this machine
        print(f"vLLM not importable ({type(exc).__name__}: {exc}); measuring kvpool alone")
        return None
    enable = getattr(envs, "enable_envs_cache", None)
    if enable is not None:
        enable()
    return pool_mod.BlockPool  # type: ignore[no-any-return]


def _kvpool_pools() -> dict[str, Callable[..., Any]]:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs per pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-events", action="store_true", help="KV events off in every pool")
    args = ap.parse_args(argv)

    pools = _kvpool_pools()
    vllm = _vllm_pool()
    if vllm is not None:
        pools["vllm"] = vllm
    reqs = make_requests(args.requests, args.seed)

    # Per operation class, the fastest of the repeats (the least disturbed run);
    # the mix is the fastest whole run.  Pools alternate so drift hits both alike.
    best: dict[str, Timers] = {}
    best_mix: dict[str, int] = {}
    for _ in range(args.repeat):
        for name, cls in pools.items():
            pool = cls(args.blocks, True, BLOCK_SIZE, enable_kv_cache_events=not args.no_events)
            gc.collect()
            gc.disable()  # as timeit does: collector pauses would land on random calls
            try:
                timers = play(pool, reqs, args.seed, max_running=64)
            finally:
                gc.enable()
            best_mix[name] = min(best_mix.get(name, 1 << 62), sum(timers.ns.values()))
            if name not in best:
                best[name] = timers
            else:
                for op, ns in timers.ns.items():
                    best[name].ns[op] = min(best[name].ns[op], ns)
            if timers.trace != best["plain"].trace:
                print("the pools made different calls: they do not behave alike", file=sys.stderr)
                return 1

    k = best["plain"]
    builds = [n for n in pools if n != "vllm"]
    print(f"workload: {args.requests} requests, {args.blocks} blocks of {BLOCK_SIZE} tokens, "
          f"{sum(k.calls.values())} pool calls, events {'off' if args.no_events else 'on'}; "
          f"best of {args.repeat}")
    header = f"{'operation':<10}{'calls':>9}{'blocks':>10}"
    for name in pools:
        header += f"{name + ' blk/s':>17}"
    if "vllm" in pools:
        for name in builds:
            header += f"{name + '/vLLM':>14}"
    print(header)
    ops = ["lookup", "touch", "allocate", "cache", "free"]
    for op in [*ops, "mix"]:
        row_ns = {n: (best_mix[n] if op == "mix" else t.ns[op]) for n, t in best.items()}
        nblk = sum(k.blocks.values()) if op == "mix" else k.blocks[op]
        ncalls = sum(k.calls.values()) if op == "mix" else k.calls[op]
        line = f"{op:<10}{ncalls:>9}{nblk:>10}"
        for n in pools:
            line += f"{nblk / (row_ns[n] / 1e9):>17,.0f}"
        if "vllm" in pools:
            for n in builds:
                line += f"{row_ns['vllm'] / row_ns[n]:>13.2f}x"
        print(line)
    for name, cls in pools.items():
        bpb = bytes_per_block(lambda cls=cls: cls(args.blocks, True, BLOCK_SIZE), args.blocks)
        print(f"memory {name}: {bpb:.0f} bytes per block (empty pool of {args.blocks})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
