"""The shadow (``oracle/shadow/``): a real pool's calls also run on the model, compared.

Without vLLM: kvpool's pool, its seeded bugs (``kvpool.bugs.pools``) and the
third-party pool of ``tests/third_party`` are shadowed and driven by the
workload, with the checker in a process of its own (the default) and on the
engine's thread (``inline``); vLLM's own pool under the shadow is
``tests/test_vllm_plugin.py`` and ``tests/test_vllm_replay.py``.  Every run is
bounded by its number of steps.
"""

from __future__ import annotations

import gc
import inspect
import json
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
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
from kvpool.oracle.shadow import hub as hubs
from kvpool.oracle.trace import check_trace

ROOT = Path(__file__).resolve().parent.parent
MODES = ("process", "inline")


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


class Found:
    """What the shadows found during one test, wherever the checker ran."""

    def __init__(self) -> None:
        self.local = len(sh.TOTALS.findings)
        self.remote = len(sh.sync().get("findings", []))

    def now(self) -> list[dict[str, Any]]:
        """The findings since the test began (the checker process is waited for)."""
        return sh.TOTALS.findings[self.local:] + sh.sync().get("findings", [])[self.remote:]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(sh.ENV_CHECK, request.param)
    return str(request.param)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv(sh.ENV_DIR, str(tmp_path / "shadow"))
    monkeypatch.delenv(sh.ENV_STRICT, raising=False)
    monkeypatch.delenv(sh.ENV_KEEP, raising=False)
    logging.getLogger("kvpool").setLevel(logging.ERROR)  # refused resets warn
    logging.getLogger("kvpool.shadow").setLevel(logging.WARNING)
    yield
    sh.sync()  # nothing of this test left for the next one to wait for


def kept_path(line: str) -> Path:
    return Path(line.rsplit("(kvpool check-trace ", 1)[1].rstrip(")"))


# ------------------------------------------------------------------ a correct pool


@pytest.mark.parametrize("misuse", [False, True])
def test_kvpools_pool_under_the_shadow_agrees(misuse: bool, mode: str, tmp_path: Path) -> None:
    """The workload's lockstep also compares the shadowed pool with its own model: the shadow
    changes nothing the pool returns, and finds nothing."""
    found_before = Found()
    Shadowed = shadowed_class(BlockPool, strict=mode == "inline")
    for seed in range(3):
        pool, pair = drive(Shadowed, seed, 1200, misuse=misuse)
        found = shadow_of(pool)
        assert found is not None and found.active, found
        assert found.calls == pair.steps > 800
        assert (found.pair is None) == (mode == "process")  # the model runs on this thread or not
    assert found_before.now() == []
    assert found.active  # the checker stopped no pool either
    assert not list((tmp_path / "shadow").glob("*.jsonl"))  # nothing kept: nothing diverged


def test_the_call_path_only_records_when_the_checker_is_a_process(mode: str) -> None:
    pool = ShadowPool(BlockPool(8, True, 1))
    pool.get_new_blocks(2)
    found = shadow_of(pool)
    assert found is not None
    if mode == "process":
        assert isinstance(found.hub, hubs.ProcessHub) and found.hub.child.pid != os.getpid()
        assert found.pair is None
        assert sh.sync()["calls"] >= 1
    else:
        assert isinstance(found.hub, hubs.InlineHub) and found.pair is not None


def checked(mode: str) -> int:
    """Calls checked so far where ``mode`` checks them (everything sent waited for)."""
    remote = int(sh.sync().get("calls", 0))  # first: an inline checker counts the repeats it is told
    return sh.TOTALS.calls if mode == "inline" else remote


def test_a_query_asked_again_with_nothing_between_is_counted_not_sent(mode: str) -> None:
    """An engine asks the number of free blocks several times a step: a repeat of the last answer
    with no other call between is sent to a checker process as its name only, in one message
    before the next one, and the checker puts it to the model with the answer it recorded last.
    A checker on the engine's thread reads the live pool, which the next call changes before the
    checker would be told: it is sent every call."""
    pool = shadowed_class(BlockPool)(16, True, 4)
    found = shadow_of(pool)
    assert found is not None
    sent: list[tuple[Any, ...]] = []
    send = found.hub.send
    found.hub.send = lambda message: (sent.append(message), send(message))  # type: ignore[method-assign]
    before = checked(mode)
    answers = [pool.get_num_free_blocks() for _ in range(5)]
    pool.get_new_blocks(2)
    answers += [pool.get_num_free_blocks() for _ in range(3)]
    assert answers == [15] * 5 + [13] * 3
    assert checked(mode) - before == 9
    mine = [(m[0], m[2]) for m in sent if m[0] in ("call", "same") and m[1] == found.number]
    if mode == "inline":
        assert mine == [("call", "get_num_free_blocks")] * 5 + [("call", "get_new_blocks")] + [
            ("call", "get_num_free_blocks")] * 3
        return
    assert mine == [
        ("call", "get_num_free_blocks"), ("same", ["get_num_free_blocks"] * 4), ("call", "get_new_blocks"),
        ("call", "get_num_free_blocks"), ("same", ["get_num_free_blocks"] * 2)]
    assert found.repeats.told == 6 and found.repeats.ops == [] and found.calls == 9


