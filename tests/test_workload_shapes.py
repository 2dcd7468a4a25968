"""Both generators make every legal shape of a call, with misuse on and off.

A pool can be wrong on one shape only: a ``free_blocks`` that queued a block
once per listing passed 159,370 calls because no call listed a block twice.
So the shapes are counted as the pool sees them (a pool subclass that looks
at each call it is asked to make and counts the shapes of those it
accepts), on a few seeds of the campaign and a settings-limited run of the
state machine, and each must occur.  vLLM 0.33's partial entries at a
block's end are counted with :class:`Pool033`, kvpool's pool taught 0.33's
two differences for these tests only (kvpool's pool is a 0.31 drop-in).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from kvpool.impl import BlockPool
from kvpool.oracle.core.adapter import ClassAdapter
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.search.machine import machine_for


class Pool033(BlockPool):
    """kvpool's pool taught vLLM 0.33's two differences, for tests only.

    ``touch`` and ``free_blocks`` leave the null block's counter alone, and a
    partial entry may end at a block's end (0.31 asserts it ends inside one).
    """

    def touch(self, blocks: Sequence[Any]) -> None:
        super().touch([b for b in blocks if not getattr(b, "is_null", False)])

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        super().free_blocks([b for b in ordered_blocks if not getattr(b, "is_null", False)])

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int, kv_cache_group_id: int,
                            block_size: int, replace_existing_hashes: bool = False) -> Any:
        hbs = self.hash_block_size
        whole = all(isinstance(v, int) and v > 0 and v % hbs == 0 for v in (num_tokens, block_size))
        if whole and num_tokens % block_size == 0 and not replace_existing_hashes:
            block_size = num_tokens + hbs  # passes 0.31's inside-a-block check, its only use here
        return super().cache_partial_block(request, block, num_tokens, kv_cache_group_id, block_size,
                                           replace_existing_hashes)


SHAPES = (
    "free lists a block twice", "touch lists a block twice", "unpin lists a block twice",
    "free: another pool's blocks only", "free: another pool's blocks and own ones",
    "request: several multimodal items", "request: a multimodal item shorter than a hash chunk",
    "request: adjacent multimodal items", "request: a hash chunk over several items",
    "events on: LoRA", "events on: cache salt", "events on: multimodal", "events on: session id",
    "cache_full_blocks with num_cached_blocks > num_full_blocks", "cache_full_blocks with a block mask",
    "cache_partial_block replacing a writable block's hashes", "cache_partial_block on the null block",
    "move_block_hashes of an unhashed block", "touch of the null block",
    "metrics collector told", "events on", "events off",
)
"""Each must occur in each phase, misuse on and off."""

INSIDE = {(2, 1), (3, 1), (3, 2)}
"""Partial entries inside a block at every chunk boundary: (chunks per block, chunks in)."""


def shape_pool(counts: Counter[str], base: type[BlockPool] = BlockPool) -> type[BlockPool]:
    """``base`` counting the shapes of the calls it accepts (a refused call counts nothing)."""

    class Shapes(base):  # type: ignore[valid-type,misc]
        def _count(self, shapes: list[str]) -> None:
            shapes.append("events on" if self.enable_kv_cache_events else "events off")
            collector = self.metrics_collector
            if collector is not None and getattr(collector, "log", None):
                shapes.append("metrics collector told")
            counts.update(shapes)

        def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
            blocks = list(ordered_blocks)
            foreign = [b for b in blocks if b.pool is not self]
            super().free_blocks(blocks)
            self._count(_twice("free", blocks) + (
                [] if not foreign else ["free: another pool's blocks only"] if len(foreign) == len(blocks)
                else ["free: another pool's blocks and own ones"]))

        def touch(self, blocks: Sequence[Any]) -> None:
            super().touch(blocks)
            null = ["touch of the null block"] * any(b.is_null for b in blocks)
            self._count(_twice("touch", blocks) + null)

        def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Any) -> None:
            blocks = list(blocks)
            super().unpin_blocks(blocks, on_reuse)
            self._count(_twice("unpin", blocks))

        def cache_full_blocks(self, request: Any, blocks: list[Any], num_cached_blocks: int,
                              num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                              block_mask: list[bool] | None = None) -> None:
            super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, block_size,
                                      kv_cache_group_id, block_mask)
            shapes = self._request(request)
            if num_cached_blocks > num_full_blocks:
                shapes.append("cache_full_blocks with num_cached_blocks > num_full_blocks")
            if block_mask is not None and not all(block_mask):
                shapes.append("cache_full_blocks with a block mask")
            self._count(shapes)

        def cache_partial_block(self, request: Any, block: Any, num_tokens: int, kv_cache_group_id: int,
                                block_size: int, replace_existing_hashes: bool = False) -> Any:
            writable = self.is_block_writable(block)
            key = super().cache_partial_block(request, block, num_tokens, kv_cache_group_id, block_size,
                                              replace_existing_hashes)
            shapes = self._request(request)
            hbs = self.hash_block_size
            if block.is_null:
                shapes.append("cache_partial_block on the null block")
            elif replace_existing_hashes:
                shapes.append("cache_partial_block replacing a writable block's hashes" * writable
                              or "cache_partial_block replacing a shared block's hashes")
            else:
                into = (num_tokens - 1) % block_size + 1  # tokens of the entry inside its block
                shapes.append(f"partial entry: {block_size // hbs} chunk(s) a block, {into // hbs} in")
            self._count(shapes)
            return key

        def emit_cached_block_events(self, request: Any, num_cached_blocks: int, block_size: int,
                                     kv_cache_group_id: int) -> None:
            super().emit_cached_block_events(request, num_cached_blocks, block_size, kv_cache_group_id)
            self._count(self._request(request))

        def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
            unhashed = src_block.block_hash is None
            super().move_block_hashes(src_block, dst_block)
            self._count(["move_block_hashes of an unhashed block"] * unhashed)

        def _request(self, request: Any) -> list[str]:
            shapes = _request_shapes(request, self.hash_block_size)
            if self.enable_kv_cache_events:
                shapes += [f"events on: {s}" for s in ("LoRA", "cache salt", "multimodal", "session id")
                           if s in shapes]
            return shapes

    return Shapes


def _twice(what: str, blocks: list[Any]) -> list[str]:
    listed = Counter(id(b) for b in blocks if not b.is_null)
    return [f"{what} lists a block twice"] if any(n > 1 for n in listed.values()) else []


def _request_shapes(request: Any, hbs: int) -> list[str]:
    """What a request carries besides its tokens, and how its multimodal items lie."""
    shapes = ["LoRA"] * bool(request.lora_request) + ["cache salt"] * bool(request.cache_salt)
    shapes += ["session id"] * bool(request.session_id)
    items = [(f.mm_position.offset, f.mm_position.length) for f in request.mm_features or ()]
    if items:
        shapes.append("multimodal")
    if len(items) > 1:
        shapes.append("request: several multimodal items")
    if any(length < hbs for _, length in items):
        shapes.append("request: a multimodal item shorter than a hash chunk")
    if any(a + n == b for (a, n), (b, _) in itertools.pairwise(items)):
        shapes.append("request: adjacent multimodal items")
    chunks = Counter(c for a, n in items for c in range(a // hbs, (a + n - 1) // hbs + 1))
    if any(k > 1 for k in chunks.values()):
        shapes.append("request: a hash chunk over several items")
    return shapes


def _inside(counts: Counter[str]) -> set[tuple[int, int]]:
    """(chunks per block, chunks in) of the partial entries made."""
    out = set()
    for name in counts:
        if name.startswith("partial entry: "):
            per, into = (int(w) for w in name.split() if w.isdigit())
            out.add((per, into))
    return out


def _campaign(counts: Counter[str], misuse: bool, base: type[BlockPool] = BlockPool,
              reference: str = "0.31") -> None:
    pool = shape_pool(counts, base)
    for seed in range(4):  # kvpool conform's default campaign: four runs of 1000 steps
        run_one(pool, seed, 1000, misuse=misuse, reference=reference)


def _machine(counts: Counter[str], misuse: bool, base: type[BlockPool] = BlockPool,
             reference: str = "0.31") -> None:
    adapter = ClassAdapter(shape_pool(counts, base), "shapes")
    machine = machine_for(adapter, misuse=misuse, reference=reference)
    hypothesis_seed(0)(machine)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=300, stateful_step_count=25, deadline=None, database=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))


@pytest.mark.parametrize("misuse", [False, True], ids=["no-misuse", "misuse"])
@pytest.mark.parametrize("phase", [_campaign, _machine], ids=["campaign", "machine"])
def test_every_shape_occurs(phase: Any, misuse: bool) -> None:
    counts: Counter[str] = Counter()
    phase(counts, misuse)
    missing = [s for s in SHAPES if not counts[s]]
    assert not missing, f"never made: {missing}"
    assert _inside(counts) >= INSIDE, sorted(_inside(counts))
    assert not {per for per, into in _inside(counts) if into == per}, "a block-end entry under 0.31"


@pytest.mark.parametrize("phase", [_campaign, _machine], ids=["campaign", "machine"])
def test_vllm_033_partial_entries_end_at_block_ends_too(phase: Any) -> None:
    """Under ``--reference 0.33`` partial entries end at a block's end too, and a 0.33 pool agrees."""
    counts: Counter[str] = Counter()
    phase(counts, False, Pool033, "0.33")
    ends = {per for per, into in _inside(counts) if into == per}
    assert {1, 2, 3} <= ends, sorted(_inside(counts))
    assert _inside(counts) >= INSIDE


def test_the_second_pool_stays_out_of_recorded_traces() -> None:
    """The trace format names one pool's blocks: a recorded run makes no call across pools."""
    from kvpool.oracle.trace.record import record

    counts: Counter[str] = Counter()
    for seed in range(3):
        rec = record(shape_pool(counts), seed, 600, observe=False)
        assert rec.divergence is None
    assert not counts["free: another pool's blocks only"] + counts["free: another pool's blocks and own ones"]
    assert counts["free lists a block twice"] and counts["cache_partial_block on the null block"]
