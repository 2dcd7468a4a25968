"""Drop-in: vLLM's own BlockPool and kvpool's, driven with the same inputs.

Skipped unless vLLM is importable (``scripts/install-vllm.sh`` makes it so on a
CPU-only machine; CI runs this file in that environment).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from vllm_helpers import REASON, vllm_pool, vllm_requests  # skips this module without vLLM

from kvpool.impl import BlockPool, UnknownBlockError
from kvpool.impl.events import event_fields, use_event_classes, use_vllm_event_classes
from kvpool.oracle.core.abstraction import vllm_refusal
from kvpool.oracle.core.observe import observe_pool
from kvpool.oracle.search.campaign import run_campaign

vllm_lora = pytest.importorskip("vllm.lora.request", reason=REASON)

HBS = 4
vllm_request_for = vllm_requests(HBS)


class Both:
    """The two pools side by side; ``call`` names blocks by id and compares everything."""

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.pools = [
            vllm_pool.BlockPool(num_blocks, caching, HBS, enable_kv_cache_events=True),
            BlockPool(num_blocks, caching, HBS, enable_kv_cache_events=True),
        ]

    def call(self, op: str, *args: Any, blocks_at: tuple[int, ...] = ()) -> Any:
        results = []
        for pool in self.pools:
            real = [
                ([pool.blocks[i] for i in a] if isinstance(a, list) else pool.blocks[a])
                if pos in blocks_at else a
                for pos, a in enumerate(args)
            ]
            out = getattr(pool, op)(*real)
            if isinstance(out, list) and out and hasattr(out[0], "block_id"):
                out = [b.block_id for b in out]
            elif isinstance(out, list) and out:
                out = [event_fields(e) for e in out]
            results.append(out)
        vllm_out, kv_out = results
        assert kv_out == vllm_out, op
        assert observe_pool(self.pools[1]) == observe_pool(self.pools[0]), op
        assert [event_fields(e) for e in self.pools[1].kv_event_queue] == [
            event_fields(e) for e in self.pools[0].kv_event_queue], op
        return kv_out


def test_same_calls_same_results_events_and_state_with_real_vllm_requests() -> None:
    both = Both(16)
    lora = vllm_lora.LoRARequest("adapter", 3, "/weights")
    a = vllm_request_for("a", list(range(18)), lora_request=lora, cache_salt="salt",
                         session_id="s1")
    b = vllm_request_for("b", list(range(18)), lora_request=lora, cache_salt="salt")
    blocks = both.call("get_new_blocks", 5)
    both.call("cache_full_blocks", a, blocks, 0, 4, HBS, 0, blocks_at=(1,))
    both.call("cache_partial_block", a, blocks[1], 4, 1, 2 * HBS, blocks_at=(1,))
    both.call("free_blocks", list(reversed(blocks)), blocks_at=(0,))
    filler = both.call("get_new_blocks", 12)  # hands out block 4: its hash goes now
    hits: list[int] = []
    for block_hash in b.block_hashes:
        found = both.call("get_cached_block", block_hash, [0])
        if found is None:
            break
        hits += found
    assert hits == blocks[:3]
    both.call("touch", hits, blocks_at=(0,))
    both.call("emit_cached_block_events", b, len(hits), HBS, 0)
    both.call("free_blocks", filler, blocks_at=(0,))
    fresh = both.call("get_new_blocks", 2)
    both.call("cache_full_blocks", b, hits + fresh, 3, 4, HBS, 0, blocks_at=(1,))
    both.call("unpin_blocks", fresh[:1], lambda blk: None, blocks_at=(0,))
    both.call("evict_blocks", {hits[0]})
    both.call("take_events")
    both.call("free_blocks", hits + fresh[1:], blocks_at=(0,))
    assert both.call("reset_prefix_cache") is True
    both.call("take_events")
    assert both.call("get_usage") == 0.0


def test_block_mask_and_coarser_groups_match_vllm() -> None:
    both = Both(10)
    req = vllm_request_for("m", list(range(24)), session_id="s")
    blocks = both.call("get_new_blocks", 3)
    both.call("cache_full_blocks", req, blocks, 0, 3, 2 * HBS, 1, [True, False, True],
              blocks_at=(1,))
    both.call("move_block_hashes", blocks[0], both.call("get_new_blocks", 1)[0],
              blocks_at=(0, 1))
    both.call("take_events")


@pytest.mark.parametrize("seed", [0, 100])
def test_model_agrees_with_vllm_on_the_lockstep_workload(seed: int) -> None:
    out = io.StringIO()
    factory: Callable[..., Any] = vllm_pool.BlockPool
    status = run_campaign(factory, steps=1500, runs=6, seed=seed, out=out, misuse=False,
                          errors_match=vllm_refusal)
    assert status == 0, out.getvalue()


def _manager_run(pool_class: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Drive vLLM's KVCacheManager on real Requests; record block tables and events."""
    torch = pytest.importorskip("torch")
    coordinator = pytest.importorskip("vllm.v1.core.kv_cache_coordinator")
    manager_mod = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    spec = pytest.importorskip("vllm.v1.kv_cache_interface")
    monkeypatch.setattr(coordinator, "BlockPool", pool_class)
    config = spec.KVCacheConfig(num_blocks=12, kv_cache_tensors=[], kv_cache_groups=[
        spec.KVCacheGroupSpec(["layer0"], spec.FullAttentionSpec(
            block_size=HBS, num_kv_heads=1, head_size=8, dtype=torch.float32))])
    manager = manager_mod.KVCacheManager(
        config, max_model_len=64, scheduler_block_size=HBS, hash_block_size=HBS,
        enable_caching=True, enable_kv_cache_events=True)
    assert type(manager.block_pool) is pool_class
    seen: list[Any] = []

    def admit(rid: str, tokens: list[int]) -> Any:
        req = vllm_request_for(rid, tokens)
        computed, num_computed, *_ = manager.get_computed_blocks(req)
        out = manager.allocate_slots(req, len(tokens) - num_computed, num_computed, computed)
        seen.append((rid, num_computed, None if out is None else out.get_block_ids()))
        if out is not None:
            req.num_computed_tokens = len(tokens)
        return req

    def decode(req: Any, token: int) -> None:
        req.append_output_token_ids([token])
        out = manager.allocate_slots(req, 1)
        seen.append((req.request_id, "decode", None if out is None else out.get_block_ids()))
        req.num_computed_tokens += 1

    def note() -> None:
        seen.append(("usage", manager.usage, [event_fields(e) for e in manager.take_events()]))

    prompt = list(range(100, 111))
    a = admit("a", prompt)
    for t in range(5):
        decode(a, 7 + t)
    note()
    b = admit("b", [*prompt, 1, 2])  # shares a's prefix: a cache hit
    note()
    manager.free(a)  # finished
    c = admit("c", [*prompt[:8], 9, 9, 9, 9, 9])  # hits a's first blocks, now idle
    note()
    manager.free(b)  # preempted: its blocks go back, cached ones stay cached
    b2 = admit("b2", [*prompt, 1, 2])
    note()
    for req in (c, b2):
        manager.free(req)
    admit("d", list(range(500, 540)))  # needs evictions of cached blocks
    note()
    return seen


