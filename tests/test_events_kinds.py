"""Every kind a bare stream can show is named at its line: the streams a fleet publishes that no rule
forbids but a router must guess at (several media, mixed group fields, block sizes, per-hash fields),
the rules they break, and what the checker can no longer judge after it lost batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli.events import check_events_main
from kvpool.oracle.events.check import check_event_list
from kvpool.oracle.events.kinds import TRANSPORT, VIOLATIONS, WARNINGS, Position
from kvpool.oracle.events.online import StreamChecker
from kvpool.oracle.events.reading import Finding, Reading
from kvpool.oracle.events.routers import PROFILES, profile_factory


def stored(hashes: list[int], parent: int | None = None, group: int | None = 0, size: int = 2,
           tokens: int | None = None, medium: str | None = "GPU", **extra: Any) -> dict[str, Any]:
    n = size * len(hashes) if tokens is None else tokens
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": list(range(n)), "block_size": size, "lora_id": None, "medium": medium,
             "lora_name": None, **extra}
    if group is not None:
        event["group_idx"] = group
    return event


def removed(h: int, group: int | None = 0, medium: str | None = "GPU") -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": [h], "medium": medium}
    if group is not None:
        event["group_idx"] = group
    return event


CLEARED = {"type": "AllBlocksCleared"}


def findings(events: list[dict[str, Any]], sizes: dict[int, int] | None = None) -> list[tuple[str, int]]:
    report = check_event_list(events, block_sizes=sizes)
    return sorted([(v.rule, v.position.line) for v in report.violations]
                  + [(w.rule, w.position.line) for w in report.warnings], key=lambda x: (x[1], x[0]))


CASES: dict[str, tuple[list[dict[str, Any]], dict[int, int] | None, list[tuple[str, int]]]] = {
    # the bare-stream cases
    "one-hash orphan, no sizes": ([stored([5], parent=4)], None, [("parent-unannounced", 1)]),
    "one-hash orphan, sizes say full": ([stored([5], parent=4)], {0: 2}, [("parent-unknown", 1)]),
    "one-hash orphan, sizes say partial": ([stored([5], parent=4)], {0: 4}, [("partial-entry", 1)]),
    "hash repeated in a store": ([stored([5, 6, 5])], None, [("hash-repeated", 1), ("stored-again", 1)]),
    "store naming itself as parent": ([stored([5], parent=5)], None,
                                      [("hash-repeated", 1), ("parent-unannounced", 1)]),
    "store without group_idx, removal with": ([stored([1], group=None), removed(1)], None,
                                              [("group-missing", 2)]),
    "store with group_idx, removal without": ([stored([1]), removed(1, group=None)], None,
                                              [("group-missing", 2)]),
    "stored on CPU, removed on GPU": ([stored([1], medium="CPU"), removed(1, medium="GPU")], None,
                                      [("medium-mismatch", 2)]),
    "chain moving from CPU to GPU": ([stored([1], medium="CPU"), stored([2], parent=1)], None,
                                     [("medium-change", 2)]),
    "full size changing mid-stream": ([stored([1, 2], size=2), stored([3, 4], parent=2, size=4)], None,
                                      [("block-size-change", 2)]),
    "declared size contradicted": ([stored([1, 2], size=4)], {0: 2}, [("block-size-change", 1)]),
    "a third size": ([stored([1, 2], size=4), stored([3], parent=2, size=2), stored([4], parent=3, size=1)],
                     None, [("partial-entry", 2), ("block-size-change", 3), ("partial-entry", 3)]),
    # what else a fleet's stream does
    "one key in two tiers": ([stored([1]), stored([1], medium="CPU")], None, [("medium-copy", 2)]),
    "a clear with two tiers held": ([stored([1]), stored([2], medium="CPU"), CLEARED], None,
                                    [("clear-names-no-medium", 3)]),
    "a clear with one tier held": ([stored([1]), stored([2]), CLEARED], None, []),
    "a clear mid-chain": ([stored([1]), CLEARED, stored([2], parent=1)], {0: 2}, [("parent-unknown", 3)]),
    "extra_keys not per hash": ([stored([1, 2], extra_keys=[None])], None, [("extra-keys-not-per-hash", 1)]),
    "0.33 lookahead not per hash": ([stored([1, 2], lookahead_token_ids=[[7]])], None,
                                    [("lookahead-not-per-hash", 1)]),
    "0.33 lookahead per hash": ([stored([1, 2], lookahead_token_ids=[[7], [8]])], None, []),
    "a parent after skipped blocks": ([stored([1, 2], tokens=6), stored([4], parent=3)], {0: 2},
                                      [("tokens-not-filling", 1), ("parent-unannounced", 2)]),
    "a partial entry whose parent is a full block": ([stored([1, 2], size=4), stored([3], parent=2, size=2)],
                                                     None, [("partial-entry", 2)]),
    "a partial entry ending at a block edge, then its child": (
        [stored([1], size=4), stored([2], parent=1, size=2), stored([3], parent=2, size=4)], None,
        [("partial-entry", 2)]),
    "a removed parent in another medium": ([stored([1], medium="CPU"), removed(1, medium="CPU"),
                                            stored([2], parent=1)], None,
                                           [("medium-change", 3), ("parent-removed", 3)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_kind_is_named_at_its_line(case: str) -> None:
    events, sizes, expected = CASES[case]
    assert findings(events, sizes) == sorted(expected, key=lambda x: (x[1], x[0]))


def test_every_named_kind_has_a_case_and_a_description() -> None:
    named = {rule for events, sizes, _ in CASES.values() for rule, _ in findings(events, sizes)}
    assert named <= set(VIOLATIONS) | set(WARNINGS)
    trace_only = {"reannounced-hit", "second-copy", "event_announcements_match_index"}
    others = {"stored-again", "parent-removed", "empty-store", "tokens-not-filling", "hash-in-two-groups",
              "lora-change", "event_removals_name_live_keys"}  # tests/test_events_check.py, test_routers.py
    assert set(VIOLATIONS) | set(WARNINGS) <= named | trace_only | others
    assert not set(TRANSPORT) & (set(WARNINGS) | set(VIOLATIONS))


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_fails_on_every_case_that_names_something(tmp_path: Path, case: str) -> None:
    events, sizes, expected = CASES[case]
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    args = [str(path), "--strict"] + (["--block-sizes", ",".join(f"{g}={n}" for g, n in sizes.items())]
                                      if sizes else [])
    assert check_events_main(args) == (1 if expected else 0)


@pytest.mark.parametrize("name", PROFILES)
def test_an_event_without_a_group_is_group_0_to_the_checker_and_every_profile(name: str) -> None:
    """The store says no group, its removal group 0: one key, to everyone (and a warning says so)."""
    reading = Reading("s", {0: 2}, [profile_factory(name)])
    for i, e in enumerate([stored([1], group=None), removed(1)], start=1):
        reading.feed(e, Position(i))
    (router,) = reading.reports()
    assert not reading.checker.violations and not router.reactions
    assert [w.rule for w in reading.checker.warnings] == ["group-missing"]


def test_a_bare_stream_of_model_sizes_learns_the_full_size_online() -> None:
    """A one-hash store waits until the group's full size is known, then is a partial entry; the
    checker decides it later, at its own position."""
    out: list[Finding] = []
    reading = Reading("s", sink=out.append)
    reading.feed(stored([7], parent=6, size=1), Position(1))
    assert out == []
    reading.feed(stored([1, 2], size=4), Position(2))
    assert [(f.rule, f.position.line) for f in out] == [("partial-entry", 1)]


def test_after_a_lost_gap_what_was_stored_before_is_not_judged() -> None:
    checker = StreamChecker({0: 2})
    checker.feed(stored([1]), Position(1))
    checker.restart(Position(2), known_empty=False)
    assert checker.feed(removed(1), Position(2))  # stored before the horizon: blind, not judged
    assert checker.feed(stored([3], parent=1), Position(3))
    assert not checker.violations and checker.unjudged == 2
    checker.feed(stored([4]), Position(4))
    checker.feed(removed(4), Position(5))
    checker.feed(removed(4), Position(6))  # a copy of 4 may have been stored before the horizon too
    checker.feed(stored([5, 6], parent=3), Position(7))  # 3 stored after the horizon: judged, known
    checker.feed(stored([8, 9], parent=7), Position(8))  # 7 neither: not judged
    assert not checker.violations and checker.unjudged == 4
    checker.feed(CLEARED, Position(9))  # a clear: the index is known again, empty
    checker.feed(removed(1), Position(10))
    checker.feed(stored([11, 12], parent=7), Position(11))
    assert [v.position.line for v in checker.violations] == [10, 11]


def test_a_new_engine_read_from_its_first_batch_is_judged_at_once() -> None:
    checker = StreamChecker({0: 2})
    checker.feed(stored([1]), Position(1))
    checker.restart(Position(2), known_empty=True)
    assert not checker.feed(removed(1), Position(2))
    assert [v.position.line for v in checker.violations] == [2]


def test_a_router_reaction_to_what_the_reading_cannot_see_is_counted_not_reported() -> None:
    out: list[Finding] = []
    reading = Reading("s", {0: 2}, [profile_factory("dynamo")], sink=out.append)
    reading.feed(stored([1]), Position(1))
    reading.restart(Position(2), known_empty=False)
    reading.feed(stored([2], parent=1), Position(2))  # dynamo's restarted tree lacks 1: not judged
    reading.feed(stored([3], parent=9), Position(3))  # after the horizon too: 9 unknown to anyone
    assert [f.kind for f in out] == []  # neither is judged: 9 may have been stored before the gap
    assert reading.routers[0].unjudged == 2 and reading.checker.unjudged == 2
