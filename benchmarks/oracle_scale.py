"""The oracle at engine scale: cost per call against the pool's size and the run's length.

A serving-like workload (requests sharing prefixes, prefix hits on idle cached
blocks, allocation, caching, decode, finish in reverse, events taken every
step) on one long-lived pool, measured four ways, each as CPU seconds per call
and as a ratio against a baseline measured in the same run:

* ``model``: the model alone (``kvpool.model`` operations), at 64 to 1,048,576 blocks;
* ``lockstep``: kvpool's pool against the model (``oracle.core.lockstep``), the same sizes;
* ``check-trace``: a recorded trace of the same workload replayed on the model,
  the same sizes, and against merely parsing the trace's JSON lines (target: within 15x);
* ``check-events``: the same traces read as a router would (``kvpool check-events``);
* ``length``: ``check-trace`` and ``check-events`` on one 64-block pool over 10^4, 10^5 and 10^6 calls, with
  the process's peak memory (target: flat).

Targets (issue 22): largest over smallest at most 2x for the sizes and the lengths.

    python benchmarks/oracle_scale.py [--calls 20000] [--sizes 64,4096,65536,1048576]
                                      [--lengths 10000,100000,1000000]
"""

from __future__ import annotations

import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser

from kvpool.impl import BlockPool
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.model import OPERATIONS, initial_state
from kvpool.model.state import PoolState
from kvpool.oracle.core.lockstep import Lockstep
from kvpool.oracle.events.check import check_stream, load_events
from kvpool.oracle.events.warnings import add_warnings
from kvpool.oracle.trace import check_trace
from kvpool.oracle.trace.write import encode_args, encode_model_result, model_event_to_json

HBS = 16
Call = Callable[..., Any]


WORKING_SET = 64
"""Blocks the workload runs in, whatever the pool's size: the rest are held by one resident
request from the start, so that every size sees the same traffic (as full, as many evictions)."""


class Serving:
    """vLLM's KV-cache manager in miniature, on one pool, through ``call(op, *args)``."""

    def __init__(self, seed: int, call: Call, num_blocks: int, lookup: Callable[[bytes], int | None]):
        self.rng = random.Random(seed)
        self.call, self.lookup = call, lookup
        resident = num_blocks - WORKING_SET
        while resident > 0:  # held for the whole run, in batches a call can take
            got = self.call("get_new_blocks", min(resident, 4096))
            resident -= len(got)
        self.hasher = get_request_block_hasher(HBS)
        self.prompts = [[self.rng.randrange(32000) for _ in range(HBS * self.rng.randint(2, 24))]
                        for _ in range(64)]
        self.running: list[tuple[Request, list[int]]] = []
        self.next_id = 0

    def step(self) -> None:
        roll = self.rng.random()
        if self.running and (roll < 0.35 or len(self.running) > 24):
            self.finish()
        elif self.running and roll < 0.7:
            self.decode()
        else:
            self.admit()
        self.call("take_events")

    def admit(self) -> None:
        prompt = self.rng.choice(self.prompts)
        tail = [self.rng.randrange(32000) for _ in range(HBS * self.rng.randint(0, 4))]
        self.next_id += 1
        req = Request(f"r{self.next_id}", prompt + tail, block_hasher=self.hasher)
        hits = list(takewhile(lambda b: b is not None, map(self.lookup, req.block_hashes)))
        need = len(req.all_token_ids) // HBS - len(hits) + 1
        if hits:
            self.call("touch", hits)
        if need > self.call("get_num_free_blocks"):  # the pool is full: give the hits back
            if hits:
                self.call("free_blocks", hits[::-1])
            self.finish()
            return
        fresh = self.call("get_new_blocks", need)
        table = hits + list(fresh)
        full = len(req.block_hashes)
        self.call("cache_full_blocks", req, table, len(hits), full, HBS, 0)
        self.running.append((req, table))

    def decode(self) -> None:
        req, table = self.rng.choice(self.running)
        req.append_output_token_ids([self.rng.randrange(32000) for _ in range(HBS)])
        if len(req.block_hashes) >= len(table):
            if not self.call("get_num_free_blocks"):
                return
            table += self.call("get_new_blocks", 1)
        cached = min(len(req.block_hashes), len(table)) - 1
        self.call("cache_full_blocks", req, table, cached, min(len(req.block_hashes), len(table)), HBS, 0)

    def finish(self) -> None:
        if not self.running:
            return
        _req, table = self.running.pop(self.rng.randrange(len(self.running)))
        self.call("free_blocks", table[::-1])


