"""Engine-sized and long-lived workloads (``--blocks``, ``--long-lived``; ``oracle/generate/long_lived.py``).

The planted bug is ``tests/third_party/lazy_queue.py``: a pool whose free
queue deletes lazily and whose compaction breaks the eviction order.  The
short runs (``kvpool check`` and ``kvpool conform`` with their defaults)
never make it compact; one long-lived run does, and diverges.  Every run is
bounded by its number of steps.
"""

from __future__ import annotations

import io
import logging
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import main as cli_main
from kvpool.cli.conform import main as conform_main
from kvpool.model import OPERATIONS, initial_state
from kvpool.oracle.core import observe
from kvpool.oracle.core.adapter import adapter_for_class, kvpool_adapter
from kvpool.oracle.core.lockstep import Lockstep
from kvpool.oracle.generate.long_lived import LONG_LIVED_BLOCKS, LongLived, pool_blocks
from kvpool.oracle.generate.runs import RunConfig
from kvpool.oracle.generate.two_pools import second_pool
from kvpool.oracle.generate.workload import MAX_RUNNING, SCAN_LIMIT, Workload
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.trace import check_trace, record_adapter

THIRD_PARTY = Path(__file__).parent / "third_party"


@pytest.fixture(autouse=True)
def _third_party_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(THIRD_PARTY))
    logging.getLogger("mypool").setLevel(logging.ERROR)  # its refused resets warn
    yield


def lazy_pool(fixed: bool = False) -> Any:
    import lazy_queue

    return lazy_queue.FixedLazyQueuePool if fixed else lazy_queue.LazyQueuePool


