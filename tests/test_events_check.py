"""The KV-event checker: it reads the model's streams without complaint, catches
planted violations at the right line, and documents (by scenario) what the
reference's streams do not tell a router.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cli.events import check_events_main
from kvpool.impl import BlockPool
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.oracle.events.check import check_event_list, check_events, load_events
from kvpool.oracle.trace import (
    Recording,
    RecordingLockstep,
    TraceError,
    check_trace,
    record,
    recording_pair,
)

# ------------------------------------------------------------------ helpers


def _events_file(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def stored(hashes: list[int], parent: int | None = None, group: int = 0, size: int = 2,
           tokens: int | None = None) -> dict[str, Any]:
    n = size * len(hashes) if tokens is None else tokens
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(n)), "block_size": size, "lora_id": None,
            "medium": "GPU", "lora_name": None, "group_idx": group}


def removed(h: int, group: int = 0) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": group}


CLEARED = {"type": "AllBlocksCleared"}


# ------------------------------------------------------------------ the model's streams


def _event_seeds(count: int, start: int = 0) -> list[int]:
    """Seeds whose drawn configuration has events on (RunConfig.draw's first draws)."""
    from kvpool.oracle.generate.runs import RunConfig

    seeds, seed = [], start
    while len(seeds) < count:
        if RunConfig.draw(random.Random(seed)).events:
            seeds.append(seed)
        seed += 1
    return seeds


@pytest.mark.parametrize("seed", _event_seeds(16))
def test_workload_streams_have_no_violation(tmp_path: Path, seed: int) -> None:
    rec = record(BlockPool, seed, 300)
    assert rec.divergence is None
    path = tmp_path / "t.jsonl"
    rec.write(path)
    with_pool = check_events(path)  # header block sizes, and the pool's index after each call
    assert with_pool.ok, with_pool.format()
    assert with_pool.snapshots == len(rec.lines)
    # A bare stream, as an engine publishes it: the pool's events and the offload caller's own
    # announcements of the keys it copied in (load_events reads those off the trace).
    events = [e for _, e in load_events(path).events]
    without = check_event_list(events)  # no sizes, no pool
    assert without.ok, without.format()


def test_check_events_reads_traces_and_event_files(tmp_path: Path) -> None:
    seed = _event_seeds(1, start=40)[0]
    rec = record(BlockPool, seed, 400, observe=False)
    trace = tmp_path / "t.jsonl"
    rec.write(trace)
    events = [e for line in rec.lines for e in line["events"]]
    assert events
    from_trace = check_events(trace)
    from_stream = check_events(_events_file(tmp_path / "e.jsonl", events))
    assert from_trace.ok and from_stream.ok
    assert from_trace.events == from_stream.events == len(events)


# ------------------------------------------------------------------ planted violations


REMOVED_DEAD = "event_removals_name_live_keys"


@pytest.mark.parametrize(("events", "rule", "line"), [
    ([stored([1]), removed(2)], REMOVED_DEAD, 2),                            # never stored
    ([removed(1), stored([1])], REMOVED_DEAD, 1),                            # remove before store
    ([stored([1]), removed(1), removed(1)], REMOVED_DEAD, 3),                # removed twice
    ([stored([1]), stored([1]), removed(1), removed(1), removed(1)], REMOVED_DEAD, 5),
    ([stored([1]), removed(1, group=1)], REMOVED_DEAD, 2),                   # other group
    ([stored([1]), CLEARED, removed(1)], REMOVED_DEAD, 3),                   # cleared since
    ([stored([5, 6], parent=4)], "parent-unknown", 1),                       # child before parent
    ([stored([5], parent=4), stored([4])], "parent-unknown", 1),             # parent comes later
    ([stored([4], group=1), stored([5], parent=4)], "parent-unknown", 2),    # parent in another group
    ([stored([4]), CLEARED, stored([5, 6], parent=4)], "parent-unknown", 3),
])
def test_planted_violation_is_caught_at_its_line(
    tmp_path: Path, events: list[dict[str, Any]], rule: str, line: int,
) -> None:
    report = check_events(_events_file(tmp_path / "e.jsonl", events), {0: 2, 1: 2})
    assert [(v.rule, v.position.line) for v in report.violations] == [(rule, line)]


def test_an_unannounced_copy_is_caught_against_the_pool(tmp_path: Path) -> None:
    rec = record(BlockPool, 9, 200)  # caching and events on
    target = next(i for i, x in enumerate(rec.lines)  # a store of blocks, not of placeholders only
                  if x["op"] == "cache_full_blocks" and any(e["block_hashes"] for e in x["events"] or ()))
    rec.lines[target]["events"] = [e for e in rec.lines[target]["events"]
                                   if e["type"] != "BlockStored"]
    path = tmp_path / "t.jsonl"
    rec.write(path)
    first = check_events(path).violations[0]
    assert (first.rule, first.position.line) == ("event_announcements_match_index", target + 2)


def test_every_violation_is_reported_in_order(tmp_path: Path) -> None:
    events = [removed(9), stored([1]), stored([3], parent=2), removed(1), removed(1)]
    report = check_events(_events_file(tmp_path / "e.jsonl", events), {0: 2})
    assert [(v.rule, v.position.line) for v in report.violations] == [
        ("event_removals_name_live_keys", 1), ("parent-unknown", 3), ("event_removals_name_live_keys", 5)]
    assert "e.jsonl:5:" in report.format()


def test_a_planted_violation_in_a_trace_names_line_and_event(tmp_path: Path) -> None:
    seed = _event_seeds(1, start=40)[0]
    rec = record(BlockPool, seed, 400, observe=False)
    lines = [json.dumps(rec.header)] + [json.dumps(x) for x in rec.lines]
    target = next(i for i, x in enumerate(rec.lines) if x["events"])
    rec.lines[target]["events"].append(removed(12345, group=0))
    lines[target + 1] = json.dumps(rec.lines[target])
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = check_events(path)
    pos = report.violations[0].position
    assert (pos.line, pos.index) == (target + 2, len(rec.lines[target]["events"]) - 1)
    assert check_trace(path).divergence is not None  # and the trace checker disagrees too


# ------------------------------------------------------------------ what the reference loses


Scenario = tuple[RecordingLockstep, dict[str, Any], Callable[..., Request]]


def _scenario(hbs: int, num_blocks: int = 6) -> Scenario:
    pair, header = recording_pair(BlockPool, num_blocks, True, hbs, True)
    hasher = get_request_block_hasher(hbs)

    def request(rid: str, tokens: list[int]) -> Request:
        return Request(rid, tokens, block_hasher=hasher)

    return pair, header, request


def reannounce_scenario() -> Recording:
    """A prefix hit re-announced with emit_cached_block_events: two stores, one copy."""
    pair, header, request = _scenario(hbs=2)
    r1 = request("r1", [1, 2, 3, 4])
    blocks = pair.call("get_new_blocks", 2)
    pair.call("cache_full_blocks", r1, blocks, 0, 2, 2, 0)
    r2 = request("r2", [1, 2, 3, 4, 5])
    pair.call("touch", blocks)
    pair.call("emit_cached_block_events", r2, 2, 2, 0)
    pair.call("free_blocks", blocks[::-1])
    pair.call("free_blocks", blocks[::-1])
    pair.call("get_new_blocks", 5)  # evicts both cached blocks
    return Recording(header, pair.lines, None)


def clear_scenario() -> Recording:
    """reset_prefix_cache drops cached entries with one AllBlocksCleared, no removals."""
    pair, header, request = _scenario(hbs=2)
    blocks = pair.call("get_new_blocks", 2)
    pair.call("cache_full_blocks", request("r1", [1, 2, 3, 4]), blocks, 0, 2, 2, 0)
    pair.call("free_blocks", blocks[::-1])
    pair.call("reset_prefix_cache")
    return Recording(header, pair.lines, None)


def partial_scenario(promote: bool = True) -> Recording:
    """A partial entry names a parent at the hash_block_size grain, never announced."""
    pair, header, request = _scenario(hbs=1)
    r1 = request("r1", [1, 2, 3])
    blocks = pair.call("get_new_blocks", 1)
    pair.call("cache_partial_block", r1, blocks[0], 3, 0, 4)
    if promote:
        r1.append_output_token_ids(4)
        pair.call("cache_full_blocks", r1, blocks, 0, 1, 4, 0)
    return Recording(header, pair.lines, None)


def evicted_parent_scenario() -> Recording:
    """evict_blocks drops a running request's block; its next store names the removed key."""
    pair, header, request = _scenario(hbs=2)
    r1 = request("r1", [1, 2, 3, 4])
    blocks = pair.call("get_new_blocks", 2)
    pair.call("cache_full_blocks", r1, blocks, 0, 1, 2, 0)
    pair.call("evict_blocks", [blocks[0]])
    pair.call("cache_full_blocks", r1, blocks, 1, 2, 2, 0)
    return Recording(header, pair.lines, None)


def null_block_scenario() -> Recording:
    """Null (sliding-window) blocks are skipped in block_hashes but not in token_ids."""
    pair, header, request = _scenario(hbs=2)
    r1 = request("r1", [1, 2, 3, 4])
    blocks = pair.call("get_new_blocks", 1)
    pair.call("cache_full_blocks", r1, [0, blocks[0]], 0, 2, 2, 0)
    pair.call("cache_full_blocks", request("r2", [5, 6, 7, 8]), [0, 0], 0, 2, 2, 0)
    return Recording(header, pair.lines, None)


SCENARIOS = {
    "reannounce": reannounce_scenario, "clear": clear_scenario, "partial": partial_scenario,
    "evicted_parent": evicted_parent_scenario, "null_block": null_block_scenario,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_are_faithful_traces(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.jsonl"
    SCENARIOS[name]().write(path)
    assert check_trace(path).ok
    assert check_events(path).ok  # every loss below is silent: no rule can see it


def _report(rec: Recording, tmp_path: Path) -> Any:
    path = tmp_path / "s.jsonl"
    rec.write(path)
    return check_events(path)


def test_loss_reannounced_hits_leave_phantom_entries(tmp_path: Path) -> None:
    rec = reannounce_scenario()
    report = _report(rec, tmp_path)
    assert report.reannounced == 2   # the second store of each key had no new copy
    assert report.left_stored == 2   # both keys still look stored to the router ...
    assert rec.lines[-1]["observation"]["index"] == []  # ... but the pool's index is empty
    assert report.phantoms == 2


def test_loss_clear_comes_with_a_non_empty_index(tmp_path: Path) -> None:
    rec = clear_scenario()
    events = [e["type"] for x in rec.lines for e in x["events"]]
    assert events == ["BlockStored", "AllBlocksCleared"]  # no BlockRemoved before the clear
    assert _report(rec, tmp_path).left_stored == 0


def test_loss_partial_parent_is_exempt_only_when_sizes_tell(tmp_path: Path) -> None:
    promoted = partial_scenario()
    events = [e for x in promoted.lines for e in x["events"]]
    assert [e["type"] for e in events] == ["BlockStored", "BlockRemoved", "BlockStored"]
    assert events[0]["parent_block_hash"] is not None and events[0]["block_size"] == 1
    assert check_event_list(events).ok  # sizes 1 and 4 seen: the 1 is a partial entry
    alone = [e for x in partial_scenario(promote=False).lines for e in x["events"]]
    report = check_event_list(alone)
    assert report.ok and report.unverified_parents == 1
    assert [v.rule for v in check_event_list(alone, block_sizes={0: 1}).violations] == [
        "parent-unknown"]  # declared full size 1: it would be a full block, orphaned
    assert check_event_list(alone, block_sizes={0: 4}).ok


def test_loss_parent_may_be_already_removed(tmp_path: Path) -> None:
    events = [e for x in evicted_parent_scenario().lines for e in x["events"]]
    assert [e["type"] for e in events] == ["BlockStored", "BlockRemoved", "BlockStored"]
    assert events[2]["parent_block_hash"] == events[1]["block_hashes"][0]
    assert check_event_list(events).ok


def test_loss_null_blocks_misalign_tokens(tmp_path: Path) -> None:
    report = _report(null_block_scenario(), tmp_path)
    assert report.ok and report.token_mismatches == 1 and report.empty_stores == 1


# ------------------------------------------------------------------ command line and fuzzing


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _events_file(tmp_path / "good.jsonl", [stored([1]), removed(1)])
    bad = _events_file(tmp_path / "bad.jsonl", [removed(1)])
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"type": "BlockStored"}\n')
    assert check_events_main([str(good)]) == 0
    assert check_events_main([str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["violations"][0]["line"] == 1
    assert check_events_main([str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "junk.jsonl:1:" in err and "missing field" in err
    assert check_events_main([str(tmp_path / "missing.jsonl")]) == 2
    orphan = _events_file(tmp_path / "orphan.jsonl", [stored([2], parent=1, size=1),
                                                      stored([3], size=4)])
    assert check_events_main([str(orphan)]) == 0  # size 1 < 4: a partial entry
    assert check_events_main([str(orphan), "--block-sizes", "0=1"]) == 1
    with pytest.raises(SystemExit):
        check_events_main([str(orphan), "--block-sizes", "zero"])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, min_size=1, max_size=3),
    max_leaves=10)


@settings(settings.get_profile("readers"))
@given(st.lists(st.one_of(
    st.builds(stored, st.lists(st.integers(0, 5), max_size=3), st.none() | st.integers(0, 5),
              st.integers(0, 1), st.integers(1, 3)),
    st.builds(removed, st.integers(0, 5), st.integers(0, 1)),
    st.just(CLEARED), _json), max_size=12))
def test_fuzzed_event_streams_never_crash(tmp_path_factory: pytest.TempPathFactory,
                                          events: list[Any]) -> None:
    path = _events_file(tmp_path_factory.mktemp("f") / "e.jsonl", events)
    try:
        report = check_events(path)
    except TraceError as exc:
        assert exc.line >= 1 and str(path) in str(exc)
    else:
        assert all(v.position.line >= 1 for v in report.violations)


@settings(settings.get_profile("readers"))
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("b") / "e.jsonl"
    path.write_bytes(data)
    try:
        check_events(path)
    except TraceError as exc:
        assert exc.line >= 1


def test_a_trace_whose_calls_hide_their_events_is_read_at_take_events(tmp_path: Path) -> None:
    """A pool that shows no per-call events (``events: null``) hands them over in take_events."""
    seed = _event_seeds(1, start=40)[0]
    rec = record(BlockPool, seed, 300)
    full = tmp_path / "full.jsonl"
    rec.write(full)
    lines = [json.loads(raw) for raw in full.read_text().splitlines()]
    taken = sum(len(line["result"] or ()) for line in lines[1:]
                if line.get("op") == "take_events" and line.get("error") is None)
    assert taken > 0
    hidden = tmp_path / "hidden.jsonl"
    hidden.write_text("".join(json.dumps({**line, "events": None} if "op" in line else line) + "\n"
                              for line in lines))
    report = check_events(hidden)
    assert report.ok, report.format()
    assert report.events == taken + sum(line.get("op") == "_insert_block_hash" and line.get("error") is None
                                        for line in lines[1:])
    assert check_events_main([str(hidden)]) == 0