def _index_lookup(s: PoolState) -> Callable[[bytes], int | None]:
    """A prefix hit in the model's index (group 0): the block a lookup returns, or None."""

    def lookup(h: bytes) -> int | None:
        hit = s.index.get((h, 0))
        return hit[0] if hit else None

    return lookup


def _model_driver(num_blocks: int) -> tuple[Call, Callable[[bytes], int | None], PoolState]:
    s = initial_state(num_blocks, True, HBS, True)

    def call(op: str, *args: Any) -> Any:
        decl = OPERATIONS[op]
        return decl.run(s, decl.bind(args))

    return call, _index_lookup(s), s


def _per_call(call: Call, lookup: Callable[[bytes], int | None], num_blocks: int, calls: int) -> float:
    """CPU seconds per call of the workload through ``call``, over at least ``calls`` calls (the
    resident request's allocation left out)."""
    counted = 0

    def counting(op: str, *args: Any) -> Any:
        nonlocal counted
        counted += 1
        return call(op, *args)

    work = Serving(0, counting, num_blocks, lookup)
    counted = 0
    start = time.process_time()
    while counted < calls:
        work.step()
    return (time.process_time() - start) / counted


def per_call_model(num_blocks: int, calls: int) -> float:
    return _per_call(*_model_driver(num_blocks)[:2], num_blocks, calls)


def per_call_pool(num_blocks: int, calls: int) -> float:
    """The baseline: the same workload on kvpool's pool alone."""
    pool = BlockPool(num_blocks, True, HBS, enable_kv_cache_events=True)

    def call(op: str, *args: Any) -> Any:
        if op in ("touch", "free_blocks"):
            args = ([pool.blocks[b] for b in args[0]],)
        elif op == "cache_full_blocks":
            args = (args[0], [pool.blocks[b] for b in args[1]], *args[2:])
        result = getattr(pool, op)(*args)
        return [b.block_id for b in result] if op == "get_new_blocks" else result

    def lookup(h: bytes) -> int | None:
        hit = pool.get_cached_block(h, [0])
        return hit[0].block_id if hit else None

    return _per_call(call, lookup, num_blocks, calls)


def per_call_lockstep(num_blocks: int, calls: int) -> float:
    pair = Lockstep.fresh(BlockPool, num_blocks, True, HBS, True)
    work = Serving(0, pair.call, num_blocks, _index_lookup(pair.model))
    pair.check()
    first = pair.steps
    start = time.process_time()
    while pair.steps - first < calls:
        work.step()
    pair.check()
    return (time.process_time() - start) / (pair.steps - first)


def write_trace(path: Path, num_blocks: int, calls: int) -> int:
    """The workload on the model, written as a trace (no observations); the number of calls."""
    call, lookup, s = _model_driver(num_blocks)
    written = [0]
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps({"kvpool_trace": 1, "num_blocks": num_blocks, "enable_caching": True,
                              "hash_block_size": HBS, "enable_kv_cache_events": True,
                              "medium": "GPU"}) + "\n")

        def recording(op: str, *args: Any) -> Any:
            line: dict[str, Any] = {"op": op, "args": encode_args(op, args, {})}
            result = call(op, *args)  # the workload makes no call the model refuses
            line["result"], line["error"] = encode_model_result(op, result), None
            line["events"] = [] if op == "take_events" else [model_event_to_json(e) for e in s.out.events]
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            written[0] += 1
            return result

        work = Serving(0, recording, num_blocks, lookup)
        while written[0] < calls:
            work.step()
    return written[0]