def check(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli_main(["check", *argv])
    return status, capsys.readouterr().out


# ------------------------------------------------------------------ the planted bug


@pytest.mark.slow  # 37 s: the control of the long-lived runs
def test_short_runs_miss_the_compaction_bug(capsys: pytest.CaptureFixture[str]) -> None:
    """``kvpool check`` and ``kvpool conform`` with their defaults: small pools, short runs."""
    status, out = check("--pool", "lazy_queue:LazyQueuePool", capsys=capsys)
    assert status == 0 and "4/4 runs agree" in out, out
    text = io.StringIO()
    assert conform_main(["--impl", "lazy_queue:LazyQueuePool"], out=text) == 0, text.getvalue()
    assert "agrees with the model" in text.getvalue()


def test_long_lived_run_catches_the_compaction_bug(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = check("--pool", "lazy_queue:LazyQueuePool", "--long-lived", "--runs", "1",
                        capsys=capsys)
    assert status == 1, out
    assert "run 1/1 seed 0: DIVERGED" in out
    # found by a whole-pool check, which names the calls in which the order broke
    assert "free: model" in out and "the damage is in calls" in out


@pytest.mark.slow
def test_long_lived_conform_campaign_catches_it_and_the_fixed_queue_agrees() -> None:
    """The same run through ``kvpool conform --long-lived`` (the campaign phase), and the control:
    the queue with its compaction sorted by position agrees on that very run."""
    text = io.StringIO()
    status = conform_main(["--impl", "lazy_queue:LazyQueuePool", "--long-lived", "--runs", "1",
                           "--examples", "1"], out=text)
    assert status == 1 and "campaign: DIVERGED (divergence)" in text.getvalue(), text.getvalue()
    # 10,000 calls on 256 blocks, each replay comparing the whole pool: over the shrink's budget
    assert "not shrunk: replaying the run's" in text.getvalue(), text.getvalue()
    pool = lazy_pool(fixed=True)
    adapter = adapter_for_class(pool)
    made: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        made.append(pool(*args, **kwargs))
        return made[-1]

    pair = run_one(factory, 0, 10_000, misuse=False, errors_match=adapter.errors_match, long_lived=True)
    assert pair.model.num_blocks == LONG_LIVED_BLOCKS[0]
    assert made[0].free_block_queue.compactions > 0  # the fixed queue compacted, and kept the order


# ------------------------------------------------------------------ the churn


def long_run(seed: int, steps: int, misuse: bool, blocks: int | None = None) -> tuple[Lockstep, Counter[str]]:
    adapter = kvpool_adapter()
    rng = random.Random(seed)
    cfg = RunConfig.draw(rng, seed, pool_blocks(seed, blocks, True))
    pair = Lockstep.fresh(adapter.factory(), cfg.num_blocks, cfg.caching, cfg.hash_block_size, cfg.events,
                          metrics=cfg.metrics)
    work = LongLived(rng, cfg, pair, misuse_on=misuse,
                     second=second_pool(adapter.factory(), cfg, "0.31", adapter.errors_match))
    drawn: Counter[str] = Counter()
    drained = 0
    for _ in range(steps):
        drawn[work.step()] += 1
        if work.draining:
            drained += 1
    pair.check()
    drawn["steps while a burst drains"] = drained
    return pair, drawn


@pytest.mark.parametrize("misuse", [True, False])
def test_long_lived_runs_agree_on_kvpools_pool_and_churn(misuse: bool) -> None:
    """Legal calls only (or misuse on, refused alike): kvpool's pool agrees, and the run churns."""
    pair, drawn = long_run(4, 4000, misuse, blocks=64)
    assert pair.model.num_blocks == 64
    for step in ("revisit", "hit_storm", "evict_recache", "burst"):
        assert drawn[step] > 0, drawn
    assert drawn["steps while a burst drains"] > 0  # a burst ran the free queue dry
    assert pair.refusals_seen["NotEnoughFreeBlocksError"] > 0, pair.refusals_seen
    # far more hits taken than blocks handed out
    assert pair.ops_seen["touch"] > pair.ops_seen["get_new_blocks"] // 2
    assert pair.ops_seen["evict_blocks"] > 0 and pair.ops_seen["cache_full_blocks"] > 0


def test_long_lived_default_sizes_by_seed() -> None:
    assert [pool_blocks(s, None, True) for s in range(3)] == list(LONG_LIVED_BLOCKS)
    assert pool_blocks(5, 99, True) == 99 and pool_blocks(5, None, False) is None


def test_long_lived_trace_replays(tmp_path: Path) -> None:
    """``kvpool record --long-lived``: the streamed trace replays on the model."""
    path = tmp_path / "long.jsonl"
    rec = record_adapter(kvpool_adapter(), 2, 800, observe=False, path=path, long_lived=True, blocks=300)
    assert rec.divergence is None and rec.calls > 800
    report = check_trace(path)
    assert report.ok, report.format()
    assert report.steps == rec.calls


# ------------------------------------------------------------------ the cost of a call


def test_a_step_on_a_million_blocks_looks_at_what_it_touches(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a pool of 2^20 blocks, the lockstep looks at a few blocks per call (its footprint) and
    the workload picks among at most :data:`SCAN_LIMIT`; whole-pool checks come every
    ``num_blocks // 16`` calls, so none runs in this bounded run (besides the final one)."""
    looked: Counter[str] = Counter()
    original_view = observe.Observer.block_view

    def counted_view(self: observe.Observer, b: int) -> Any:
        looked["pool"] += 1
        return original_view(self, b)

    monkeypatch.setattr(observe.Observer, "block_view", counted_view)
    scopes: list[int] = []
    original_scope = Workload.scope

    def counted_scope(self: Workload) -> Any:
        out = original_scope(self)
        scopes.append(len(out))
        return out

    monkeypatch.setattr(Workload, "scope", counted_scope)
    blocks = 1 << 20
    for long_lived in (False, True):
        rng = random.Random(1)
        cfg = RunConfig.draw(rng, 1, blocks)
        adapter = kvpool_adapter()
        pair = Lockstep.fresh(adapter.factory(), blocks, cfg.caching, cfg.hash_block_size, cfg.events)
        work = (LongLived if long_lived else Workload)(rng, cfg, pair)
        for _ in range(400):
            work.step()
        assert pair.last_full == 0, "no whole-pool check is due in 400 steps"
        assert looked["pool"] <= 40 * pair.steps, (looked, pair.steps)
        assert scopes and max(scopes) <= SCAN_LIMIT
        assert len(work.running) <= MAX_RUNNING
        looked.clear()
        scopes.clear()


def test_a_refused_allocation_has_no_footprint() -> None:
    """Asking for more blocks than are free is refused at no cost: its footprint is empty."""
    s = initial_state(1 << 16, True, 1)
    fp = OPERATIONS["get_new_blocks"].footprint(s, len(s.free) + 1)
    assert not fp.blocks and not fp.keys
    assert len(OPERATIONS["get_new_blocks"].footprint(s, 3).blocks) == 3


def test_blocks_flag_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["check", "--blocks", "1"])
    assert exc.value.code == 2
    assert "--blocks must be between 2 and" in capsys.readouterr().err
    text = io.StringIO()
    assert conform_main(["--impl", "kvpool.impl:BlockPool", "--blocks", str(1 << 21)], out=text) == 2


def test_check_runs_an_engine_sized_pool(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = check("--blocks", "100000", "--runs", "1", "--steps", "300", capsys=capsys)
    assert status == 0 and "100000 blocks" in out, out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
