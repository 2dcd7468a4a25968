"""Request lines (``oracle/TRACE_FORMAT.md``): a request written once, then named by its number.

An engine calls the pool many times per request; a trace of a long prompt that
wrote the request whole on every call would grow with the square of its length.
The shadow's traces and ``kvpool replay --trace`` write each request once, then
what it gained, then that it is gone; ``check-trace`` reads them strictly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.oracle.trace import TraceError, check_trace
from kvpool.oracle.trace.read import iter_trace

HEADER = {"kvpool_trace": 1, "num_blocks": 6, "enable_caching": True, "hash_block_size": 2,
          "enable_kv_cache_events": False, "medium": "GPU"}
DEFINE = {"kvpool_request": 1, "request_id": "a", "all_token_ids": [7, 8, 9, 10],
          "block_hashes": ["0101", "0202"]}
GROW = {"kvpool_request": 1, "more_tokens": [11, 12], "more_hashes": ["0303"]}


def call(op: str, result: object, **args: object) -> dict[str, object]:
    return {"op": op, "args": args, "result": result, "error": None, "events": None}


def ref(tokens: int, hashes: int) -> dict[str, int]:
    return {"kvpool_request": 1, "tokens": tokens, "hashes": hashes}


def write(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in [HEADER, *lines]))
    return path


def cache(tokens: int, hashes: int, first: int, last: int) -> dict[str, object]:
    return call("cache_full_blocks", None, request=ref(tokens, hashes), block_ids=[1, 2, 3],
                num_cached_blocks=first, num_full_blocks=last, block_size=2, kv_cache_group_id=0)


def test_a_request_defined_grown_and_forgotten_checks(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [
        call("get_new_blocks", [1, 2, 3], num_blocks=3), DEFINE, cache(4, 2, 0, 2), GROW,
        cache(6, 3, 2, 3), {"kvpool_request": 1, "forget": True},
        call("get_cached_block", [3], block_hash="0303", kv_cache_group_ids=[0])])
    report = check_trace(path)
    assert report.ok and report.steps == 4, report.format()  # request lines are no calls
    _header, steps = iter_trace(path)
    named = [s.args["request"] for s in steps if "request" in s.args]
    assert named[0] is named[1] and named[1].all_token_ids == [7, 8, 9, 10, 11, 12]


@pytest.mark.parametrize(("lines", "what"), [
    ([cache(4, 2, 0, 2)], "request 1 is not defined by an earlier line"),
    ([DEFINE, {"kvpool_request": 1, "forget": True}, cache(4, 2, 0, 2)], "or was forgotten"),
    ([DEFINE, cache(6, 3, 0, 2)], "request 1 has 4 tokens and 2 hashes, not 6 and 3"),
    ([DEFINE, {"kvpool_request": 1, "more_tokens": [1], "more_hashes": ["0g"]}], "more_hashes[0]"),
    ([DEFINE, {"kvpool_request": 1, "forget": 1}], "forget: expected true"),
    ([{**DEFINE, "kvpool_request": "1"}], "expected an integer"),
])
def test_a_bad_request_line_is_named(tmp_path: Path, lines: list[dict[str, object]], what: str) -> None:
    path = write(tmp_path / "bad.jsonl", [call("get_new_blocks", [1, 2, 3], num_blocks=3), *lines])
    with pytest.raises(TraceError) as raised:
        check_trace(path)
    assert what in str(raised.value) and f"{path}:" in str(raised.value)
