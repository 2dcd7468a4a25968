"""Router profiles against the pool: the regression corpus, the warnings, the command line, random runs.

The corpus (``tests/routers/*.jsonl``, written by ``tests/routers/make_corpus.py``)
holds the smallest call sequences where a real router's index departs from what
the pool serves.  The verdict of each profile on each case is written here by
hand, from the routers' sources (``docs/routers.md`` walks through each).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.cli.events import check_events_main
from kvpool.cli.trace import check_trace_main
from kvpool.impl import BlockPool
from kvpool.oracle.events.check import check_stream, load_events, read_items, read_stream
from kvpool.oracle.events.routers import (
    PROFILES,
    REACTION_KINDS,
    RouterReport,
    check_trace_routers,
    parse_options,
    profile_factory,
)
from kvpool.oracle.events.warnings import WARNINGS, add_warnings, find_warnings
from kvpool.oracle.trace import check_trace, record

CORPUS = Path(__file__).resolve().parent / "routers"

EXPECTED: dict[str, dict[str, list[str]]] = {
    # kind@line:rule, for every difference (at the call it appears after) and every input not
    # indexed as meant (at its event's line).  A profile not listed agrees with the pool throughout.
    "reannounce": {  # stored, stored (a hit announced again, no new copy), removed
        "refcount": ["over-claim@8:refcount.store"],
        "dynamo": ["over-claim@8:dynamo.dedup-remove"],
    },
    "second_copy": {  # stored, stored (a second physical copy), removed: one copy stays
        "set": ["under-claim@7:set.remove"],
        "llm-d:2025": ["under-claim@7:llm-d.evict"],
        "llm-d:2026": ["under-claim@7:llm-d.evict"],
    },
    "clear": {
        "llm-d:2025": ["ignored-clear@5:llm-d.clear-ignored", "over-claim@5:llm-d.clear-ignored"],
    },
    "evicted_parent": {
        "dynamo": ["dropped-store@5:dynamo.parent-not-found", "under-claim@7:dynamo.parent-not-found"],
        "llm-d:2025": ["restarted-chain@5:llm-d.parent-restart", "under-claim@7:llm-d.parent-restart"],
        "llm-d:2026": ["dropped-store@5:llm-d.parent-drop", "under-claim@7:llm-d.parent-drop"],
    },
    "null_block": {
        "dynamo": ["misread-store@3:dynamo.block-size", "over-claim@3:dynamo.block-size"],
        "llm-d:2025": ["dropped-store@3:llm-d.add-strict"],
        "llm-d:2026": ["misread-store@3:llm-d.request-keys", "over-claim@3:llm-d.request-keys"],
    },
    "empty_store": {
        "llm-d:2026": ["unhandled@2:llm-d.add-ratio"],
    },
    "self_reference": {
        "dynamo": ["misread-store@3:dynamo.block-size", "over-claim@3:dynamo.block-size",
                   "unhandled@5:dynamo.self-reference"],
        "llm-d:2025": ["dropped-store@3:llm-d.add-strict"],
        "llm-d:2026": ["misread-store@3:llm-d.request-keys", "over-claim@3:llm-d.request-keys"],
    },
    "groups_equal": {
        "llm-d:2025": ["under-claim@6:llm-d.pod-entry"],
        "llm-d:2026": ["over-claim@6:llm-d.score"],
    },
    "groups_sizes": {
        "llm-d:2025": ["dropped-store@5:llm-d.add-strict", "under-claim@6:llm-d.pod-entry"],
        "llm-d:2026": ["over-claim@6:llm-d.score"],
    },
    "sliding_window": {
        "llm-d:2025": ["dropped-store@5:llm-d.add-strict", "over-claim@5:llm-d.pod-entry"],
        "llm-d:2026": ["misread-store@5:llm-d.request-keys", "over-claim@5:llm-d.request-keys",
                       "over-claim@6:llm-d.score"],
    },
}

EXPECTED_WARNINGS: dict[str, list[tuple[str, int]]] = {
    "reannounce": [("reannounced-hit", 5)] * 2,
    "second_copy": [("second-copy", 5)] * 2,
    "clear": [],
    "evicted_parent": [("parent-removed", 5)],
    "null_block": [("tokens-not-filling", 3)],
    "empty_store": [("empty-store", 2)],
    "self_reference": [("tokens-not-filling", 3), ("second-copy", 5)],
    "groups_equal": [("hash-in-two-groups", 5)] * 2,
    "groups_sizes": [("hash-in-two-groups", 5)] * 2,
    "sliding_window": [("tokens-not-filling", 5), ("hash-in-two-groups", 5)],
}


def _findings(report: RouterReport) -> list[str]:
    return sorted({f"{d.kind}@{d.line}:{d.cause.rule}" for d in report.differences}
                  | {f"{r.kind}@{r.position.line}:{r.rule}" for r, _ in report.reactions})


def _all_profiles(path: Path) -> dict[str, RouterReport]:
    result, reports = check_trace_routers(path, [profile_factory(p) for p in PROFILES])
    assert result.ok, result.format()
    return {r.profile: r for r in reports}


# ------------------------------------------------------------------ the corpus


def test_corpus_is_what_the_script_writes(tmp_path: Path) -> None:
    written = _script(CORPUS / "make_corpus.py").write(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in CORPUS.glob("*.jsonl"))
    assert sorted(p.stem for p in written) == sorted(EXPECTED)
    for p in written:
        assert p.read_bytes() == (CORPUS / p.name).read_bytes(), p.name


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_corpus_case_is_what_the_pool_does(case: str) -> None:
    assert check_trace(CORPUS / f"{case}.jsonl").ok  # the model emits exactly these events


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_each_profile_gives_its_expected_verdict(case: str) -> None:
    reports = _all_profiles(CORPUS / f"{case}.jsonl")
    assert {name: _findings(r) for name, r in reports.items() if _findings(r)} == EXPECTED[case]
    for name, r in reports.items():
        assert r.ok == (name not in EXPECTED[case])
        assert r.queries > 0  # every case asks the profile something


def test_no_profile_is_right_on_both_readings_of_a_repeated_store() -> None:
    """Per key the same stream (stored, stored, removed); the pool serves the key in one case only."""
    wrong = {case: {p for p in EXPECTED[case]} for case in ("reannounce", "second_copy")}
    assert not any(p not in wrong["reannounce"] and p not in wrong["second_copy"] for p in PROFILES)


def test_every_named_rule_cites_a_source_and_revision() -> None:
    for case in EXPECTED:
        for r in _all_profiles(CORPUS / f"{case}.jsonl").values():
            named = {d.cause.rule for d in r.differences} | {x.rule for x, _ in r.reactions}
            for rule in named:
                source = r.rules[rule].source
                assert "@" in source or source.startswith("kvpool "), (rule, source)
            assert {x.kind for x, _ in r.reactions} <= set(REACTION_KINDS)


def test_a_difference_names_its_rule_and_the_call_that_applied_it(capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    path = CORPUS / "reannounce.jsonl"
    assert check_trace_main([str(path), "--router", "dynamo", "--json"]) == 4
    out = json.loads(capsys.readouterr().out)
    diff = out["routers"][0]["differences"][0]
    assert (diff["kind"], diff["line"], diff["rule"], diff["cause_op"]) == (
        "over-claim", 8, "dynamo.dedup-remove", "evict_blocks")
    assert "event_processor.rs@" in out["routers"][0]["rules"]["dynamo.dedup-remove"]["source"]
    assert check_trace_main([str(path), "--router", "set"]) == 0
    text = capsys.readouterr().out
    assert "router set" in text and "0 over-claim(s), 0 under-claim(s)" in text
    assert check_trace_main([str(path), "--router", "refcount", "--router", "llm-d:2025"]) == 4
    text = capsys.readouterr().out
    assert f"{path}:8: after evict_blocks: over-claim of r1" in text and "refcount.store" in text


def test_a_reannounced_hit_is_the_cause_of_the_over_claim_it_leaves() -> None:
    """Stored at line 3, announced again at line 5 (no new copy), removed at line 8: the store still
    counted is the re-announcement's, and each over-claim says so, not the original store."""
    _, reports = check_trace_routers(CORPUS / "reannounce.jsonl",
                                          [profile_factory("refcount"), profile_factory("dynamo")])
    refcount, dynamo = (r.differences[0] for r in reports)
    assert refcount.cause.position is not None and refcount.cause.position.line == 5
    assert refcount.cause_op == "emit_cached_block_events"
    assert dynamo.cause.rule == "dynamo.dedup-remove" and "the latest at line 5" in dynamo.cause.detail


