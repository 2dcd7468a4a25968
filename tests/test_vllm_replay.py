"""``kvpool replay --engine vllm``: vLLM 0.31's own scheduler stack, its pool bare, replaced or shadowed.

Runs where vLLM is installed (``.ci/run``'s vLLM stage); skipped elsewhere.  A
small seeded trace in Mooncake's format, on a pool small enough that requests
preempt one another and cached blocks are evicted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kvpool import vllm_plugin
from kvpool.cli.main import main
from kvpool.oracle.replay.requests import read_requests, synthetic_mooncake, write_lines
from kvpool.oracle.replay.run import Replay, Settings
from kvpool.oracle.replay.vllm_engine import run_vllm
from kvpool.oracle.trace import check_trace

SMALL = Settings(num_blocks=64, block_size=8, token_budget=128, max_seqs=8)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vllm-replay") / "mooncake.jsonl"
    write_lines(path, synthetic_mooncake(3, 40, hash_block_tokens=32, max_blocks=10, mean_gap_ms=20))
    return path


def run(trace: Path, mode: str, **kwargs: object) -> Replay:
    return run_vllm(read_requests(trace, hash_block_tokens=32), SMALL, vllm_plugin.use, mode=mode,
                    keep_requests=True, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def bare(trace: Path) -> Replay:
    return run(trace, "none")


@pytest.mark.parametrize("mode", ["replace", "shadow", "replace,shadow"])
def test_every_pool_mode_schedules_as_vllms_bare_pool(trace: Path, bare: Replay, mode: str) -> None:
    """The same hits, preemptions, steps and finishing step for every request: kvpool's pool in
    vLLM's place changes nothing vLLM's scheduler sees, and neither does the shadow."""
    assert bare.requests == 40 and bare.preemptions > 0 and bare.evictions > 0 and bare.hit_tokens > 0
    other = run(trace, mode)
    assert other.records is not None and bare.records is not None
    assert [r.key() for r in other.records] == [r.key() for r in bare.records]
    assert (other.digest, other.steps, other.evictions) == (bare.digest, bare.steps, bare.evictions)
    if "shadow" in mode:
        assert other.divergences == 0 and other.calls > 1000, other.findings
    else:
        assert other.calls == 0


def test_the_replay_benchmark_takes_turns_and_its_runs_agree(tmp_path: Path) -> None:
    """benchmarks/replay_trace.py's four vLLM runs, each a process let run in turn: they finish,
    schedule every request alike, and the shadowed ones find nothing (its figures are
    docs/performance.md's)."""
    small = tmp_path / "mooncake.jsonl"  # Mooncake's 512 tokens a hash id, as the benchmark reads
    write_lines(small, synthetic_mooncake(5, 12, max_blocks=3, mean_gap_ms=20))
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "replay_trace.py"
    done = subprocess.run([sys.executable, "-W", "ignore", str(bench), str(small), "--engines", "vllm",
                           "--num-blocks", "400"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    runs = [line for line in lines if line.startswith("vLLM's scheduler, ")]
    assert [r.split(":")[0] for r in runs] == [f"vLLM's scheduler, {name}" for name in
                                               ("vLLM", "shadow", "recorded only", "replace")]
    assert "every request scheduled alike in the 4 runs: yes" in done.stdout
    assert done.stdout.count("divergences 0") == 4 and "finding:" not in done.stdout
    assert any(line.startswith("CPU ratios (engine): shadowed / bare ") for line in lines)


def test_the_shadows_trace_checks_and_the_routers_read_vllms_events(
        trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vllm.jsonl"
    assert main(["replay", str(trace), "--engine", "vllm", "--num-blocks", "64", "--block-size", "8",
                 "--token-budget", "128", "--max-seqs", "8", "--hash-block-tokens", "32",
                 "--router", "refcount", "--router", "set", "--trace", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["divergences"] == 0 and result["trace"] == str(out)
    routers = {r["name"]: r for r in result["routers"]}
    assert routers["refcount"]["queries"] == 40 and routers["refcount"]["under_requests"] == 0
    report = check_trace(out)
    assert report.ok and report.steps == result["calls"], report.format()
