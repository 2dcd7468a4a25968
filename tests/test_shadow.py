"""The shadow (``oracle/shadow.py``): a real pool's calls also run on the model, compared.

Without vLLM: kvpool's pool, its seeded bugs (``kvpool.bugs.pools``) and the
third-party pool of ``tests/third_party`` are shadowed and driven by the
workload; vLLM's own pool under the shadow is ``tests/test_vllm_plugin.py``.
Every run is bounded by its number of steps.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool.bugs import pools as seeded
from kvpool.impl import BlockPool, Request, get_request_block_hasher
from kvpool.oracle import shadow as sh
from kvpool.oracle.core.adapter import adapter_for_class
from kvpool.oracle.core.lockstep import Divergence, Lockstep
from kvpool.oracle.generate.runs import RunConfig
from kvpool.oracle.generate.workload import Workload
from kvpool.oracle.shadow import Shadow, ShadowDivergence, ShadowPool, shadow_of, shadowed_class
from kvpool.oracle.trace import check_trace

ROOT = Path(__file__).resolve().parent.parent


class Engine(Workload):
    """The workload as an engine with one pool plays it: no offload copies (their keys come from a
    pool the test does not have) and no second pool."""

    STEPS = tuple(s for s in Workload.STEPS if s[0] not in ("offload", "other_pool"))


def drive(pool_class: type, seed: int, steps: int, misuse: bool = False,
          check: bool = True) -> tuple[Any, Lockstep]:
    """A pool of ``pool_class`` played by the seeded workload, whose own lockstep compares the pool
    with a second model too (a difference it finds fails the run if ``check``)."""
    rng = random.Random(seed)
    cfg = RunConfig.draw(rng, seed)
    made: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        made.append(pool_class(*args, **kwargs))
        return made[-1]

    pair = Lockstep.fresh(factory, cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events)
    pair.errors_match = adapter_for_class(pool_class).errors_match
    # no key copied from elsewhere, misuse included: no pool here knows what such a key names
    pair.supports = lambda op: op != "_insert_block_hash" and Lockstep.supports(pair, op)  # type: ignore[method-assign]
    work = Engine(rng, cfg, pair, misuse_on=misuse)
    for _ in range(steps):
        try:
            work.step()
        except Divergence:
            if check:
                raise
            break  # the workload's own model saw the bug too: the shadow is what is tested
        found = shadow_of(made[0])
        if found is not None and not found.active:
            break
    return made[0], pair


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(sh.ENV_DIR, str(tmp_path / "shadow"))
    monkeypatch.delenv(sh.ENV_STRICT, raising=False)
    monkeypatch.delenv(sh.ENV_KEEP, raising=False)
    logging.getLogger("kvpool").setLevel(logging.ERROR)  # refused resets warn
    logging.getLogger("kvpool.shadow").setLevel(logging.WARNING)


# ------------------------------------------------------------------ a correct pool


@pytest.mark.parametrize("misuse", [False, True])
def test_kvpools_pool_under_the_shadow_agrees(misuse: bool, tmp_path: Path) -> None:
    """The workload's lockstep also compares the shadowed pool with its own model: the shadow
    changes nothing the pool returns, and finds nothing."""
    Shadowed = shadowed_class(BlockPool, strict=True)
    for seed in range(4):
        pool, pair = drive(Shadowed, seed, 1500, misuse=misuse)
        found = shadow_of(pool)
        assert found is not None and found.active, found
        assert found.calls == pair.steps > 1000
    assert not list((tmp_path / "shadow").glob("*.jsonl"))  # nothing kept: nothing diverged


def test_a_kept_trace_replays_and_memory_stays_bounded(tmp_path: Path) -> None:
    Shadowed = shadowed_class(BlockPool, keep=True)
    pool, pair = drive(Shadowed, 5, 3000, misuse=True)
    found = shadow_of(pool)
    assert found is not None
    # what the shadow holds does not grow with the run: the lockstep's last calls, pending events
    assert len(found.pair.trace) <= 13 and found.pair.lines == [] and len(found.own) <= 4 * pair.steps
    calls = found.calls
    del pool, found, pair
    gc.collect()
    kept = list((tmp_path / "shadow").glob("*.jsonl"))
    assert len(kept) == 1
    report = check_trace(kept[0])
    assert report.ok and report.steps == calls, report.format()


def test_results_and_exceptions_go_back_unchanged() -> None:
    """The very objects the pool returned or raised, an iterator handed over as a list."""
    pool = ShadowPool(BlockPool(8, True, 1))
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [1, 2, 3] and got[0] is pool.wrapped.blocks[1]
    pool.free_blocks(b for b in reversed(got))  # a generator, as vLLM's offload manager passes
    assert pool.get_num_free_blocks() == 7
    with pytest.raises(Exception) as raised:
        pool.free_blocks([got[0]])  # a double free: kvpool's pool refuses it
    assert type(raised.value).__name__ == "BlockNotInUseError"
    assert shadow_of(pool).active  # the model refused it too


def test_watchers_are_called_as_without_the_shadow() -> None:
    pool = ShadowPool(BlockPool(4, True, 1), strict=True)
    told: list[int] = []
    blocks = pool.get_new_blocks(3)
    pool.unpin_blocks(blocks, lambda b: told.append(b.block_id))
    pool.get_new_blocks(2)
    assert told == [1, 2]
    assert shadow_of(pool).calls == 3


# ------------------------------------------------------------------ seeded bugs


@pytest.mark.parametrize("bug", ["FreeHashedToHead", "TouchLeavesBlockFree", "AllocKeepsOldHash"])
def test_a_seeded_bug_is_logged_once_with_a_trace_check_trace_agrees_with(
        bug: str, caplog: pytest.LogCaptureFixture) -> None:
    Shadowed = shadowed_class(getattr(seeded, bug))
    found = None
    for seed in range(8):
        pool, _pair = drive(Shadowed, seed, 3000, check=False)
        found = shadow_of(pool)
        assert found is not None
        if not found.active:
            break
    assert found is not None and not found.active, f"{bug} not found"
    lines = [r.getMessage() for r in caplog.records if r.name == "kvpool.shadow"]
    assert len(lines) == 1 and " diverged at call " in lines[0], lines
    path = Path(lines[0].rsplit("(kvpool check-trace ", 1)[1].rstrip(")"))
    assert path.exists() and path.parent == Path(os.environ[sh.ENV_DIR])
    report = check_trace(path)
    assert not report.ok and report.divergence is not None
    assert report.divergence.step == found.calls  # the call the shadow stopped at
    before = found.calls
    pool.get_num_free_blocks()  # the pool goes on, unshadowed
    assert found.calls == before


def test_strict_mode_raises_from_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The call the pool ran raises instead of returning (cached blocks freed to the queue's head)."""
    monkeypatch.setenv(sh.ENV_STRICT, "1")
    pool = shadowed_class(seeded.FreeHashedToHead)(8, True, 1)
    req = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 1, 0)
    with pytest.raises(ShadowDivergence) as raised:
        pool.free_blocks(blocks)
    assert raised.value.path is not None and raised.value.path.exists()
    assert pool.get_num_free_blocks() == 7  # the pool ran the call


