"""The wire as vLLM encodes it, read without vLLM: both event forms, every field of 0.31 and 0.33, hashes
as ints or bytes, what no release has tolerated and reported once, broken payloads reported without
stopping the engine's reading; the capture format read back or refused at its record; the same findings
from the wire as from the JSON-lines file of the same events.  (vLLM's own encoder: test_live_vllm.py.)"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

msgspec = pytest.importorskip("msgspec", reason="the wire decoder needs msgspec: pip install 'kvpool[live]'")

from kvpool.cli.events import check_events_main  # noqa: E402
from kvpool.oracle.events.capture import CaptureWriter, Header, Source, is_capture, read_capture  # noqa: E402
from kvpool.oracle.events.check import check_events  # noqa: E402
from kvpool.oracle.events.fleet import Fleet, replay_capture  # noqa: E402
from kvpool.oracle.events.wire import Decoder, WireError, encode_batch, rank_endpoint  # noqa: E402
from kvpool.oracle.trace import TraceError  # noqa: E402


def stored(hashes: list[Any], parent: Any = None, **extra: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(2 * len(hashes))), "block_size": 2, "lora_id": None, "medium": "GPU",
            "lora_name": None, "group_idx": 0, **extra}


def removed(h: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}


def frames(seq: int, events: list[dict[str, Any]], rank: int | None = None) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), encode_batch(events, 1.0 + seq, rank)]


def test_every_field_of_033_reads_back() -> None:
    event = stored([1, 2], 7, extra_keys=[["adapter", ["img", 0]], None], kv_cache_spec_kind="full_attention",
                   kv_cache_spec_sliding_window=None, locality="LOCAL", ownership="offload",
                   session_id="s1", lora_id=3, lora_name="adapter", lookahead_token_ids=[[9], [10]])
    batch = Decoder().decode(encode_batch([event, removed(2), {"type": "AllBlocksCleared"}], 5.0, 2))
    assert batch.ts == 5.0 and batch.data_parallel_rank == 2
    assert batch.events[0] == event and batch.events[1] == {**removed(2), "locality": None, "ownership": None}
    assert batch.events[2] == {"type": "AllBlocksCleared"}


def test_older_releases_tagged_arrays_and_bytes_hashes_read_too() -> None:
    payload = msgspec.msgpack.encode([2.0, [["BlockStored", [b"\x01" * 32], None, [1, 2], 2, None, "GPU"],
                                            ["BlockRemoved", [-1], "GPU"]], None])
    batch = Decoder().decode(payload)
    assert [e["type"] for e in batch.events] == ["BlockStored", "BlockRemoved"]
    assert batch.events[0]["lora_name"] is None and batch.events[1]["group_idx"] is None
    report = Fleet([Source("x")])
    report.message(1, 2.0, 0, "pub", [b"", (0).to_bytes(8, "big"), payload])
    (engine,) = report.engines.values()
    assert engine.reading.checker.left_stored == 1  # the bytes hash: its low 64 bits, one key


def test_what_no_release_has_is_tolerated_and_reported_once() -> None:
    fleet = Fleet([Source("tcp://e:5557")])
    raw = msgspec.msgpack.decode(encode_batch([stored([1])], 1.0))
    raw[1][0]["pinned"] = True
    raw[1].append({"type": "BlockPinned", "block_hashes": [1]})
    for seq in range(3):
        fleet.message(seq + 1, 1.0, 0, "pub", [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode(raw)])
    notes = [r.finding.message.split(":")[0] for r in fleet.reports if r.finding.kind == "unknown-field"]
    assert notes == ["BlockStored.pinned", "event type BlockPinned"]
    (engine,) = fleet.engines.values()
    assert engine.counts.events == 3 and engine.decoder.unknown == notes


def test_a_broken_batch_is_reported_and_the_reading_goes_on_with_a_horizon() -> None:
    fleet = Fleet([Source("e")])
    fleet.message(1, 1.0, 0, "pub", frames(0, [stored([1])]))
    fleet.message(2, 1.0, 0, "pub", [b"", (1).to_bytes(8, "big"), b"\x93\xa1x"])  # not a batch
    fleet.message(3, 1.0, 0, "pub", [b"", b"\x02", b""])  # not vLLM's frames
    fleet.message(4, 1.0, 0, "pub", frames(2, [removed(1), removed(5)]))
    kinds = [(r.finding.kind, r.finding.position.line) for r in fleet.reports]
    assert kinds == [("undecodable", 2), ("undecodable", 3)]
    (engine,) = fleet.engines.values()
    assert engine.reading.checker.unjudged == 2  # both removals: what batch 1 held is not known


def test_a_batch_from_another_rank_is_reported_once() -> None:
    fleet = Fleet([Source("tcp://h:5558", None, 1)])
    for seq, rank in enumerate([1, 0, 0, 1]):
        fleet.message(seq + 1, 1.0, 0, "pub", frames(seq, [], rank))
    assert [r.finding.kind for r in fleet.reports] == ["dp-rank-mismatch"]


def test_data_parallel_endpoints_are_vllms() -> None:
    assert rank_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert rank_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert rank_endpoint("tcp://h:0", 2) == "tcp://h:0" and rank_endpoint("tcp://h:5557", 0) == "tcp://h:5557"
    assert rank_endpoint("inproc://kv", 2) == "inproc://kv_dp2"
    with pytest.raises(ValueError):
        rank_endpoint("ipc:///tmp/kv", 1)


def test_the_wire_and_a_json_lines_file_of_the_same_events_give_the_same_findings(tmp_path: Path) -> None:
    events = [stored([1, 2]), stored([3], 2), stored([4], 9), removed(3), removed(3), stored([5, 5]),
              stored([6], 1, medium="CPU"), removed(6)]
    lines = tmp_path / "e.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in events))
    by_line = check_events(lines)
    fleet = Fleet([Source("e")])
    for i, e in enumerate(events):  # one event a batch: the record is the line
        fleet.message(i + 1, 1.0, 0, "pub", frames(i, [e]))
    fleet.finish()
    wire = sorted((r.finding.kind, r.finding.rule, r.finding.position.line) for r in fleet.reports)
    file = sorted([("violation", v.rule, v.position.line) for v in by_line.violations]
                  + [("warning", w.rule, w.position.line) for w in by_line.warnings])
    assert wire == file and ("violation", "event_removals_name_live_keys", 5) in wire


def test_a_capture_reads_back_and_a_broken_one_is_refused_at_its_record(tmp_path: Path) -> None:
    path = tmp_path / "c.kvwire"
    writer = CaptureWriter(path, Header([Source("tcp://e:1", "tcp://e:2", 0)], "kv"))
    writer.write(["msg", 1.5, 0, "pub", frames(0, [stored([1])])])
    writer.write(["gave-up", 2.0, 0, b""])
    writer.close()
    assert is_capture(path) and not is_capture(Path(__file__))
    header, records = read_capture(path)
    assert header.sources == [Source("tcp://e:1", "tcp://e:2", 0)] and header.topic == "kv"
    assert [r[0] for _, r in records] == ["msg", "gave-up"]
    data = path.read_bytes()
    cut = tmp_path / "cut.kvwire"
    cut.write_bytes(data[:-3])
    with pytest.raises(TraceError, match=r":2: truncated"):
        replay_capture(cut)
    bad = tmp_path / "bad.kvwire"
    bad.write_bytes(data + struct.pack(">I", 3) + msgspec.msgpack.encode([1, 2]))
    with pytest.raises(TraceError, match=":3:"):
        replay_capture(bad)
    assert check_events_main([str(cut)]) == 2


@settings(settings.get_profile("readers"))
@given(st.binary(max_size=200))
def test_random_payloads_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(WireError):
        Decoder().decode(data)


@settings(settings.get_profile("readers"))
@given(st.binary(max_size=300))
def test_random_captures_never_crash(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("w") / "c.kvwire"
    path.write_bytes(struct.pack(">I", 1) + b"\x80" + data)
    try:
        replay_capture(path)
    except TraceError as exc:
        assert str(path) in str(exc)


def test_the_wait_for_a_hole_counts_from_the_last_batch_delivered() -> None:
    """The watcher gives up on a hole after --give-up seconds without progress, not after the hole
    began: a replay that fills it slowly (vLLM's ROUTER sends a long answer in parts) is waited for."""
    fleet = Fleet([Source("e", "r")])
    fleet.message(1, 0.0, 0, "pub", frames(0, []))
    assert fleet.message(2, 1.0, 0, "pub", frames(5, [])) == [(0, b"", 1)]  # a hole: 1 to 4 asked for
    fleet.message(3, 2.0, 0, "pub", frames(6, []))
    assert [since for _, _, since in fleet.waiting()] == [1.0]
    fleet.message(4, 3.0, 0, "replay", frames(1, []))  # part of the answer: progress
    assert [since for _, _, since in fleet.waiting()] == [3.0]
    for record, seq in enumerate((2, 3, 4), start=5):
        fleet.message(record, 4.0, 0, "replay", frames(seq, []))
    assert fleet.waiting() == [] and fleet.engine(0, b"").sequencer.expected == 7
