"""What one KV event costs to build and to free: kvpool's classes in both builds, and vLLM's.

A pool builds one ``BlockRemoved`` per evicted key and one ``BlockStored`` per caching
call; inside vLLM (kvpool's plugin) it builds vLLM's own msgspec classes instead, whose
cost is vLLM's.  Each row times ``--events`` events made one after another, then the
freeing of the list that holds them, best of ``--repeat``, in ns per event (the loop's
own call included, alike for every row).  ``class`` rows call the event class as a pool
does (kvpool's own classes positionally, vLLM's by keyword); ``builder`` rows run the
pool's whole builder: kvpool's ``block_removed`` / ``block_stored`` (with the extra keys
of a LoRA request's two blocks), with its own classes or, as under the plugin, vLLM's;
and vLLM's pool doing the same.  The collector is off.

    python benchmarks/event_cost.py [--events 2000] [--repeat 50]
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser
from pool_throughput import kvpool_pools
from workloads import BLOCK_SIZE, LoRA, Req, chain


def _cost(make: Callable[[int], Any], n: int, repeat: int) -> tuple[float, float]:
    """(build, free) in ns per event, best of ``repeat``."""
    build = free = float("inf")
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter_ns()
            kept = [make(i) for i in range(n)]
            mid = time.perf_counter_ns()
            del kept
            end = time.perf_counter_ns()
            build, free = min(build, (mid - start) / n), min(free, (end - mid) / n)
    finally:
        gc.enable()
    return build, free


Pair = tuple[Callable[[int], Any], Callable[[int], Any]]


def _classes(removed_cls: Any, stored_cls: Any, positional: bool, req: Req, hashes: list[int]) -> Pair:
    """The two classes called as a pool calls them: kvpool's own positionally, others by keyword."""
    tokens = req.all_token_ids[BLOCK_SIZE:3 * BLOCK_SIZE]
    keys = [("adapter",), ("adapter",)]
    if positional:
        return (lambda i: removed_cls([i], "GPU", 0),
                lambda i: stored_cls(hashes[1:3], hashes[0], tokens, BLOCK_SIZE, 1, "GPU", "adapter",
                                     keys, 0, None, None, None, None, "s"))
    return (lambda i: removed_cls(block_hashes=[i], medium="GPU", group_idx=0),
            lambda i: stored_cls(block_hashes=hashes[1:3], parent_block_hash=hashes[0], token_ids=tokens,
                                 block_size=BLOCK_SIZE, lora_id=1, medium="GPU", lora_name="adapter",
                                 extra_keys=keys, group_idx=0, session_id="s"))


def _builders(ev: Any, req: Req, hashes: list[int]) -> Pair:
    """kvpool's builders of event module ``ev``: a ``BlockStored`` of two blocks of a LoRA request."""
    def stored(i: int) -> Any:
        return ev.block_stored(req, hashes[1:3], hashes[0], BLOCK_SIZE, 3 * BLOCK_SIZE, BLOCK_SIZE, 0,
                               "GPU", ev.extra_keys_of_blocks(req, [1, 2], BLOCK_SIZE))

    return (lambda i: ev.block_removed(i, "GPU", 0)), stored


def _vllm_builders(req: Req, hashes: list[int]) -> Pair:
    """vLLM's pool building the same events (its extra keys, its event builder)."""
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    pool = importlib.import_module("vllm.v1.core.block_pool").BlockPool(4, True, BLOCK_SIZE, True)
    removed_cls = importlib.import_module("vllm.distributed.kv_events").BlockRemoved

    def stored(i: int) -> Any:
        keys = [utils.generate_block_hash_extra_keys(req, b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE, 0)[0]
                for b in (1, 2)]
        return pool._build_block_stored_event(
            req, block_hashes=hashes[1:3], parent_block_hash=hashes[0], start_token_idx=BLOCK_SIZE,
            end_token_idx=3 * BLOCK_SIZE, block_size=BLOCK_SIZE, kv_cache_group_id=0, extra_keys_list=keys)

    return (lambda i: removed_cls(block_hashes=[i], medium=pool.medium, group_idx=0)), stored


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, events=2000, repeat=50).parse_args(argv)

    tokens = list(range(4 * BLOCK_SIZE))
    req = Req("r", tokens, chain(tokens), lora_request=LoRA("adapter", 1, "/a"), session_id="s")
    hashes = [int.from_bytes(h[-8:], "big") for h in req.block_hashes]
    modules = {name: importlib.import_module(cls.__module__.rsplit(".", 1)[0] + ".events")
               for name, cls in kvpool_pools().items()}
    try:
        vllm_events: Any = importlib.import_module("vllm.distributed.kv_events")
    except Exception as exc:  # vLLM absent: kvpool's own classes only
        print(f"vLLM not importable ({type(exc).__name__}); kvpool's classes only")
        vllm_events = None

    # (label, event module whose classes switch to vLLM's for the row, the two makers)
    rows: list[tuple[str, Any, Pair]] = [
        (f"class: kvpool's, {name}", None, _classes(ev.BlockRemoved, ev.BlockStored, True, req, hashes))
        for name, ev in modules.items()]
    if vllm_events is not None:
        rows.append(("class: vLLM's", None,
                     _classes(vllm_events.BlockRemoved, vllm_events.BlockStored, False, req, hashes)))
    rows += [(f"builder: kvpool {name}, its classes", None, _builders(ev, req, hashes))
             for name, ev in modules.items()]
    if vllm_events is not None:
        rows += [(f"builder: kvpool {name}, vLLM's classes", ev, _builders(ev, req, hashes))
                 for name, ev in modules.items()]
        rows.append(("builder: vLLM's pool", None, _vllm_builders(req, hashes)))

    print(f"{'ns per event':<40}{'BlockRemoved':>14}{'free':>8}{'BlockStored':>14}{'free':>8}")
    for label, switch, (removed, stored) in rows:
        previous = switch.use_vllm_event_classes() if switch is not None else None
        try:
            rb, rf = _cost(removed, args.events, args.repeat)
            sb, sf = _cost(stored, args.events, args.repeat)
        finally:
            if previous is not None:
                switch.use_event_classes(*previous)
        print(f"{label:<40}{rb:>14.1f}{rf:>8.1f}{sb:>14.1f}{sf:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
