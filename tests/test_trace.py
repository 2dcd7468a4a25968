"""Traces: record then check round-trips, tampering is found at its line, and
the reader turns every bad file into one TraceError naming the line.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.bugs.pools import FreeHashedToHead
from kvpool.cli.trace import check_trace_main, record_main
from kvpool.impl import BlockPool
from kvpool.oracle.trace import (
    TraceError,
    check_trace,
    record,
    record_adapter,
)
from kvpool.oracle.trace.read import iter_trace


def _write(path: Path, header: dict[str, Any], lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in [header, *lines]))
    return path


@pytest.fixture(scope="module")
def recorded() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One recorded run with events on, shared by the tampering tests (read-only)."""
    rec = record(BlockPool, 1, 300)
    assert rec.divergence is None and rec.header["enable_kv_cache_events"]
    return rec.header, rec.lines


def _copy(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return json.loads(json.dumps(lines))  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", range(6))
def test_round_trip(tmp_path: Path, seed: int) -> None:
    rec = record(BlockPool, seed, 250, observe=seed % 2 == 0)
    assert rec.divergence is None
    path = tmp_path / "t.jsonl"
    rec.write(path)
    report = check_trace(path)
    assert report.ok, report.format()
    assert report.steps == len(rec.lines) == len(list(iter_trace(path)[1]))


def test_record_through_an_adapter(tmp_path: Path) -> None:
    from kvpool.oracle.core.adapter import kvpool_adapter

    rec = record_adapter(kvpool_adapter(), 5, 150)
    assert rec.divergence is None
    path = tmp_path / "t.jsonl"
    rec.write(path)
    assert check_trace(path).ok


def test_round_trip_without_misuse(tmp_path: Path) -> None:
    rec = record(BlockPool, 7, 200, misuse=False, reference="0.31")
    path = tmp_path / "t.jsonl"
    rec.write(path)
    assert check_trace(path).ok


def _first(lines: list[dict[str, Any]], pred: Any) -> int:
    return next(i for i, x in enumerate(lines) if pred(x))


@pytest.mark.parametrize("what", ["result", "event_field", "error_class", "extra_event",
                                  "missing_event", "observation", "fired", "take_events"])
def test_tampered_trace_diverges_at_the_right_line(
    tmp_path: Path, recorded: tuple[dict[str, Any], list[dict[str, Any]]], what: str,
) -> None:
    header, original = recorded
    lines = _copy(original)
    if what == "result":
        i = _first(lines, lambda x: x["op"] == "get_new_blocks" and x["result"])
        lines[i]["result"][0] += 1
        expect = "result"
    elif what == "event_field":
        i = _first(lines, lambda x: any(e["type"] == "BlockStored" for e in x["events"]))
        event = next(e for e in lines[i]["events"] if e["type"] == "BlockStored")
        event["token_ids"][0] += 1
        expect = ".token_ids"
    elif what == "error_class":
        i = _first(lines, lambda x: x["error"])
        lines[i]["error"] = "BlockHashConflictError"
        expect = "error: recorded BlockHashConflictError"
    elif what == "extra_event":
        i = _first(lines, lambda x: x["op"] == "touch")
        lines[i]["events"].append({"type": "AllBlocksCleared"})
        expect = "recorded 1 event(s), model 0"
    elif what == "missing_event":
        i = _first(lines, lambda x: x["events"])
        lines[i]["events"].pop()
        expect = "events"
    elif what == "observation":
        i = _first(lines, lambda x: x["op"] == "free_blocks" and x["observation"]["free"])
        lines[i]["observation"]["free"].reverse()
        lines[i]["observation"]["free"].append(0)
        expect = "observation.free"
    elif what == "fired":
        i = 5
        lines[i]["fired"] = [["r1", 1]]
        expect = "fired"
    else:
        i = _first(lines, lambda x: x["op"] == "take_events" and x["result"]
                   and x["result"][0]["type"] != "AllBlocksCleared")
        lines[i]["result"][0]["medium"] = "CPU"
        expect = "result[0].medium"
    report = check_trace(_write(tmp_path / "t.jsonl", header, lines))
    assert report.divergence is not None
    assert report.divergence.line == i + 2  # the header is line 1
    assert report.divergence.step == i + 1
    assert any(expect in d for d in report.divergence.diffs), report.format()
    assert f"t.jsonl:{i + 2}:" in report.format()


def test_hex_and_int_event_hashes_are_the_same_hash(
    tmp_path: Path, recorded: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """A writer may give event hashes as full hex bytes; they compare by their low 64 bits."""
    header, original = recorded
    lines = _copy(original)
    i = _first(lines, lambda x: x["op"] == "cache_full_blocks" and x["events"]
               and x["events"][-1]["block_hashes"] and x["args"].get("block_mask") is None
               and x["args"]["block_ids"][x["args"]["num_cached_blocks"]] != 0)
    request = lines[i]["args"]["request"]
    event = lines[i]["events"][-1]
    bs = lines[i]["args"]["block_size"] // header["hash_block_size"]
    start = lines[i]["args"]["num_cached_blocks"]
    full_hex = request["block_hashes"][(start + 1) * bs - 1]
    assert int(full_hex, 16) & (2**64 - 1) == event["block_hashes"][0]
    event["block_hashes"][0] = full_hex
    assert check_trace(_write(tmp_path / "t.jsonl", header, lines)).ok


DOC = Path(__file__).resolve().parent.parent / "oracle" / "TRACE_FORMAT.md"


def _doc_example() -> str:
    """The trace under "A complete example" in TRACE_FORMAT.md: the doc is what is tested."""
    section = DOC.read_text().split("## A complete example", 1)[1]
    return section.split("```\n", 2)[1]


def test_a_hand_written_trace_checks(tmp_path: Path) -> None:
    """The minimal trace of TRACE_FORMAT.md, as another language would write it: no
    optional fields, made-up hashes, event hashes as hex or int."""
    text = _doc_example()
    path = tmp_path / "hand.jsonl"
    path.write_text(text)
    report = check_trace(path)
    assert report.ok, report.format()
    assert report.steps == 7
    lines = text.splitlines()
    lines[6] = lines[6].replace('"result": [3, 2]', '"result": [2, 3]')
    path.write_text("\n".join(lines) + "\n")
    report = check_trace(path)
    assert report.divergence is not None and report.divergence.line == 7


def test_a_buggy_pool_is_recorded_up_to_its_divergence(tmp_path: Path) -> None:
    for seed in range(20):
        rec = record(FreeHashedToHead, seed, 400)
        if rec.divergence:
            break
    assert rec.divergence
    path = tmp_path / "bug.jsonl"
    rec.write(path)
    report = check_trace(path)
    assert report.divergence is not None
    assert report.divergence.step == len(rec.lines)  # the call where lockstep stopped
    assert any("observation.free" in d for d in report.divergence.diffs)


# ------------------------------------------------------------------ precise read errors

HEADER = {"kvpool_trace": 1, "num_blocks": 4, "enable_caching": True, "hash_block_size": 2,
          "enable_kv_cache_events": True, "medium": "GPU"}
STEP = {"op": "get_new_blocks", "args": {"num_blocks": 1}, "result": [1], "error": None,
        "events": []}
REQ = {"request_id": "r", "all_token_ids": [1, 2], "block_hashes": ["00ff"]}


@pytest.mark.parametrize(("lines", "line", "message"), [
    (["{not json"], 1, "bad JSON"),
    ([HEADER, '{"op": "touch", "args": {"block_ids": [1]}, '], 2, "bad JSON"),
    ([{**HEADER, "kvpool_trace": 2}], 1, "unsupported trace version 2"),
    ([{**HEADER, "kvpool_trace": True}], 1, "unsupported trace version true"),
    ([{k: v for k, v in HEADER.items() if k != "medium"}], 1, "missing field 'medium'"),
    ([{**HEADER, "num_blocks": 10**12}], 1, "header.num_blocks"),
    ([{**HEADER, "reference": ["0.31"]}], 1, "header.reference"),
    ([HEADER, {**STEP, "events": [{"type": ["BlockStored"]}]}], 2, "events[0].type"),
    ([{"op": "touch"}], 1, "missing field 'kvpool_trace'"),
    ([HEADER, {**STEP, "op": "allocate"}], 2, "unknown operation \"allocate\""),
    ([HEADER, {k: v for k, v in STEP.items() if k != "events"}], 2, "missing field 'events'"),
    ([HEADER, STEP, {**STEP, "args": {"num_blocks": "1"}}], 3, "args.num_blocks: expected an integer"),
    ([HEADER, {**STEP, "args": {"num_blocks": True}}], 2, "args.num_blocks: expected an integer"),
    ([HEADER, {**STEP, "args": {"num_blocks": 2**70}}], 2, "does not fit in 64 bits"),
    ([HEADER, {**STEP, "args": {"n": 1}}], 2, "unknown field 'n'"),
    ([HEADER, {**STEP, "result": "x"}], 2, "result: expected a list"),
    ([HEADER, {**STEP, "error": "Not An Error"}], 2, "error: expected null"),
    ([HEADER, {**STEP, "error": "X"}], 2, "result: must be null"),
    ([HEADER, {**STEP, "events": [{"type": "BlockGone"}]}], 2, "events[0].type"),
    ([HEADER, {**STEP, "events": [{"type": "BlockRemoved", "block_hashes": [-1],
                                    "medium": None}]}], 2, "events[0].block_hashes[0]"),
    ([HEADER, {**STEP, "op": "get_cached_block", "result": None,
               "args": {"block_hash": "XYZ", "kv_cache_group_ids": [0]}}], 2, "args.block_hash"),
    ([HEADER, {**STEP, "op": "emit_cached_block_events", "result": None,
               "args": {"request": {**REQ, "all_token_ids": [1.5]}, "num_cached_blocks": 1,
                        "block_size": 2, "kv_cache_group_id": 0}}],
     2, "args.request.all_token_ids[0]"),
    ([HEADER, {**STEP, "observation": {"ref": []}}], 2, "observation: missing field"),
    ([HEADER, "[" * 100_000 + "]" * 100_000], 2, "nested too deeply"),
    ([HEADER, '{"op": NaN}'], 2, "NaN is not valid JSON"),
    ([HEADER, "9" * 5000], 2, "bad JSON"),
    ([], 1, "empty file"),
])
def test_read_errors_name_the_line(tmp_path: Path, lines: list[Any], line: int, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with pytest.raises(TraceError) as info:
        list(iter_trace(path)[1])
    assert info.value.line == line
    assert message in str(info.value)
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r"bin.jsonl:2: not UTF-8"):
        list(iter_trace(path)[1])
    with pytest.raises(TraceError, match="cannot read"):
        list(iter_trace(tmp_path / "nothing.jsonl")[1])


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    assert record_main([str(path), "--seed", "2", "--steps", "120"]) == 0
    assert check_trace_main([str(path)]) == 0
    assert "agree with the model" in capsys.readouterr().out
    lines = path.read_text().splitlines()
    step = json.loads(lines[3])
    step["error"] = "UnknownBlockError"
    step["result"] = None
    lines[3] = json.dumps(step)
    path.write_text("\n".join(lines) + "\n")
    assert check_trace_main([str(path)]) == 1
    assert f"{path}:4: step 3" in capsys.readouterr().out
    path.write_text("\n".join(lines[:2]) + "\n{\"op\"")
    assert check_trace_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}:3: bad JSON" in err and "Traceback" not in err
    assert record_main([str(path), "--pool", "kvpool.impl:BlockPool", "--steps", "30",
                        "--no-observe", "--no-misuse"]) == 0
    with pytest.raises(SystemExit) as exit_info:
        record_main([str(path), "--pool", "no_such_module:X"])
    assert exit_info.value.code == 2


# ------------------------------------------------------------------ fuzzing the reader

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, min_size=1, max_size=3),
    max_leaves=8)


