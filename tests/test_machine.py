"""The Hypothesis state machine: green against kvpool.impl, thorough, readable when red.

Runs under the active Hypothesis profile (``ci`` by default: derandomized);
the budgets below are sized so that this file takes well under 30 s there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvpool.bugs.pools import TouchLeavesBlockFree
from kvpool.impl import BlockPool
from kvpool.impl.errors import BlockPoolError, NotEnoughFreeBlocksError
from kvpool.model import ACTIONS, QUERIES
from kvpool.oracle.core.abstraction import same_refusal
from kvpool.oracle.core.adapter import ClassAdapter, kvpool_adapter
from kvpool.oracle.search.machine import MachineFailure, machine_for

GREEN = settings(max_examples=300, stateful_step_count=30, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def test_machine_agrees_with_kvpool_impl() -> None:
    run_state_machine_as_test(machine_for(kvpool_adapter()), settings=GREEN)


def test_machine_for_binds_adapter_misuse_and_reference() -> None:
    adapter = kvpool_adapter()
    machine = machine_for(adapter, reference="0.33")
    assert machine.ADAPTER is adapter and machine.MISUSE and machine.REFERENCE == "0.33"
    assert not machine_for(adapter, misuse=False).MISUSE
    vllm_like = ClassAdapter(BlockPool, "vllm-like", supports_misuse=False)
    assert not machine_for(vllm_like, misuse=True).MISUSE  # never forced on


def _counting_pool(calls: Counter[str], refused: Counter[str]) -> type[BlockPool]:
    """kvpool.impl's pool, recording which operations ran and which were refused."""

    class Counting(BlockPool):
        def __getattribute__(self, name: str) -> Any:
            attr = super().__getattribute__(name)
            if name not in ACTIONS and name not in QUERIES:
                return attr

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                try:
                    return attr(*args, **kwargs)
                except Exception as exc:
                    refused[type(exc).__name__] += 1
                    raise

            return counted

    return Counting


def test_rules_reach_every_operation_of_the_model() -> None:
    """One source of truth: an operation of the model without a rule fails here."""
    calls: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    machine = machine_for(kvpool_adapter(_counting_pool(calls, refused)))
    run_state_machine_as_test(machine, settings=settings(GREEN, max_examples=150))
    assert set(ACTIONS) | set(QUERIES) <= set(calls), sorted(set(ACTIONS) - set(calls))
    assert calls["cache_partial_block"] and calls["move_block_hashes"]
    assert len(refused) > 2, refused  # misuse rules ran and were refused with typed errors


def test_without_misuse_only_running_dry_is_refused() -> None:
    """With misuse off (as for vLLM's pool) every call is legal, except asking for too much."""
    calls: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    pool = _counting_pool(calls, refused)
    machine = machine_for(ClassAdapter(pool, "counting", supports_misuse=False,
                                       matcher=same_refusal))
    assert not machine.MISUSE
    run_state_machine_as_test(machine, settings=settings(GREEN, max_examples=150))
    assert set(refused) <= {NotEnoughFreeBlocksError.__name__}, refused