# ------------------------------------------------------------------ warnings


@pytest.mark.parametrize("case", sorted(EXPECTED_WARNINGS))
def test_check_events_warns_at_the_line(case: str) -> None:
    path = CORPUS / f"{case}.jsonl"
    stream = load_events(path)
    report = add_warnings(check_stream(stream, str(path)), stream, path, stream.is_trace)
    assert report.ok
    assert [(w.rule, w.position.line) for w in report.warnings] == EXPECTED_WARNINGS[case]
    assert all(w.rule in WARNINGS for w in report.warnings)


def _bare(tmp_path: Path, case: str) -> Path:
    """A corpus case's events as a bare stream, one event a line."""
    out = tmp_path / f"{case}.events.jsonl"
    out.write_text("".join(json.dumps(e) + "\n" for _, e in load_events(CORPUS / f"{case}.jsonl").events))
    return out


def test_a_stream_alone_cannot_tell_a_reannounced_hit_from_a_second_copy(tmp_path: Path) -> None:
    seen = []
    for case in ("reannounce", "second_copy"):
        stream = load_events(_bare(tmp_path, case))
        seen.append([(w.rule, w.position.line) for w in find_warnings(stream.events)])
    assert seen[0] == seen[1] == [("stored-again", 2), ("stored-again", 2)]