@pytest.fixture(scope="module")
def small_trace() -> list[str]:
    """A short run with caching and events on, so requests and events get mutated too."""
    rec = record(BlockPool, 28, 40)  # two groups, partial entries, 27 events
    assert rec.header["enable_caching"] and rec.header["enable_kv_cache_events"]
    return [json.dumps(x) for x in [rec.header, *rec.lines]]


def _survives(path: Path) -> None:
    """check_trace either answers or raises one TraceError naming a line of this file."""
    try:
        check_trace(path)
    except TraceError as exc:
        assert exc.path == str(path) and exc.line >= 1, exc
        assert "\n" not in str(exc)


@settings(settings.get_profile("readers"))
@given(data=st.data())
def test_fuzz_truncated_and_corrupted(tmp_path_factory: pytest.TempPathFactory,
                                      small_trace: list[str], data: st.DataObject) -> None:
    text = "\n".join(small_trace).encode()
    cut = data.draw(st.integers(0, len(text)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, max(0, cut - 1)), st.integers(0, 255)),
                               max_size=4))
    raw = bytearray(text[:cut])
    for pos, byte in flips:
        if pos < len(raw):
            raw[pos] = byte
    path = tmp_path_factory.mktemp("c") / "t.jsonl"
    path.write_bytes(bytes(raw))
    _survives(path)