def test_kv_cache_manager_gives_the_same_block_tables_and_events_with_kvpool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_vllm = _manager_run(vllm_pool.BlockPool, monkeypatch)
    previous = use_vllm_event_classes()  # the manager annotates vLLM's event classes
    try:
        with_kvpool = _manager_run(BlockPool, monkeypatch)
    finally:
        use_event_classes(*previous)
    assert with_kvpool == with_vllm
    assert any(isinstance(step[1], int) and step[1] > 0 for step in with_vllm)  # hits happened


def test_touching_another_pools_idle_block_corrupts_vllm_and_is_refused_by_kvpool() -> None:
    """The README's reason for touch's ownership test, shown on vLLM itself."""
    mine, theirs = vllm_pool.BlockPool(4, True, HBS), vllm_pool.BlockPool(4, True, HBS)
    idle = theirs.blocks[2]
    mine.touch([idle])
    # vLLM unlinked the block from the other pool's queue but counted it out of its own.
    assert mine.get_num_free_blocks() == 2 and len(mine.free_block_queue.get_all_free_blocks()) == 3
    assert theirs.get_num_free_blocks() == 3
    assert all(b is not idle for b in theirs.free_block_queue.get_all_free_blocks())

    mine_k, theirs_k = BlockPool(4, True, HBS), BlockPool(4, True, HBS)
    with pytest.raises(UnknownBlockError):
        mine_k.touch([theirs_k.blocks[2]])
    assert mine_k.get_num_free_blocks() == 3 and theirs_k.get_num_free_blocks() == 3
    assert any(b is theirs_k.blocks[2] for b in theirs_k.free_block_queue.get_all_free_blocks())