def test_a_broken_contract_is_the_callers(caplog: pytest.LogCaptureFixture) -> None:
    """A caller caching one block at two positions breaks ``cached_once_per_call``."""
    pool = ShadowPool(BlockPool(8, True, 1))
    req = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [blocks[0], blocks[0]], 0, 2, 1, 0)
    lines = [r.getMessage() for r in caplog.records if r.name == "kvpool.shadow"]
    assert len(lines) == 1 and "caller broke a contract" in lines[0] and "cached_once_per_call" in lines[0]
    path = Path(lines[0].rsplit("(kvpool check-trace ", 1)[1].rstrip(")"))
    report = check_trace(path)
    assert report.contract is not None and report.contract.contract == "cached_once_per_call"


def test_the_lazy_queue_pool_of_another_author_is_shadowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that shares nothing with kvpool (``tests/third_party``), its correct queue."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "third_party"))
    logging.getLogger("mypool").setLevel(logging.ERROR)
    import lazy_queue

    pool, pair = drive(shadowed_class(lazy_queue.FixedLazyQueuePool, strict=True), 2, 1500)
    found = shadow_of(pool)  # it also sees the workload's lookups of the pool's index (black box)
    assert found is not None and found.active and found.calls >= pair.steps > 1000


# ------------------------------------------------------------------ pools that share


