"""kvpool.impl against the model, call by call, on a realistic random workload.

Every call's result or error type, the whole observable state, pending
events and watcher firings are compared, and every model invariant is
checked after every call.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from kvpool.impl import BlockPool
from kvpool.oracle.campaign import run_campaign, run_one
from kvpool.oracle.lockstep import Divergence


@pytest.mark.parametrize("seed", range(12))
def test_impl_agrees_with_model(seed: int) -> None:
    pair = run_one(BlockPool, seed, 1500)
    assert pair.steps >= 1500


class _FreesHashedBlocksAtHead(BlockPool):
    """A seeded bug: cached blocks rejoin the queue at the head, not the tail."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        enable = self.enable_caching
        self.enable_caching = False
        try:
            super().free_blocks(ordered_blocks)
        finally:
            self.enable_caching = enable


class _ForgetsLazyEviction(BlockPool):
    """A seeded bug: reallocated blocks keep their old hash."""

    def get_new_blocks(self, num_blocks: int) -> Any:
        enable = self.enable_caching
        self.enable_caching = False
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            self.enable_caching = enable


@pytest.mark.parametrize("broken", [_FreesHashedBlocksAtHead, _ForgetsLazyEviction])
def test_lockstep_catches_a_seeded_bug(broken: type[BlockPool]) -> None:
    out = io.StringIO()
    assert run_campaign(broken, steps=1500, runs=6, seed=0, out=out) == 1
    assert "DIVERGED" in out.getvalue()


def test_divergence_names_the_step() -> None:
    with pytest.raises(Divergence, match=r"step \d+: "):
        for seed in range(6):
            run_one(_ForgetsLazyEviction, seed, 1500)
