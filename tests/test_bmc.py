"""Bounded model checking of the executable model (kvpool.proofs.bmc), and its seeded bugs."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pytest

from kvpool.model import ACTIONS, INVARIANTS
from kvpool.proofs import bmc

SMALL = bmc.Config(blocks=4)


@functools.cache
def _found(bug: str) -> bmc.Outcome:
    return bmc.explore(SMALL, depth=6, seconds=60, actions=bmc.with_bug(bug))


def test_model_passes_bmc_to_depth_two() -> None:
    start = time.perf_counter()
    out = bmc.explore(SMALL, depth=2, seconds=60)
    assert out.ok, bmc.format_trace(out, SMALL)
    assert out.complete and out.depth == 2 and out.states > 1000
    assert time.perf_counter() - start < 30


def test_model_passes_bmc_with_two_token_hash_chunks() -> None:
    cfg = bmc.Config(blocks=3, hash_block_size=2)
    out = bmc.explore(cfg, depth=2, seconds=60)
    assert out.ok and out.complete, bmc.format_trace(out, cfg)


def test_every_action_is_explored() -> None:
    """The argument domains reach every model action with an accepted call."""
    s0 = SMALL.initial()
    s1, _ = ACTIONS["get_new_blocks"](s0, 2)
    s2, _ = ACTIONS["cache_full_blocks"](s1, SMALL.requests()[0], [1, 2], 0, 2, 1, 0)
    taken = set()
    for s in (s0, s1, s2):
        for name, args in bmc.calls(s, SMALL, SMALL.requests()):
            if bmc._apply(ACTIONS, s, (name, args)) is not None:
                taken.add(name)
    assert taken == set(ACTIONS)


def test_budget_stops_the_search() -> None:
    out = bmc.explore(SMALL, depth=50, seconds=0.5)
    assert not out.complete and out.ok and out.depth < 50


@pytest.mark.parametrize("bug", list(bmc.BUGS))
def test_seeded_bug_is_found_with_a_short_trace(bug: str) -> None:
    out = _found(bug)
    assert out.violation, f"{bug} not found to depth {out.depth}"
    assert 1 <= len(out.trace) <= 6
    assert out.trace[-1].action == bmc.BUGS[bug][0] or any(
        st.action == bmc.BUGS[bug][0] for st in out.trace)


def test_seeded_bugs_break_invariants_and_event_properties() -> None:
    broken = {name for bug in bmc.BUGS for name in _found(bug).violation}
    assert "refused_call_changes_nothing" in broken
    assert any(name.startswith("event_") for name in broken)
    assert len(broken & set(INVARIANTS)) >= 5


def test_trace_is_readable() -> None:
    text = bmc.format_trace(_found("free_same_block_twice"), SMALL)
    assert "get_new_blocks(num_blocks=1)" in text
    assert "free_blocks(block_ids=[1, 1])" in text
    assert "ref 1: 1->-1" in text and "free queue" in text
    assert "ref_counts_non_negative" in text
    text = bmc.format_trace(_found("partial_kept_after_promotion"), SMALL)
    assert "cache_partial_block(" in text and "index r0[:" in text and "events BlockStored" in text


def test_refused_call_that_changes_state_is_reported() -> None:
    out = _found("counter_before_check")
    assert out.violation == ["refused_call_changes_nothing"]
    assert out.trace[-1].error == "NotEnoughFreeBlocksError"


def test_main_exit_codes_and_json(tmp_path: Any, capsys: Any) -> None:
    out = tmp_path / "bmc.json"
    assert bmc.main(["--depth", "1", "--blocks", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["depth"] == 1 and doc["states"] > 1
    assert "depth 1 fully explored" in capsys.readouterr().out
    assert bmc.main(["--depth", "3", "--blocks", "3", "--bug", "touch_leaves_block_free"]) == 1
    assert "VIOLATION" in capsys.readouterr().out


def test_event_properties_can_fail() -> None:
    """Finding, pinned: cache_full_blocks listing one block twice (outside the explored
    contract) emits BlockRemoved for a key before the BlockStored that announces it."""
    from dataclasses import replace

    r = SMALL.requests()[0]
    s1, _ = ACTIONS["get_new_blocks"](SMALL.initial(), 1)
    s2, _ = ACTIONS["cache_full_blocks"](s1, r, [1, 1], 0, 2, 1, 0)
    assert bmc.event_violations(s1, s2, "cache_full_blocks") == ["event_removed_key_not_live"]
    stray = replace(s1, fired=((bmc.watcher_a, 1),))
    assert bmc.event_violations(s1, stray, "touch") == ["fired_watchers_were_registered"]