def checked(path: Path, num_blocks: int, calls: int) -> tuple[float, float, float, float]:
    """The workload on ``num_blocks`` blocks written as a trace at ``path``, then read: CPU seconds per
    call of check-trace, of parsing its JSON lines and of ``kvpool check-events`` (the router's reading,
    its warnings with the trace's replay), and the growth of the process's peak memory (MB) meanwhile."""
    calls = write_trace(path, num_blocks, calls)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    report = check_trace(path)
    check = time.process_time() - start
    if report.divergence or report.contract:
        raise SystemExit(f"{path}: the model's own trace diverged: {report.divergence or report.contract}")
    start = time.process_time()
    with path.open("rb") as fh:
        for raw in fh:
            json.loads(raw)
    parse = time.process_time() - start
    start = time.process_time()
    stream = load_events(path)
    events = add_warnings(check_stream(stream, str(path)), stream, path, stream.is_trace)
    if not events.ok:
        raise SystemExit(f"{path}: the model's own events broke a rule: {events.violations[:1]}")
    read = time.process_time() - start
    grown = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak, 0) / 1024
    path.unlink()
    return check / calls, parse / calls, read / calls, grown


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, calls=(20_000, "calls per size (default 20000)"), sizes="64,4096,65536,1048576",
                lengths="10000,100000,1000000")
    ap.add_argument("--only", choices=("model", "lockstep", "check-trace", "length"), action="append")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    only = set(args.only or ("model", "lockstep", "check-trace", "length"))
    print(f"python {sys.version.split()[0]}; {args.calls:,} calls per size; CPU seconds per call")
    with tempfile.TemporaryDirectory() as scratch:
        if only & {"model", "lockstep"}:
            bare = {n: per_call_pool(n, args.calls) for n in sizes}
            _rows("pool alone (baseline)", bare)
        for name, fn in (("model", per_call_model), ("lockstep", per_call_lockstep)):
            if name not in only:
                continue
            costs = {n: fn(n, args.calls) for n in sizes}
            _rows(name, costs)
            print(f"  {name} / the pool alone: "
                  + ", ".join(f"{n:,}: {costs[n] / bare[n]:.1f}x" for n in sizes))
        if "check-trace" in only:
            got = {n: checked(Path(scratch) / f"size-{n}.jsonl", n, args.calls) for n in sizes}
            _rows("check-trace", {n: g[0] for n, g in got.items()})
            _rows("check-events", {n: g[2] for n, g in got.items()})
            worst = max(g[0] / g[1] for g in got.values())
            print(f"  check-trace / parsing the same lines: at most {worst:.1f}x (target <= 15x)")
        if "length" in only:
            got = {c: checked(Path(scratch) / f"length-{c}.jsonl", 64, c) for c in lengths}
            _rows("length (64 blocks, calls): check-trace", {c: g[0] for c, g in got.items()})
            _rows("length (64 blocks, calls): check-events", {c: g[2] for c, g in got.items()})
            print("  peak memory growth while checking (check-trace, then check-events): "
                  + ", ".join(f"{c:,} calls +{g[3]:.1f} MB" for c, g in got.items()))
    return 0


def _rows(name: str, costs: dict[int, float]) -> None:
    smallest = costs[min(costs)]
    cells = ", ".join(f"{n:,}: {c * 1e6:.1f} us ({c / smallest:.2f}x)" for n, c in costs.items())
    print(f"{name}: {cells}; largest over smallest {max(costs.values()) / min(costs.values()):.2f}x "
          "(target <= 2x)")


if __name__ == "__main__":
    raise SystemExit(main())
