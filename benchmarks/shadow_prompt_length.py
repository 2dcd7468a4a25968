"""The shadow's cost per cached block against the length of one prompt: flat from 1,024 to 16,384 blocks.

    python benchmarks/shadow_prompt_length.py [--pool kvpool|vllm] [--sizes 1024,2048,4096,8192,16384]

One request's prompt of N blocks (block size 16) is cached as chunked prefill
caches it: ``get_new_blocks`` and ``cache_full_blocks`` 512 blocks a call,
then freed.  Each size runs on a fresh pool of N + 1 blocks three ways: bare,
under the shadow checking on the calling thread (``KVPOOL_SHADOW_CHECK=inline``:
the model, its caller contracts and the footprint, in this thread's CPU time),
and under the default shadow (a checker process: this thread's time is the
engine's; the checker's is read from its totals).  Printed: CPU time per
cached block of each, and the ratio of the largest size to the smallest
(target: at most 1.5, the cost of a call independent of the prompt's length;
the caller-contract check walked each fresh block's prefix back to the root
before, 0.91 s against 0.006 s bare at 8,192 blocks).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import met, parser

CHUNK = 512
BLOCK = 16


def pool_and_request(name: str) -> tuple[Any, Callable[[int], Any]]:
    """The pool class ``name`` names, and a maker of a request of N blocks for it (imported lazily:
    vLLM only when asked for, kvpool's beside it the same way)."""
    if name == "vllm":
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request as VllmRequest

        init_none_hash(sha256)
        return BlockPool, lambda blocks: VllmRequest(
            "r", list(range(blocks * BLOCK)), SamplingParams(max_tokens=1), None,
            block_hasher=get_request_block_hasher(BLOCK, sha256))
    from kvpool.impl import BlockPool, Request, get_request_block_hasher

    return BlockPool, lambda blocks: Request("r", list(range(blocks * BLOCK)),
                                             block_hasher=get_request_block_hasher(BLOCK))


def prefill(pool: Any, req: Any, blocks: int) -> float:
    """CPU seconds of this thread to cache the prompt chunk by chunk, then free it."""
    started = time.thread_time()
    held: list[Any] = []
    for done in range(0, blocks, CHUNK):
        held += pool.get_new_blocks(min(CHUNK, blocks - done))
        pool.cache_full_blocks(req, held, done, len(held), BLOCK, 0)
    pool.free_blocks(held[::-1])
    return time.thread_time() - started


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, sizes="1024,2048,4096,8192,16384")
    ap.add_argument("--pool", choices=("kvpool", "vllm"), default="kvpool")
    args = ap.parse_args(argv)
    os.environ.setdefault("KVPOOL_SHADOW_DIR", tempfile.mkdtemp(prefix="kvpool-prompt-length-"))
    # lazy: after the shadow's directory is set
    from kvpool.oracle import shadow as sh

    cls, request = pool_and_request(args.pool)
    sizes = [int(s) for s in args.sizes.split(",")]
    os.environ[sh.ENV_CHECK] = "process"
    prefill(sh.ShadowPool(cls(9, True, BLOCK)), request(8), 8)  # the checker process started
    sh.sync()
    rows = []
    for blocks in sizes:
        req = request(blocks)
        bare = prefill(cls(blocks + 1, True, BLOCK), req, blocks)
        os.environ[sh.ENV_CHECK] = "inline"
        inline = prefill(sh.ShadowPool(cls(blocks + 1, True, BLOCK), strict=True), req, blocks)
        os.environ[sh.ENV_CHECK] = "process"
        before = sh.sync().get("cpu", 0.0)
        engine = prefill(sh.ShadowPool(cls(blocks + 1, True, BLOCK)), req, blocks)
        totals = sh.sync()
        if totals.get("divergences") or totals.get("findings"):
            raise SystemExit(f"the shadow found something at {blocks} blocks: {totals['findings']}")
        checker = totals["cpu"] - before
        rows.append((blocks, *(1e6 * t / blocks for t in (bare, inline, engine, checker))))
    print(f"one prompt cached {CHUNK} blocks a call, {args.pool}'s pool, CPU time per cached block (us)")
    print(f"{'blocks':>7} {'bare':>8} {'inline shadow':>14} {'engine (process)':>17} {'checker process':>16}")
    for blocks, bare_us, inline_us, engine_us, checker_us in rows:
        print(f"{blocks:7d} {bare_us:8.1f} {inline_us:14.1f} {engine_us:17.1f} {checker_us:16.1f}")
    first, last = rows[0], rows[-1]
    ratio = max(last[2] / first[2], last[4] / first[4])
    print(f"largest / smallest prompt, per block: inline {last[2] / first[2]:.2f}, checker process "
          f"{last[4] / first[4]:.2f} (target at most 1.5: {met(ratio <= 1.5)})")
    sh.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