_DEEP = "<deeply nested list>"  # spliced in as text: the test itself could not build it


@functools.cache
def _fuzz_harness() -> Any:
    """fuzz/fuzz_readers.py, loaded from its file (a script, not a module of the package): the
    atheris harness, whose JSON-aware mutations the tests here draw from too."""
    spec = importlib.util.spec_from_file_location(
        "fuzz_readers", Path(__file__).parent.parent / "fuzz" / "fuzz_readers.py")
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    return harness


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "crosshair",
                    reason="a symbolic nesting depth (up to 50,000) stalls CrossHair's solver for "
                           "minutes; the byte-level fuzz tests run under it")
@settings(settings.get_profile("readers"))
@given(data=st.data())
def test_fuzz_wrong_types_huge_numbers_deep_nesting(
    tmp_path_factory: pytest.TempPathFactory, small_trace: list[str], data: st.DataObject,
) -> None:
    line_no = data.draw(st.integers(0, len(small_trace) - 1))
    obj = json.loads(small_trace[line_no])
    harness = _fuzz_harness()
    path_in = data.draw(st.sampled_from(harness._slots(obj)[1:]))
    replacement = data.draw(st.one_of(
        _json, st.integers(min_value=-(2**200), max_value=2**200),
        st.just(_DEEP),
        st.sampled_from([0, -1, 2**63, 2**64, 10**30, "", "00", "ff" * 40, [], {}, None])))
    harness._parent(obj, path_in)[path_in[-1]] = replacement
    lines = list(small_trace)
    depth = data.draw(st.integers(1, 50_000))
    lines[line_no] = json.dumps(obj).replace(json.dumps(_DEEP), "[" * depth + "]" * depth)
    path = tmp_path_factory.mktemp("w") / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _survives(path)