def _stored(h: int, parent: int | None = None, **kw: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent, "token_ids": [1, 2],
            "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0, **kw}


def test_medium_and_lora_changes_inside_a_chain_are_warned(tmp_path: Path) -> None:
    events = [_stored(1), _stored(2, 1, medium="CPU"), _stored(3, 2, medium="CPU", lora_name="a", lora_id=1),
              _stored(4, 3, medium="CPU", lora_name="a", lora_id=1)]
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    warnings = find_warnings(load_events(path).events)
    assert [(w.rule, w.position.line) for w in warnings] == [("medium-change", 2), ("lora-change", 3)]


def test_strict_fails_on_warnings_and_json_carries_their_lines(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CORPUS / "evicted_parent.jsonl")
    assert check_events_main([path]) == 0
    capsys.readouterr()
    assert check_events_main([path, "--strict", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["violations"] == []
    assert [(w["rule"], w["line"], w["event"]) for w in out["warnings"]] == [("parent-removed", 5, 0)]
    assert check_events_main([str(CORPUS / "clear.jsonl"), "--strict"]) == 0


# ------------------------------------------------------------------ a stream through a router


def test_a_bare_stream_through_a_router_reports_what_it_cannot_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = str(_bare(tmp_path, "empty_store"))
    assert check_events_main([bare, "--router", "llm-d:2025"]) == 0
    capsys.readouterr()
    assert check_events_main([bare, "--router", "llm-d", "--json"]) == 1
    (router,) = json.loads(capsys.readouterr().out)["routers"]
    assert router["profile"] == "llm-d:2026" and router["queries"] == 0
    assert [(r["kind"], r["rule"], r["line"]) for r in router["reactions"]] == [
        ("unhandled", "llm-d.add-ratio", 1)]
    assert "re-announced hit and a second copy are the same events" in router["note"]
    stream = load_events(_bare(tmp_path, "self_reference"))
    name, factory = profile_factory("dynamo")
    report = read_stream(stream, "s", {0: 2}, [(name, factory)])[1][0]
    assert [(r.kind, r.rule, r.position.line) for r, _ in report.reactions] == [
        ("misread-store", "dynamo.block-size", 1), ("unhandled", "dynamo.self-reference", 2)]
    assert report.repeated_stores == 1


def test_unknown_router_or_option_is_a_usage_error() -> None:
    for bad in ("nginx", "llm-d:2024", "llm-d:2026,clear=maybe", "llm-d:2026,colour=on"):
        with pytest.raises(SystemExit) as exc:
            check_trace_main([str(CORPUS / "clear.jsonl"), "--router", bad])
        assert exc.value.code == 2


def test_llmd_release_options() -> None:
    assert parse_options("2025") == parse_options("2026,clear=off,parent=restart,add=strict,groups=off,"
                                                  "lora=off,extra=off")
    fixed = profile_factory("llm-d:2025,clear=on")
    report = check_trace_routers(CORPUS / "clear.jsonl", [fixed])[1][0]
    assert report.ok and report.profile == "llm-d:2025,clear=on"  # the fix of 7be76e1 alone mends it


# ------------------------------------------------------------------ random recorded runs


def _script(path: Path) -> Any:
    """A committed script, loaded as a module (tests/ and scripts/ are not packages)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", _script(CORPUS.parents[1] / "scripts" / "router_survey.py").seeds(6))
def test_on_recorded_runs_each_reading_errs_one_way_and_check_events_says_where(
        tmp_path: Path, seed: int) -> None:
    """On kvpool's pool the set reading never over-claims (every entry that goes is announced) and
    the refcount reading never under-claims (every copy is announced); each error of theirs has a
    warning check-events now positions: a re-announced hit, a second copy."""
    rec = record(BlockPool, seed, 300)
    path = tmp_path / "t.jsonl"
    rec.write(path)
    reports = _all_profiles(path)
    assert reports["set"].over == 0 and reports["refcount"].under == 0
    stream = load_events(path)
    warned = {w.rule for w in add_warnings(check_stream(stream, str(path)), stream, path, True).warnings}
    if reports["refcount"].over:
        assert "reannounced-hit" in warned
    if reports["set"].under:
        assert "second-copy" in warned
    lines = len(rec.lines) + 1
    for r in reports.values():
        assert r.stopped is None and r.lines == len(rec.lines)
        assert all(2 <= d.line <= lines and d.predicted != d.served for d in r.differences)
        assert r.over + r.under >= len(r.differences)


# ------------------------------------------------------------------ any stream


_hashes = st.lists(st.integers(0, 5), max_size=3)


def _fuzz_stored(hashes: list[int], parent: int | None, group: int, size: int, tokens: int,
                 medium: str | None, lora: str | None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(tokens)), "block_size": size, "lora_id": None, "medium": medium,
            "lora_name": lora, "group_idx": group,
            "extra_keys": [None if i % 2 else ["s", ["img", 0]] for i in range(len(hashes))]}


_streams = st.lists(st.one_of(
    st.builds(_fuzz_stored, _hashes, st.none() | st.integers(0, 5), st.integers(0, 1), st.integers(0, 3),
              st.integers(0, 8), st.sampled_from(["GPU", "CPU", None]), st.sampled_from([None, "a"])),
    st.builds(lambda h, g: {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": g},
              st.integers(0, 5), st.integers(0, 1)),
    st.just({"type": "AllBlocksCleared"})), max_size=14)


@given(_streams)
def test_any_stream_reads_through_every_profile_and_the_warnings(events: list[dict[str, Any]]) -> None:
    from kvpool.oracle.events.check import Position
    from kvpool.oracle.events.routers import Query

    positioned = [(Position(i + 1), e) for i, e in enumerate(events)]
    for w in find_warnings(positioned):
        assert w.rule in WARNINGS and 1 <= w.position.line <= len(events)
    query = Query("q", 0, 2, (0, 1, 2, 3), (0, 1), "a", (("img", 0, 1),))
    for name in PROFILES:
        label, factory = profile_factory(name)
        report = read_items(((p, e, None) for p, e in positioned), "s", {0: 2, 1: 2}, None,
                            [(label, factory)])[1][0]
        assert all(r.kind in REACTION_KINDS and r.rule in report.rules for r, _ in report.reactions)
        profile = factory({0: 2, 1: 2})
        for _, e in positioned:
            profile.feed(e, Position(1))
        held = profile.prefix(query)
        assert 0 <= held <= len(query.hashes)
        for block in range(len(query.hashes)):
            assert profile.explain(query, block, held=block < held).rule in profile.rules


@given(_streams)
def test_a_profile_told_no_query_comes_reacts_and_answers_as_one_that_explains(
        events: list[dict[str, Any]]) -> None:
    """A reading's profiles (the watcher's) keep nothing only an explanation needs: the same reactions,
    the same index, and explain refuses rather than answering from what it did not keep."""
    from kvpool.oracle.events.check import Position
    from kvpool.oracle.events.routers import Query

    query = Query("q", 0, 2, (0, 1, 2, 3), (0, 1), "a", (("img", 0, 1),))
    for name in PROFILES:
        factory = profile_factory(name)[1]
        full, lean = factory({0: 2, 1: 2}), factory({0: 2, 1: 2})
        lean.unasked()
        for i, e in enumerate(events):
            assert full.feed(e, Position(i + 1)) == lean.feed(e, Position(i + 1))
        assert full.prefix(query) == lean.prefix(query)
        if name in ("dynamo", "llm-d:2025", "llm-d:2026"):
            with pytest.raises(RuntimeError, match="unasked"):
                lean.explain(query, 0, held=False)


def test_a_pool_that_hides_each_calls_events_is_read_at_take_events(tmp_path: Path) -> None:
    """With ``events: null`` on every line, the stream is what ``take_events`` hands over: until
    then the router has been told nothing (under-claims), after it what it always reads."""
    lines = (CORPUS / "reannounce.jsonl").read_text().splitlines()
    header, calls = lines[0], [json.loads(x) for x in lines[1:]]
    handed = [e for c in calls for e in c["events"]]
    for c in calls:
        c["events"] = None
    calls.append({"op": "take_events", "args": {}, "result": handed, "error": None, "events": None})
    path = tmp_path / "hidden.jsonl"
    path.write_text("\n".join([header, *(json.dumps(c) for c in calls)]) + "\n")
    result, (report,) = check_trace_routers(path, [profile_factory("refcount")])
    assert result.ok and report.events == len(handed) == 4
    taken = len(calls) + 1
    found = [(d.kind, d.line) for d in report.differences]
    assert {line for kind, line in found if kind == "over-claim"} == {taken}
    assert {kind for kind, line in found if line < taken} == {"under-claim"}


@pytest.mark.parametrize("release", ["2025", "2026"])
def test_llmd_keeps_a_request_keys_entries_of_each_tier_and_group_apart(release: str) -> None:
    """A request key stored from two tiers (and, in 2026, two groups) holds an entry per tier and
    group: a removal takes its own off, the key is held until the last one goes."""
    from kvpool.oracle.events.check import Position
    from kvpool.oracle.events.routers import Query

    def stored(h: int, medium: str, group: int) -> dict[str, Any]:
        return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": None,
                "token_ids": [7, 8], "block_size": 2, "lora_id": None, "medium": medium,
                "lora_name": None, "group_idx": group}

    def removed(h: int, medium: str, group: int) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": [h], "medium": medium, "group_idx": group}

    query = Query("q", 0, 2, (7, 8), (1,))
    for lean in (False, True):
        profile = profile_factory(f"llm-d:{release}")[1]({0: 2, 1: 2})
        if lean:
            profile.unasked()
        held = []
        for i, e in enumerate([stored(1, "GPU", 0), stored(2, "CPU", 0), stored(3, "GPU", 1),
                               removed(1, "GPU", 0), removed(2, "CPU", 0), removed(3, "GPU", 1)]):
            profile.feed(e, Position(i + 1))
            held.append(profile.prefix(query))
        # with no group in an entry (2025), the group-1 store adds the GPU entry already there
        assert held == ([1, 1, 1, 1, 1, 0] if release == "2026" else [1, 1, 1, 1, 0, 0]), (release, lean)
