"""kvpool.impl against the model, call by call, on a realistic random workload.

Every call's result or error type, the whole observable state, pending
events and watcher firings are compared, and every model invariant is
checked after every call.
"""

from __future__ import annotations

import io

import pytest

from kvpool.bugs.pools import AllocKeepsOldHash, FreeHashedToHead
from kvpool.impl import BlockPool
from kvpool.oracle.core.lockstep import Divergence
from kvpool.oracle.search.campaign import run_campaign, run_one


@pytest.mark.parametrize("seed", range(12))
def test_impl_agrees_with_model(seed: int) -> None:
    pair = run_one(BlockPool, seed, 1500)
    assert pair.steps >= 1500


@pytest.mark.parametrize("broken", [FreeHashedToHead, AllocKeepsOldHash])
def test_lockstep_catches_a_seeded_bug(broken: type[BlockPool]) -> None:
    out = io.StringIO()
    assert run_campaign(broken, steps=1500, runs=6, seed=0, out=out) == 1
    assert "DIVERGED" in out.getvalue()


def test_divergence_names_the_step() -> None:
    with pytest.raises(Divergence, match=r"step \d+: "):
        for seed in range(6):
            run_one(AllocKeepsOldHash, seed, 1500)