@settings(settings.get_profile("readers"))
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("r") / "t.jsonl"
    path.write_bytes(data)
    _survives(path)


def test_atheris_harness_property_on_its_seeds_and_mutations(tmp_path: Path) -> None:
    """fuzz/fuzz_readers.py without atheris: its seeds and JSON-aware mutations keep the property."""
    harness = _fuzz_harness()
    harness.load_readers()
    counts = harness.write_seeds(tmp_path)
    assert counts["trace"] >= 8 and counts["events"] >= 8, counts
    rng = random.Random(0)
    for reader in harness.READERS:
        seeds = sorted((tmp_path / reader).iterdir())
        for seed in seeds:
            harness.run_one(reader, seed.read_bytes())
        for _ in range(60):
            data = rng.choice(seeds).read_bytes()
            for _ in range(rng.randint(1, 3)):
                data = harness.mutate_structure(data, rng) or data
            harness.run_one(reader, data)


def test_what_the_format_calls_optional_may_be_left_out(
    tmp_path: Path, recorded: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Optional event fields, the internal parts of observations and a call's events (null):
    a writer whose pool does not show them leaves them out, and the trace still checks."""
    header, original = recorded
    lines = _copy(original)
    for line in lines:
        for event in [*(line["events"] or []), *(line["result"] if line["op"] == "take_events" else [])]:
            for optional in ("extra_keys", "group_idx", "session_id", "locality"):
                event.pop(optional, None)
        if line.get("observation"):
            for internal in ("secondary", "index", "watched"):
                line["observation"].pop(internal)
            line["observation"]["primary"] = [None if p is None else [p[0], None]
                                              for p in line["observation"]["primary"]]
        if line["op"] != "take_events":
            line["events"] = None
    report = check_trace(_write(tmp_path / "t.jsonl", header, lines))
    assert report.ok, report.format()
    i = _first(lines, lambda x: x["op"] == "take_events" and any(
        e["type"] == "BlockStored" for e in x["result"]))
    stored = next(e for e in lines[i]["result"] if e["type"] == "BlockStored")
    stored["extra_keys"] = [["bogus"]] * len(stored["block_hashes"])  # written: compared
    assert check_trace(_write(tmp_path / "t.jsonl", header, lines)).divergence is not None
