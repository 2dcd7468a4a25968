"""Feature-interaction coverage: every legal pair of call features meets in one call, in each phase.

Branch coverage of the model says which branches a phase reached, not
whether features met in one call.  :mod:`kvpool.oracle.generate.features` names the
shape features of a call and the legal pairs; :mod:`kvpool.oracle.generate.directed`
makes the pairs a run missed.  At ``kvpool conform``'s defaults (4 runs of
1,000 steps; 200 state-machine examples, seed 0), each phase makes every
legal pair, misuse on and off; the plain workload alone does not.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.impl import BlockPool
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import MultiModalFeature, PlaceholderRange, Request
from kvpool.model import initial_state
from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.generate.directed import SCENARIOS, Directed
from kvpool.oracle.generate.features import (
    FEATURES,
    IMPOSSIBLE,
    FeatureLog,
    call_features,
    legal_pairs,
    pair_coverage,
)
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.search.conform import Options, run_campaign_phase, run_machine_phase


@pytest.mark.parametrize("misuse", [False, True], ids=["no-misuse", "misuse"])
@pytest.mark.parametrize("phase", [run_campaign_phase, run_machine_phase], ids=["campaign", "machine"])
def test_each_phase_makes_every_legal_pair_meet(phase: Any, misuse: bool) -> None:
    result = phase(kvpool_adapter(), Options(misuse=misuse))
    assert result.ok and result.features is not None
    met = pair_coverage(result.features, result.name, misuse)
    assert met.legal == len(legal_pairs()) == 216 and len(FEATURES) == 31  # docs/oracle.md
    assert not met.missed, met.missed
    assert not [p for p in IMPOSSIBLE if tuple(sorted(p)) in result.features.pairs]  # never made


def test_the_plain_workload_alone_misses_pairs_the_directed_calls_make() -> None:
    log = FeatureLog()
    for run in range(4):
        run_one(kvpool_adapter().factory(), run, 1000, misuse=False, features=log)
    plain = pair_coverage(log, "campaign", False)
    assert plain.missed  # what the directed calls are for
    directed = FeatureLog()
    Directed(kvpool_adapter().factory()).cover(plain.missed, directed)
    assert set(plain.missed) <= directed.pairs


def test_every_impossible_pair_shares_an_operation_and_every_scenario_is_legal() -> None:
    for pair, why in IMPOSSIBLE.items():
        a, b = sorted(pair)
        assert FEATURES[a][1] & FEATURES[b][1] and why
    legal = set(legal_pairs())
    for op, wanted in SCENARIOS:
        assert all(op in FEATURES[f][1] for f in wanted)
        assert all(tuple(sorted((a, b))) in legal for a in wanted for b in wanted if a < b)


def test_a_partial_entry_over_an_item_that_is_not_the_last() -> None:
    """The issue's shape: a partial entry whose chunk overlaps a multimodal item that is not the
    request's last one, with events on."""
    s = initial_state(8, True, 2, True)
    items = [MultiModalFeature("a", PlaceholderRange(5, 2)), MultiModalFeature("b", PlaceholderRange(9, 1))]
    req = Request("r", list(range(12)), block_hasher=get_request_block_hasher(2), mm_features=items)
    got = call_features(s, "cache_partial_block", (req, 1, 6, 1, 4, False))
    assert got == {"partial", "mm", "mm_several", "mm_spans_chunk", "events", "group1", "big_block"}
    assert call_features(s, "cache_partial_block", (req, 0, 6, 0, 4, False)) == {
        "null_block", "mm", "mm_several", "mm_spans_chunk", "events", "big_block"}
    assert call_features(s, "free_blocks", ([3, 0, 3],), metrics=True) == {
        "listed_twice", "null_block", "events", "metrics"}


class DropsItemKeysOfPartialEntries(BlockPool):
    """A partial entry's ``BlockStored`` loses its extra keys when its chunk overlaps a multimodal
    item that is not the request's last one (the pair ``partial`` + ``mm_several``, events on)."""

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int, *args: Any, **kw: Any) -> Any:
        queued = len(self.kv_event_queue)
        key = super().cache_partial_block(request, block, num_tokens, *args, **kw)
        hbs = self.hash_block_size
        items = [(f.mm_position.offset, f.mm_position.offset + f.mm_position.length)
                 for f in request.mm_features]
        if len(self.kv_event_queue) > queued and any(
                a < num_tokens and b > num_tokens - hbs for a, b in items[:-1]):
            self.kv_event_queue[-1].extra_keys = None
        return key


def test_a_bug_where_two_features_meet_is_caught_by_both_phases() -> None:
    adapter = kvpool_adapter(DropsItemKeysOfPartialEntries)
    campaign = run_campaign_phase(adapter, Options())
    assert not campaign.ok and campaign.failure is not None
    assert "extra_keys" in campaign.failure.details
    machine = run_machine_phase(adapter, Options())
    assert not machine.ok and machine.failure is not None and len(machine.failure.trace) <= 15