def test_keys_copied_from_another_pool_and_a_shared_event_queue(tmp_path: Path) -> None:
    """vLLM's CPU offload manager: keys of GPU blocks into a CPU pool (``_insert_block_hash``, the
    primary with its token count, then a partial one), its own events appended to the CPU pool's
    queue; and a pool that publishes into another's queue (vLLM's hisparse pool)."""
    gpu = ShadowPool(BlockPool(8, True, 2, enable_kv_cache_events=True), strict=True, keep=True)

    class Shared(BlockPool):
        owner: Any = None

        @property  # type: ignore[override]
        def kv_event_queue(self) -> list[Any]:
            return Shared.owner.kv_event_queue if Shared.owner is not None else []

        @kv_event_queue.setter
        def kv_event_queue(self, events: list[Any]) -> None:
            pass

    Shared.owner = gpu
    cpu = ShadowPool(Shared(8, True, 2, enable_kv_cache_events=True), strict=True, keep=True)
    req = Request("r", list(range(8)), block_hasher=get_request_block_hasher(2))
    blocks = gpu.get_new_blocks(2)
    gpu.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    gpu.cache_partial_block(req, blocks[1], 6, 0, 4)
    copy = cpu.get_new_blocks(1)[0]
    src = gpu.wrapped.blocks[blocks[1].block_id]
    cpu._insert_block_hash(src.block_hash, copy, num_tokens=src.block_hash_num_tokens)
    for key in gpu.wrapped.cached_block_hashes_by_block.get(src.block_id, ()):
        cpu._insert_block_hash(key, copy, num_tokens=None)
    mine = object()
    gpu.wrapped.kv_event_queue.append(mine)  # an event of the caller's own
    cpu.free_blocks([copy])
    gpu.free_blocks(iter(blocks))
    taken = gpu.take_events()
    assert mine in taken and len(taken) > 1  # the caller's and the pool's; the shadow compares its own
    assert cpu.get_cached_block(req.block_hashes[3], [0])[0] is copy
    for pool in (gpu, cpu):
        found = shadow_of(pool)
        assert found is not None and found.active
        found._finish(keep=True)
        assert check_trace(found.directory / f"{found.name}.jsonl").ok


def test_a_key_no_shadow_knows_stops_the_shadow_not_the_pool(caplog: pytest.LogCaptureFixture) -> None:
    cpu = ShadowPool(BlockPool(4, True, 1))
    block = cpu.get_new_blocks(1)[0]
    cpu._insert_block_hash(b"\x01" * 32 + b"\0\0\0\0", block, num_tokens=1)
    assert cpu.wrapped.blocks[block.block_id].block_hash is not None  # the pool did it
    assert not shadow_of(cpu).active
    assert "no shadowed pool knows the prefix" in caplog.text


def test_the_shadow_runs_without_z3_and_hypothesis() -> None:
    """The plugin runs inside vLLM: the shadow's import chain has no verifier in it."""
    code = ("import sys; sys.modules['z3'] = None; sys.modules['hypothesis'] = None\n"
            "import kvpool.oracle.shadow, kvpool.vllm_plugin\n"
            "from kvpool.impl import BlockPool\n"
            "p = kvpool.oracle.shadow.ShadowPool(BlockPool(4, True, 1), strict=True)\n"
            "p.free_blocks(p.get_new_blocks(2)); print(kvpool.oracle.shadow.shadow_of(p).calls)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, sh.ENV_DIR: os.environ[sh.ENV_DIR]})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"


def test_totals_are_written_at_exit(tmp_path: Path) -> None:
    code = ("from kvpool.impl import BlockPool\nfrom kvpool.oracle.shadow import ShadowPool\n"
            "p = ShadowPool(BlockPool(4, True, 1)); p.get_new_blocks(1); p.get_usage()\n")
    out = tmp_path / "totals"
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, sh.ENV_DIR: str(out)})
    assert done.returncode == 0, done.stderr
    totals = [json.loads(p.read_text()) for p in out.glob("totals-*.json")]
    assert len(totals) == 1 and totals[0]["pools"] == 1 and totals[0]["calls"] == 2
    assert totals[0]["divergences"] == 0 and totals[0]["traces"] == []


def test_a_shadow_of_a_pool_that_cannot_be_modelled_says_so() -> None:
    with pytest.raises(AttributeError):
        Shadow(object())
