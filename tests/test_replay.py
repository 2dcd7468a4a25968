"""``kvpool replay`` with kvpool's own engine loop (no vLLM): the traces it reads, what it says, its files.

Every trace here is written by the seeded generator in Mooncake's format
(``synthetic_mooncake``) or by hand in the plain one, small enough that a run
takes about a second; vLLM's scheduler is ``tests/test_vllm_replay.py``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool.bugs import pools as seeded
from kvpool.cli.main import main
from kvpool.oracle.core.adapter import adapter_for_class, kvpool_adapter
from kvpool.oracle.events.routers import check_trace_routers, profile_factory
from kvpool.oracle.replay.kvpool_engine import run_kvpool
from kvpool.oracle.replay.requests import (
    ReplayInputError,
    mooncake_prompt,
    read_requests,
    synthetic_mooncake,
    write_lines,
)
from kvpool.oracle.replay.run import MAX_POINTS, Replay, Series, Settings
from kvpool.oracle.trace import check_trace

SMALL = Settings(num_blocks=64, block_size=8, token_budget=128, max_seqs=8)
"""A pool small enough that requests preempt one another and cached blocks are evicted."""
SIZES = ["--num-blocks", "64", "--block-size", "8", "--token-budget", "128", "--max-seqs", "8",
         "--hash-block-tokens", "32"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "mooncake.jsonl"
    write_lines(path, synthetic_mooncake(3, 60, hash_block_tokens=32, max_blocks=10, mean_gap_ms=20))
    return path


def replay(path: Path, pool: type | None = None, settings: Settings = SMALL, **kwargs: Any) -> Replay:
    adapter = kvpool_adapter() if pool is None else adapter_for_class(pool)
    return run_kvpool(read_requests(path, hash_block_tokens=32), settings, adapter.factory(), adapter.name,
                      errors_match=adapter.errors_match, **kwargs)


# ------------------------------------------------------------------ the traces it reads


def test_equal_mooncake_ids_are_equal_tokens_and_others_share_none() -> None:
    a = mooncake_prompt([7, 8, 9], 70, 32)
    b = mooncake_prompt([7, 8, 10], 80, 32)
    assert len(a) == 70 and len(b) == 80
    assert a[:64] == b[:64] and not set(a[64:]) & set(b[64:])
    assert mooncake_prompt([1], 32, 32) != mooncake_prompt([2], 32, 32)


def test_the_synthetic_trace_is_seeded_and_shares_prefixes() -> None:
    first = list(synthetic_mooncake(5, 80, hash_block_tokens=32))
    assert first == list(synthetic_mooncake(5, 80, hash_block_tokens=32)) != list(synthetic_mooncake(6, 80))
    heads = [tuple(line["hash_ids"][:1]) for line in first]
    assert len(set(heads)) < len(heads) / 2  # system prompts and conversations repeat
    assert all(line["timestamp"] <= later["timestamp"] for line, later in itertools.pairwise(first))


def test_both_formats_are_read_and_a_prefix_of_the_trace(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"arrival": 0, "prompt": [1, 2, 3], "output_length": 2, "lora": "a"}\n\n'
                     '{"arrival": 5.5, "prompt": [1, 2], "output_length": 1, "cache_salt": "s"}\n')
    got = list(read_requests(plain))
    assert [(r.index, r.arrival_ms, r.prompt, r.lora, r.cache_salt) for r in got] == [
        (0, 0.0, [1, 2, 3], "a", None), (1, 5.5, [1, 2], None, "s")]
    moon = tmp_path / "m.jsonl"
    write_lines(moon, synthetic_mooncake(1, 10, hash_block_tokens=16))
    assert len(list(read_requests(moon, hash_block_tokens=16, limit=4))) == 4


@pytest.mark.parametrize(("line", "what"), [
    ('{"timestamp": 0, "input_length": 70, "output_length": 1, "hash_ids": [1, 2]}',
     "2 ids for 70 tokens in blocks of 32"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": -1, "input_length": 3, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [true]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1], "x": 1}', "unknown field 'x'"),
    ('{"arrival": 0, "prompt": [], "output_length": 1}', "prompt"),
    ('{"arrival": 0, "prompt": [1], "output_length": 1, "lora": 3}', "lora"),
    ('[1, 2]', "expected an object per line"),
    ('{"arrival": NaN}', "bad JSON: NaN is not valid JSON"),
    ('{"arrival": 0', "bad JSON"),
])
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path: Path, line: str, what: str) -> None:
    path = tmp_path / "bad.jsonl"
    first = ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [9]}' if "timestamp" in line
             else '{"arrival": 0, "prompt": [1], "output_length": 1}')
    path.write_text(f"{first}\n{line}\n")
    with pytest.raises(ReplayInputError) as raised:
        list(read_requests(path, hash_block_tokens=32))
    assert str(raised.value).startswith(f"{path}:2: ") and what in str(raised.value)


def test_arrivals_may_not_go_back_in_time(tmp_path: Path) -> None:
    path = tmp_path / "back.jsonl"
    path.write_text('{"arrival": 5, "prompt": [1], "output_length": 1}\n'
                    '{"arrival": 4, "prompt": [1], "output_length": 1}\n')
    with pytest.raises(ReplayInputError, match=r":2: arrival 4 ms is before the previous line's 5 ms"):
        list(read_requests(path))


# ------------------------------------------------------------------ the loop and what it says


def test_a_run_hits_evicts_preempts_and_agrees_with_the_model(trace: Path) -> None:
    r = replay(trace, keep_requests=True)
    assert r.requests == 60 and r.divergences == 0 and not r.findings
    assert 0 < r.hit_tokens < r.prompt_tokens and 0 < r.requests_with_hits < r.requests
    assert r.evictions > 0 and r.preemptions > 0 and r.calls > 1000
    assert r.records is not None and sum(rec.preemptions for rec in r.records) == r.preemptions
    assert sum(max(0, rec.hit_tokens) for rec in r.records) == r.hit_tokens
    lines = trace.read_text().splitlines()
    assert r.generated_tokens == sum(json.loads(line)["output_length"] for line in lines)
    again = replay(trace)
    assert again.digest == r.digest and again.records is None  # the same scheduling; no records kept


def test_more_blocks_more_hits_fewer_evictions(trace: Path) -> None:
    small, large = replay(trace), replay(trace, settings=Settings(**{**vars(SMALL), "num_blocks": 512}))
    assert large.hit_tokens > small.hit_tokens and large.evictions < small.evictions
    assert large.preemptions == 0 < small.preemptions


def test_a_buggy_pool_stops_the_run_with_the_call_that_differs(trace: Path) -> None:
    r = replay(trace, seeded.FreeHashedToHead)
    assert r.divergences == 1 and "free_blocks" in r.findings[0] and r.requests < 60


def test_a_request_larger_than_the_pool_is_skipped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text('{"arrival": 0, "prompt": [1, 2, 3], "output_length": 2}\n'
                    f'{{"arrival": 1, "prompt": {list(range(600))}, "output_length": 2}}\n')
    r = run_kvpool(read_requests(path), SMALL, kvpool_adapter().factory(), "kvpool")
    assert r.requests == 1 and r.findings == ["request 1: 602 tokens do not fit in 63 blocks of 8; skipped"]


def test_the_trace_of_a_run_checks_and_routers_read_it(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    r = replay(trace, routers=["dynamo", "llm-d:2026,clear=off"], trace=out)
    assert r.settings.events and [t.name for t in r.routers] == ["dynamo", "llm-d:2026,clear=off"]
    assert all(t.queries == 60 for t in r.routers)
    report = check_trace(out)
    assert report.ok and report.steps == r.calls, report.format()
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    defined = [x for x in lines if "request_id" in x]  # each request written whole once, then by number
    assert len(defined) == 60 and sum(1 for x in lines if x.get("forget")) >= 59  # the last: no line after
    checked, routers = check_trace_routers(out, [profile_factory("dynamo")])
    assert checked.ok and routers[0].queries > 0


def test_a_router_that_keeps_one_copy_per_key_under_claims(trace: Path) -> None:
    """Two requests computing one prefix at once cache two copies of a block; evicting one, the pool
    still serves the other.  The ``set`` reading (one copy per key, as llm-d keeps them) drops the key
    and claims less than the pool serves; ``refcount`` and Dynamo count copies and do not.  Every
    reading over-claims alike where a block went in the step before the admission (its event is
    published at the end of the step, as to a real router)."""
    r = replay(trace, routers=["set", "refcount", "dynamo", "llm-d:2026"])
    by = {t.name: t for t in r.routers}
    assert by["refcount"].under_requests == by["dynamo"].under_requests == 0 < by["set"].under_requests
    assert by["llm-d:2026"].under_tokens == by["set"].under_tokens > 0
    assert by["refcount"].over_requests == by["dynamo"].over_requests == by["set"].over_requests
    assert all(t.queries == 60 for t in r.routers)


def test_a_series_keeps_at_most_its_points() -> None:
    series = Series(("step",))
    for i in range(10_000):
        series.add((float(i),))
    assert len(series.points) < MAX_POINTS and series.points[0] == (0.0,) and series.every > 1
    steps = [p[0] for p in series.points]
    assert steps == sorted(steps) and len(set(b - a for a, b in itertools.pairwise(steps))) == 1


# ------------------------------------------------------------------ the command


def test_the_command_prints_writes_its_report_and_exits_0(trace: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["replay", str(trace), *SIZES, "--router", "dynamo", "--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hit rate: " in text and "divergences: 0" in text and "router dynamo: over-claimed" in text
    assert {p.name for p in out.iterdir()} == {"replay.md", "replay.html", "replay.json", "hit_rate.svg",
                                              "free_blocks.svg", "router_error.svg"}
    page = (out / "replay.html").read_text()
    assert page.count("<svg") == 3 and "Router error" in page and "<polyline" in page
    assert "![hit_rate.svg](hit_rate.svg)" in (out / "replay.md").read_text()
    result = json.loads((out / "replay.json").read_text())
    assert result["requests"] == 60 and result["series"]["points"]


def test_the_command_says_json_and_exits_1_on_a_divergence(trace: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace), *SIZES, "--pool", "kvpool.bugs.pools:FreeHashedToHead", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["divergences"] == 1 and result["findings"]


@pytest.mark.parametrize(("argv", "what"), [
    (["--num-blocks", "1"], "num-blocks must be at least 2"),
    (["--limit", "0"], "--limit must be positive"),
    (["--plugin", "shadow"], "--plugin is for --engine vllm"),
    (["--engine", "vllm", "--pool", "kvpool.impl:BlockPool"], "--pool and --exec are for --engine kvpool"),
    (["--pool", "no.such:Pool"], "no.such"),
    (["--router", "nobody"], "unknown router"),
])
def test_a_mistake_on_the_command_line_exits_2(trace: Path, argv: list[str], what: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["replay", str(trace), *SIZES, *argv])
    assert raised.value.code == 2 and what in capsys.readouterr().err


def test_an_unreadable_trace_exits_2_with_its_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt": [1], "output_length": 1}\n{"arrival": 0}\n')
    assert main(["replay", str(path)]) == 2
    assert f"{path}:2: prompt" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2


def test_a_pool_in_another_process_is_replayed_over_the_drive_protocol(trace: Path) -> None:
    command = f"{sys.executable} -P -m kvpool serve-pool"
    done = subprocess.run([sys.executable, "-P", "-m", "kvpool", "replay", str(trace), *SIZES,
                           "--limit", "12", "--exec", command, "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["requests"] == 12 and result["divergences"] == 0 and result["calls"] > 100


def test_check_trace_into_a_closed_pipe_ends_without_a_traceback(trace: Path, tmp_path: Path) -> None:
    """``kvpool check-trace FILE | head``: a reader that goes early is no error of the checker."""
    out = tmp_path / "run.jsonl"
    replay(trace, trace=out)
    command = [sys.executable, "-P", "-m", "kvpool", "check-trace", str(out), "--router", "set"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    proc.wait(timeout=600)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