def _shrunk_failure(pool_class: type[BlockPool], examples: int) -> MachineFailure:
    """Run the machine against a broken pool until it fails; the shrunk failure."""
    config = settings(GREEN, max_examples=examples, stateful_step_count=15, database=None,
                      report_multiple_bugs=False,
                      phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(machine_for(kvpool_adapter(pool_class)), settings=config)
    return MachineFailure.from_exception(caught.value)


def test_failure_is_shrunk_to_a_short_readable_trace() -> None:
    failure = _shrunk_failure(TouchLeavesBlockFree, examples=500)
    assert 2 <= len(failure.steps) <= 15, failure.steps
    assert failure.steps[0].startswith("state.setup(cfg=RunConfig(")
    # a scenario rule: a request admitted, or a directed call named by its operation
    assert any(f"state.{rule}(" in s for s in failure.steps
               for rule in ("admit", "served", "fork", "directed"))
    assert not any(" at 0x" in s for s in failure.steps), failure.steps  # no opaque reprs
    # The broken touch also skips the metrics collector: with one attached, that shows first.
    assert "touch(" in failure.message
    assert "observation: free" in failure.message or "metrics collector" in failure.message


def test_blocks_of_a_second_pool_are_freed_through_the_first() -> None:
    """The second-pool rules run: foreign blocks alone, mixed with own ones, and misused."""
    seen: Counter[str] = Counter()

    class Watching(BlockPool):
        def free_blocks(self, ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            foreign = [b for b in blocks if b.pool is not self]
            if foreign:
                seen["foreign only" if len(foreign) == len(blocks) else "mixed"] += 1
            try:
                super().free_blocks(blocks)
            except BlockPoolError:
                seen["refused free"] += 1 if foreign else 0
                raise

        def touch(self, blocks: Any) -> None:
            try:
                super().touch(blocks)
            except BlockPoolError:
                seen["refused touch"] += any(b.pool is not self for b in blocks)
                raise

    run_state_machine_as_test(machine_for(kvpool_adapter(Watching)),
                              settings=settings(GREEN, max_examples=400))
    assert seen["foreign only"] and seen["mixed"], seen
    assert seen["refused free"] and seen["refused touch"], seen


class _KeepsForeignBlocks(BlockPool):
    """Seeded bug: blocks of another pool are freed into this pool's queue (ids alike)."""

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        for block in blocks:
            if block.pool is not self and block.pool is not None:
                block._holder = self
        super().free_blocks(blocks)


def test_second_pool_bug_is_caught_and_shrunk() -> None:
    failure = _shrunk_failure(_KeepsForeignBlocks, examples=300)
    assert any("allocate_other(" in s for s in failure.steps), failure.steps
    assert len(failure.steps) <= 6, failure.steps
    assert "free_blocks" in failure.message and "second:" in failure.message, failure.message


CAMPAIGN_ONLY = ["MoveOntoNull", "InsertOverwritesPrimary", "CacheWithoutCaching"]
"""Seeded bugs the campaign found at its defaults and the state machine, before it had a rule
for every kind of campaign step and directed calls, missed in its default 200 examples."""


@pytest.mark.parametrize("bug", CAMPAIGN_ONLY)
def test_the_machine_finds_what_only_the_campaign_found(bug: str) -> None:
    from kvpool.bugs import pools
    from kvpool.oracle.search.conform import Options, run_campaign_phase, run_machine_phase

    adapter = kvpool_adapter(getattr(pools, bug))
    assert not run_campaign_phase(adapter, Options(shrink=False)).ok
    machine = run_machine_phase(adapter, Options())  # the defaults: 200 examples, seed 0
    assert not machine.ok and machine.failure is not None
    assert 2 <= len(machine.failure.trace) <= 15, machine.failure.trace


def test_every_kind_of_campaign_step_is_a_rule_of_the_machine() -> None:
    """``workload_step`` plays each of the campaign's steps by name, misuse included, and agrees."""
    from kvpool.oracle.generate.runs import RunConfig
    from kvpool.oracle.generate.workload import Workload

    machine = machine_for(kvpool_adapter())()
    machine.setup(RunConfig(num_blocks=12, caching=True, hash_block_size=2, block_sizes={0: 4, 1: 2},
                            events=True, extra_keys=True, metrics=True))
    kinds = [name for name, _weight in Workload.STEPS]
    assert "misuse" in kinds and "other_pool" in kinds
    for dice in range(6):
        for kind in kinds:
            machine.workload_step("admit", dice)  # requests in flight for the step to work on
            machine.workload_step(kind, dice)
    pair = machine.lock
    pair.check()
    assert {"cache_partial_block", "move_block_hashes", "unpin_blocks"} <= set(pair.ops_seen)
    assert pair.refusals_seen  # the misuse steps ran