class _MiscountsItsThirdAnswer(BlockPool):
    """Says one free block too many the third time it is asked, having done nothing between."""

    asked = 0

    def get_num_free_blocks(self) -> int:
        self.asked += 1
        return super().get_num_free_blocks() + (self.asked == 3)


def test_a_query_answering_otherwise_with_nothing_between_is_checked(mode: str) -> None:
    found = Found()
    pool = shadowed_class(_MiscountsItsThirdAnswer)(16, True, 4)
    assert [pool.get_num_free_blocks() for _ in range(4)] == [15, 15, 16, 15]
    (finding,) = found.now()
    assert finding["call"] == 3 and "get_num_free_blocks" in finding["first"], finding


def test_repeats_and_whole_pool_checks_keep_step(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Calls between whole-pool checks are counted alike on both sides, repeats included: a
    whole-pool check compares the pool as it was at that call (a correct pool: nothing found)."""
    monkeypatch.setenv(sh.ENV_FULL_EVERY, "3")
    found = Found()
    pool = shadowed_class(BlockPool)(8, True, 1)
    req = Request("r", [1, 2, 3, 4], block_hasher=get_request_block_hasher(1))
    for n in (1, 2, 3):
        for _ in range(n + 2):
            pool.get_num_free_blocks()
        blocks = pool.get_new_blocks(n)
        for _ in range(n):
            pool.get_num_free_blocks()
        pool.cache_full_blocks(req, blocks, 0, n, 1, 0)
        pool.free_blocks(blocks)
    assert found.now() == []
    assert shadow_of(pool).calls == sum(2 * n + 5 for n in (1, 2, 3))


class StaleFreeCount(BlockPool):
    """Answers the number of free blocks it first counted, whatever happens after."""

    stale: int | None = None

    def get_num_free_blocks(self) -> int:
        if self.stale is None:
            self.stale = super().get_num_free_blocks()
        return self.stale


def test_an_argument_less_call_answered_as_last_recorded_goes_by_name_and_is_still_checked(
        mode: str) -> None:
    """A repeat goes to a checker process by name even across calls that change the pool (the
    events taken each step, the free count between allocations); the checker puts it to the model,
    so an answer that should have changed is found wherever the checker runs."""
    found = Found()
    pool = shadowed_class(BlockPool)(8, True, 1)
    for _ in range(3):
        pool.get_num_free_blocks()
        pool.take_events()
        pool.free_blocks(pool.get_new_blocks(2))
    assert found.now() == []
    assert shadow_of(pool).repeats.told == (4 if mode == "process" else 0)  # 2 free counts, 2 takes
    stale = shadowed_class(StaleFreeCount)(8, True, 1)
    stale.get_num_free_blocks()
    stale.get_new_blocks(2)
    stale.get_num_free_blocks()  # 8 again, as the last one recorded: by name to a checker process
    found_now = found.now()
    assert len(found_now) == 1 and "get_num_free_blocks" in json.dumps(found_now[0]), found_now


def test_per_block_methods_keep_their_parameters_and_only_outside_calls_are_recorded(mode: str) -> None:
    """The methods a pool calls on itself once per block are wrapped with the pool method's own
    parameters (names, defaults, keyword use): a call from outside is recorded, the pool's own
    calls while one of its operations runs are not."""
    Shadowed = shadowed_class(BlockPool)
    for op in ("_maybe_evict_cached_block", "_insert_block_hash"):
        assert inspect.signature(getattr(Shadowed, op)) == inspect.signature(getattr(BlockPool, op))
    found = Found()
    pool = Shadowed(8, True, 1)
    req = Request("r", [1, 2, 3, 4], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, 1, 0)  # its own _insert_block_hash three times
    pool.free_blocks(blocks)
    calls = shadow_of(pool).calls
    assert calls == 3
    pool.get_new_blocks(7)  # evicts the three cached blocks through its own _maybe_evict_cached_block
    assert shadow_of(pool).calls == calls + 1
    other = Shadowed(8, True, 1)
    assert other._maybe_evict_cached_block(other.blocks[1]) is False  # from outside: recorded
    assert shadow_of(other).calls == 1 and found.now() == []


def test_a_kept_trace_replays_and_memory_stays_bounded(mode: str, tmp_path: Path) -> None:
    Shadowed = shadowed_class(BlockPool, keep=True)
    pool, pair = drive(Shadowed, 5, 3000, misuse=True)
    found = shadow_of(pool)
    assert found is not None
    # what the shadow holds does not grow with the run: the pending events, the live requests
    assert len(found.own) <= 4 * pair.steps and len(found.hub.requests.known) <= 64
    if found.pair is not None:  # and the lockstep's last calls
        assert len(found.pair.trace) <= 13 and found.pair.lines == []
    calls = found.calls
    del pool, found, pair
    gc.collect()
    sh.sync()
    kept = list((tmp_path / "shadow").glob("*.jsonl"))
    assert len(kept) == 1
    report = check_trace(kept[0])
    assert report.ok and report.steps == calls, report.format()
    lines = kept[0].read_text().splitlines()
    assert any('"forget":true' in line for line in lines)  # dead requests are forgotten by a reader


def test_results_and_exceptions_go_back_unchanged(mode: str) -> None:
    """The very objects the pool returned or raised, an iterator handed over as a list."""
    found = Found()
    pool = ShadowPool(BlockPool(8, True, 1))
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [1, 2, 3] and got[0] is pool.wrapped.blocks[1]
    pool.free_blocks(b for b in reversed(got))  # a generator, as vLLM's offload manager passes
    assert pool.get_num_free_blocks() == 7
    with pytest.raises(Exception) as raised:
        pool.free_blocks([got[0]])  # a double free: kvpool's pool refuses it
    assert type(raised.value).__name__ == "BlockNotInUseError"
    assert found.now() == []  # the model refused it too
    assert shadow_of(pool).active


def test_watchers_are_called_as_without_the_shadow(mode: str) -> None:
    found = Found()
    pool = ShadowPool(BlockPool(4, True, 1))
    told: list[int] = []
    blocks = pool.get_new_blocks(3)
    pool.unpin_blocks(blocks, lambda b: told.append(b.block_id))
    pool.get_new_blocks(2)
    assert told == [1, 2]
    assert shadow_of(pool).calls == 3 and found.now() == []


# ------------------------------------------------------------------ seeded bugs


@pytest.mark.parametrize("bug", ["FreeHashedToHead", "TouchLeavesBlockFree", "AllocKeepsOldHash"])
def test_a_seeded_bug_is_found_once_with_a_trace_check_trace_agrees_with(
        bug: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    found_before = Found()
    Shadowed = shadowed_class(getattr(seeded, bug))
    findings: list[dict[str, Any]] = []
    for seed in range(8):
        pool, _pair = drive(Shadowed, seed, 3000, check=False)
        findings = found_before.now()
        if findings:
            break
    assert len(findings) == 1 and findings[0]["kind"] == "diverged", findings
    path = Path(findings[0]["trace"])
    assert path.exists() and path.parent == Path(os.environ[sh.ENV_DIR])
    report = check_trace(path)
    assert not report.ok and report.divergence is not None
    assert report.divergence.step == findings[0]["call"]  # the call the checker stopped at
    assert not shadow_of(pool).active  # the pool goes on, unshadowed
    pool.get_num_free_blocks()
    if mode == "inline":  # one line logged here (a checker process logs it to its stderr)
        lines = [r.getMessage() for r in caplog.records if r.name == "kvpool.shadow"]
        assert len(lines) == 1 and " diverged at call " in lines[0], lines
        assert kept_path(lines[0]) == path


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


@pytest.mark.parametrize("full_every", [3, 1000])
def test_a_divergence_at_a_whole_pool_check_names_the_call_that_made_it(full_every: int) -> None:
    """The third call frees cached blocks to the queue's head: whether or not the whole pool is
    compared after it, the footprint check names that call (not the calls since the last check)."""
    pool = ShadowPool(seeded.FreeHashedToHead(8, True, 1), strict=True, full_every=full_every)
    req = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 1, 0)
    with pytest.raises(ShadowDivergence) as raised:
        pool.free_blocks(blocks)
    first = str(raised.value).splitlines()[0]
    assert " at call 3: observation after free_blocks: " in first, first
    assert "whole-pool check" not in first


def test_a_checker_process_names_the_calls_since_the_last_whole_pool_check() -> None:
    """It sees the pool only at whole-pool checks: a difference is named with the calls in which
    it arose (the trace it keeps holds them)."""
    found = Found()
    pool = ShadowPool(seeded.FreeHashedToHead(8, True, 1), full_every=3)
    assert shadow_of(pool).hub.remote
    req = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 1, 0)
    pool.free_blocks(blocks)
    (finding,) = found.now()
    assert finding["call"] == 3 and "damage is in calls 1 to 3" in finding["first"], finding
    assert not check_trace(finding["trace"]).ok


def test_a_broken_contract_is_the_callers(mode: str) -> None:
    """A caller caching one block at two positions breaks ``cached_once_per_call``."""
    found = Found()
    pool = ShadowPool(BlockPool(8, True, 1))
    req = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [blocks[0], blocks[0]], 0, 2, 1, 0)
    (finding,) = found.now()
    assert finding["kind"] == "caller broke a contract" and "cached_once_per_call" in finding["first"]
    report = check_trace(finding["trace"])
    assert report.contract is not None and report.contract.contract == "cached_once_per_call"


def test_the_lazy_queue_pool_of_another_author_is_shadowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that shares nothing with kvpool (``tests/third_party``), its correct queue; seen as a
    black box, it is checked on the engine's thread (the checker probes its index itself)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "third_party"))
    logging.getLogger("mypool").setLevel(logging.ERROR)
    import lazy_queue

    pool, pair = drive(shadowed_class(lazy_queue.FixedLazyQueuePool, strict=True), 2, 1500)
    found = shadow_of(pool)  # it also sees the workload's lookups of the pool's index (black box)
    assert found is not None and found.active and found.calls >= pair.steps > 1000
    assert not found.hub.remote


# ------------------------------------------------------------------ pools that share


def test_keys_copied_from_another_pool_and_a_shared_event_queue(mode: str, tmp_path: Path) -> None:
    """vLLM's CPU offload manager: keys of GPU blocks into a CPU pool (``_insert_block_hash``, the
    primary with its token count, then a partial one), its own events appended to the CPU pool's
    queue; and a pool that publishes into another's queue (vLLM's hisparse pool)."""
    found_before = Found()
    gpu = ShadowPool(BlockPool(8, True, 2, enable_kv_cache_events=True), keep=True)

    class Shared(BlockPool):
        owner: Any = None

        @property  # type: ignore[override]
        def kv_event_queue(self) -> list[Any]:
            return Shared.owner.kv_event_queue if Shared.owner is not None else []

        @kv_event_queue.setter
        def kv_event_queue(self, events: list[Any]) -> None:
            pass

    Shared.owner = gpu
    cpu = ShadowPool(Shared(8, True, 2, enable_kv_cache_events=True), keep=True)
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
    assert found_before.now() == []
    for pool in (gpu, cpu):
        found = shadow_of(pool)
        assert found is not None and found.active
        found.finish(keep=True)
    sh.sync()
    for pool in (gpu, cpu):
        found = shadow_of(pool)
        assert check_trace(found.directory / f"{found.name}.jsonl").ok


def test_a_key_no_shadow_knows_stops_the_shadow_not_the_pool(mode: str) -> None:
    found = Found()
    cpu = ShadowPool(BlockPool(4, True, 1))
    block = cpu.get_new_blocks(1)[0]
    cpu._insert_block_hash(b"\x01" * 32 + b"\0\0\0\0", block, num_tokens=1)
    assert cpu.wrapped.blocks[block.block_id].block_hash is not None  # the pool did it
    (finding,) = found.now()
    assert finding["kind"] == "stopped" and "no shadowed pool knows the prefix" in finding["first"]
    assert not shadow_of(cpu).active


# ------------------------------------------------------------------ the process around it


def test_the_shadow_runs_without_z3_and_hypothesis() -> None:
    """The plugin runs inside vLLM: the shadow's import chain, and its checker process's, have no
    verifier in them."""
    code = ("import sys; sys.modules['z3'] = None; sys.modules['hypothesis'] = None\n"
            "import kvpool.oracle.shadow, kvpool.oracle.shadow.child, kvpool.vllm_plugin\n"
            "from kvpool.impl import BlockPool\n"
            "p = kvpool.oracle.shadow.ShadowPool(BlockPool(4, True, 1), strict=True)\n"
            "p.free_blocks(p.get_new_blocks(2)); print(kvpool.oracle.shadow.shadow_of(p).calls)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, sh.ENV_DIR: os.environ[sh.ENV_DIR]})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"


def test_totals_are_written_at_exit(mode: str, tmp_path: Path) -> None:
    code = ("from kvpool.impl import BlockPool\nfrom kvpool.oracle.shadow import ShadowPool\n"
            "p = ShadowPool(BlockPool(4, True, 1)); p.get_new_blocks(1); p.get_usage()\n")
    out = tmp_path / "totals"
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, sh.ENV_DIR: str(out), sh.ENV_CHECK: mode})
    assert done.returncode == 0, done.stderr
    totals = [json.loads(p.read_text()) for p in out.glob("totals-*.json")]
    assert len(totals) == 1 and totals[0]["pools"] == 1 and totals[0]["calls"] == 2
    assert totals[0]["divergences"] == 0 and totals[0]["traces"] == []


def test_a_dead_checker_stops_the_shadows_not_the_engine(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(sh.ENV_CHECK, "process")
    monkeypatch.setattr(hubs, "_hubs", {})  # a checker of this test's own
    pool = ShadowPool(BlockPool(8, True, 1))
    pool.get_new_blocks(1)
    found = shadow_of(pool)
    assert isinstance(found.hub, hubs.ProcessHub)
    found.hub.child.send_signal(signal.SIGKILL)
    found.hub.child.wait()
    for _ in range(hubs.BATCH + 1):  # a batch goes out, and cannot
        assert pool.get_num_free_blocks() == 6
    assert not found.active
    assert "no longer shadowed" in caplog.text
    assert "checker" in hubs.sync()["dead"]  # a caller that sums its totals learns they stopped
    assert pool.get_new_blocks(2)  # the pool goes on


def test_the_checker_process_reaches_the_installed_kvpool_from_a_checkout(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A checkout's top-level ``kvpool/`` folder (the face alone) in the working directory must not
    hide the installed package from the checker process."""
    (tmp_path / "kvpool").mkdir()
    (tmp_path / "kvpool" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(sh.ENV_CHECK, "process")
    monkeypatch.setattr(hubs, "_hubs", {})
    pool = ShadowPool(BlockPool(8, True, 1))
    pool.get_new_blocks(1)
    assert hubs.sync()["calls"] >= 1


def test_a_shadow_of_a_pool_that_cannot_be_modelled_says_so() -> None:
    with pytest.raises(AttributeError):
        Shadow(object())


def test_an_event_the_pool_queued_and_the_model_did_not_is_named_once() -> None:
    class Extra(BlockPool):
        def get_num_free_blocks(self) -> int:
            self.kv_event_queue.append(object())  # an event of no kind the model emits
            return super().get_num_free_blocks()

    pool = ShadowPool(Extra(8, True, 1, enable_kv_cache_events=True), strict=True)
    with pytest.raises(ShadowDivergence) as raised:
        pool.get_num_free_blocks()
    first = str(raised.value).splitlines()[0]
    assert "get_num_free_blocks: pending events: model 0 | pool 1" in first and "pending pending" not in first


def test_the_whole_pool_is_compared_as_often_as_docs_vllm_md_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sh.ENV_FULL_EVERY, raising=False)
    text = (ROOT / "docs" / "vllm.md").read_text(encoding="utf-8")
    assert "every invariant every `num_blocks` calls (`KVPOOL_SHADOW_FULL_EVERY`" in text
    pool = ShadowPool(BlockPool(96, True, 1))
    assert shadow_of(pool).full_every == 96
    monkeypatch.setenv(sh.ENV_FULL_EVERY, "7")
    assert shadow_of(ShadowPool(BlockPool(96, True, 1))).full_every == 7


def test_a_forked_process_does_not_write_into_its_parents_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM forks its workers after loading the plugin: a pool carried into the child is no longer
    shadowed there (the parent's checker reads only the parent's records)."""
    monkeypatch.setenv(sh.ENV_CHECK, "process")
    found = Found()
    pool = ShadowPool(BlockPool(8, True, 1))
    pool.get_new_blocks(1)
    sh.sync()
    pid = os.fork()
    if pid == 0:  # the child: its calls must not reach the parent's checker
        for _ in range(hubs.BATCH + 1):  # calls each recorded whole (a repeat goes by name only)
            pool.free_blocks(pool.get_new_blocks(1))
        os._exit(0 if not shadow_of(pool).active else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pool.get_new_blocks(1)
    assert found.now() == [] and shadow_of(pool).active and sh.sync()["calls"] >= 2
