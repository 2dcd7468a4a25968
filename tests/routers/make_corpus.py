"""Write the router regression corpus: the smallest call sequences where a router's index goes wrong.

Each case is a few calls on kvpool's pool, recorded with the model in lockstep
(every line carries the pool's observation), so ``kvpool check-trace`` accepts
it and the pool's index after each call is known.  The expected verdict of
each router profile on each case is written by hand in
``tests/test_routers.py``, which also checks that this script reproduces the
committed files byte for byte.

    .venv/bin/python tests/routers/make_corpus.py   # rewrites tests/routers/*.jsonl
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.impl import BlockPool
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.oracle.trace import Recording, RecordingLockstep, recording_pair

HERE = Path(__file__).resolve().parent
NULL = 0


class Case:
    """A pool of a few blocks and a request maker sharing its hash block size."""

    def __init__(self, num_blocks: int = 8, hbs: int = 2, block_sizes: dict[int, int] | None = None):
        self.pair: RecordingLockstep
        self.pair, self.header = recording_pair(BlockPool, num_blocks, True, hbs, True,
                                                block_sizes=block_sizes or {0: hbs})
        self.hasher = get_request_block_hasher(hbs)

    def request(self, rid: str, tokens: list[int], **kw: Any) -> Request:
        return Request(rid, tokens, block_hasher=self.hasher, **kw)

    def call(self, op: str, *args: Any) -> Any:
        return self.pair.call(op, *args)

    def recording(self) -> Recording:
        return Recording(self.header, self.pair.lines, None)


def reannounce() -> Recording:
    """A prefix hit re-announced by emit_cached_block_events, then evicted: stored, stored, removed."""
    c = Case()
    r1 = c.request("r1", [1, 2, 3, 4])
    blocks = c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", r1, blocks, 0, 2, 2, 0)
    c.call("touch", blocks)  # r2 hits both blocks ...
    c.call("emit_cached_block_events", c.request("r2", [1, 2, 3, 4, 5]), 2, 2, 0)  # ... announced again
    c.call("free_blocks", blocks[::-1])
    c.call("free_blocks", blocks[::-1])
    c.call("evict_blocks", blocks)  # both entries go: one BlockRemoved each
    return c.recording()


def second_copy() -> Recording:
    """Two requests cache the same prefix in their own blocks; one copy is evicted, one stays."""
    c = Case()
    first, second = c.call("get_new_blocks", 2), c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", c.request("r1", [1, 2, 3, 4]), first, 0, 2, 2, 0)
    c.call("cache_full_blocks", c.request("r2", [1, 2, 3, 4]), second, 0, 2, 2, 0)
    c.call("free_blocks", first[::-1])
    c.call("evict_blocks", [first[0]])  # one copy of the first key goes; the other is still served
    return c.recording()


def clear() -> Recording:
    """reset_prefix_cache: one AllBlocksCleared for a non-empty index, no removals."""
    c = Case()
    blocks = c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", c.request("r1", [1, 2, 3, 4]), blocks, 0, 2, 2, 0)
    c.call("free_blocks", blocks[::-1])
    c.call("reset_prefix_cache")
    return c.recording()


def evicted_parent() -> Recording:
    """A parent evicted, then its child cached by the same request, then the parent cached again."""
    c = Case()
    r1 = c.request("r1", [1, 2, 3, 4])
    blocks = c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", r1, blocks, 0, 1, 2, 0)
    c.call("evict_blocks", [blocks[0]])
    c.call("cache_full_blocks", r1, blocks, 1, 2, 2, 0)  # names the evicted key as its parent
    c.call("cache_full_blocks", c.request("r2", [1, 2, 3, 4]), c.call("get_new_blocks", 1), 0, 1, 2, 0)
    return c.recording()


def null_block() -> Recording:
    """A block table starting with the null block: its hash is skipped, its tokens are not."""
    c = Case()
    c.call("cache_full_blocks", c.request("r1", [1, 2, 3, 4]), [NULL, *c.call("get_new_blocks", 1)],
           0, 2, 2, 0)
    return c.recording()


def empty_store() -> Recording:
    """A range of null blocks only: a BlockStored with no hash and four tokens."""
    c = Case()
    c.call("cache_full_blocks", c.request("r1", [5, 6, 7, 8]), [NULL, NULL], 0, 2, 2, 0)
    return c.recording()


def self_reference() -> Recording:
    """The null-block store, then the same prefix cached in real blocks by another request."""
    c = Case()
    c.call("cache_full_blocks", c.request("r1", [1, 2, 3, 4]), [NULL, *c.call("get_new_blocks", 1)],
           0, 2, 2, 0)
    c.call("cache_full_blocks", c.request("r2", [1, 2, 3, 4]), c.call("get_new_blocks", 2), 0, 2, 2, 0)
    return c.recording()


def groups_equal() -> Recording:
    """Two KV-cache groups with one block size: one 64-bit hash in both; group 1's copy is evicted."""
    c = Case(block_sizes={0: 2, 1: 2})
    r1 = c.request("r1", [1, 2, 3, 4])
    g0, g1 = c.call("get_new_blocks", 2), c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", r1, g0, 0, 2, 2, 0)
    c.call("cache_full_blocks", r1, g1, 0, 2, 2, 1)
    c.call("evict_blocks", [g1[0]])
    return c.recording()


def groups_sizes() -> Recording:
    """Block sizes 4 and 2 (hash block size 2): group 0's hashes are group 1's every other one."""
    c = Case(num_blocks=10, block_sizes={0: 4, 1: 2})
    r1 = c.request("r1", [1, 2, 3, 4, 5, 6, 7, 8])
    g0, g1 = c.call("get_new_blocks", 2), c.call("get_new_blocks", 4)
    c.call("cache_full_blocks", r1, g0, 0, 2, 4, 0)
    c.call("cache_full_blocks", r1, g1, 0, 4, 2, 1)
    c.call("evict_blocks", [g1[1]])  # the group-1 block whose hash is group 0's first
    return c.recording()


def sliding_window() -> Recording:
    """Group 1 a sliding window: its table starts with the null block; then group 0's first block goes."""
    c = Case(block_sizes={0: 2, 1: 2})
    r1 = c.request("r1", [1, 2, 3, 4])
    g0 = c.call("get_new_blocks", 2)
    c.call("cache_full_blocks", r1, g0, 0, 2, 2, 0)
    c.call("cache_full_blocks", r1, [NULL, *c.call("get_new_blocks", 1)], 0, 2, 2, 1)
    c.call("evict_blocks", [g0[0]])
    return c.recording()


CASES: dict[str, Callable[[], Recording]] = {
    "reannounce": reannounce, "second_copy": second_copy, "clear": clear,
    "evicted_parent": evicted_parent, "null_block": null_block, "empty_store": empty_store,
    "self_reference": self_reference, "groups_equal": groups_equal, "groups_sizes": groups_sizes,
    "sliding_window": sliding_window,
}


def write(folder: Path = HERE) -> list[Path]:
    out = []
    for name, make in CASES.items():
        path = folder / f"{name}.jsonl"
        make().write(path)
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
