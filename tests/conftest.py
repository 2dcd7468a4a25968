"""Hypothesis profiles: ``ci`` (default, quick), ``dev``, ``deep`` and ``crosshair``.

Pick one with ``HYPOTHESIS_PROFILE=dev pytest``.  ``crosshair`` (registered only
when ``hypothesis-crosshair`` is installed) draws examples by symbolic execution
instead of at random, so branches random inputs rarely reach get solved for.
``KVPOOL_EXAMPLE_DB`` names the example database: a directory, or
``redis://HOST:PORT/N`` shared between machines so a failure found on one replays
first on all (``kvpool.oracle.search.database``).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from kvpool.oracle.search.database import example_database, from_env

# Tests are no package: the helpers shared by several test files (impl_helpers.py) are
# imported by name from this folder, their asserts rewritten as a test module's are (so they
# report what they compared and still run under python -O).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest.register_assert_rewrite("impl_helpers")
# vLLM (where installed) picks its platform once, at import: CPU here, before any test imports it.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_db = from_env()
_common = {"database": example_database(_db)} if _db else {}

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
settings.register_profile("dev", max_examples=300, deadline=None, **_common)
settings.register_profile("deep", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
if importlib.util.find_spec("hypothesis_crosshair_provider") is not None:
    # Solver-driven paths are slow and vary in length: no deadline, fewer examples.
    settings.register_profile("crosshair", backend="crosshair", max_examples=40, deadline=None,
                              suppress_health_check=list(HealthCheck), **_common)
_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(_profile)

# The readers' fuzz tests (tests/test_trace.py, tests/test_events_check.py) keep a
# per-example deadline, so a pathologically slow parse fails there, under the active
# profile's other settings: ``@settings(settings.get_profile("readers"))``.  A deadline
# is wall clock: in ``ci`` (the default run, on a loaded machine) it is a safety net
# against a hang or an exponential blow-up only, 30 s where the slowest example takes
# about 80 ms with both cores busy; ``dev`` and ``deep`` (run by hand) keep the tight 3 s
# probe.  Where examples are solver-driven (crosshair) an example's time says nothing
# about the reader.
READER_DEADLINE_MS = {"ci": 30_000, "dev": 3000, "deep": 3000, "crosshair": None}
_base = settings.get_profile(_profile)
settings.register_profile(
    "readers", _base,
    deadline=READER_DEADLINE_MS.get(_profile, 3000 if _base.backend == "hypothesis" else None))


# Cases of parametrized tests left out of the default run, as a whole test marked ``slow`` where it
# is defined is: each is a further case of a check whose cheapest case runs by default, or a search
# kvpool verify's CI stage makes. Seconds measured on the 2-core machine (pytest --durations).
SLOW_CASES = {
    "test_crosshair.py::test_the_real_contracts_catch_a_seeded_pool_bug[free_cached_to_head]": 30,
    "test_crosshair.py::test_the_real_contracts_catch_a_seeded_pool_bug[touch_keeps_partial_effect]": 24,
    "test_coverage.py::test_vllm_033_reaches_the_null_block_branches[machine]": 107,
    "test_shard.py::test_merged_shards_have_the_verdict_and_totals_of_one_run[3]": 100,
    "test_shard.py::test_bmc_parts_count_each_state_once[3]": 27,
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace[reset-forgets-watchers]": 61,
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace[promote-keeps-partial]": 28,
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace[mask-ignored]": 10,
    "test_drive.py::test_a_misbehaving_process_gets_a_verdict_and_leaves_nothing_behind"
    "[linger-extra9-the pool process did not end cleanly: did not exit within 10s]": 48,
    "test_oracle_black_box.py::test_each_planted_bug_is_caught[QueuesPerListing]": 59,
    "test_oracle_black_box.py::test_each_planted_bug_is_caught[EvictKeepsSecondaryKeys]": 35,
    "test_example_db.py::test_a_failure_one_shard_finds_is_replayed_first_by_another[redis]": 40,
    "test_refinement.py::test_every_seeded_pool_bug_is_caught_by_exhaustive_exploration"
    "[evict_keeps_secondaries]": 48,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[FreeSameBlockTwice]": 36,
    "test_agreement.py::test_the_encoding_agrees_with_the_model_on_every_state_and_call_to_depth_2[hbs1]": 31,
    "test_shard.py::test_merged_shards_have_the_verdict_and_totals_of_one_run[2]": 66,
    "test_agreement.py::test_every_step_property_and_the_queue_agree_both_ways": 45,
    "test_oracle_black_box.py::test_an_independent_pool_conforms_observed_as_a_black_box": 31,
    "test_proofs.py::test_steps_agree_with_model_on_random_reachable_states": 29,
    "test_shard.py::test_bmc_parts_count_each_state_once[2]": 27,
    "test_machine.py::test_blocks_of_a_second_pool_are_freed_through_the_first": 25,
    "test_oracle_black_box.py::test_each_planted_bug_is_caught[TouchLeavesQueued]": 24,
    "test_workload_shapes.py::test_vllm_033_partial_entries_end_at_block_ends_too[machine]": 23,
    "test_workload_shapes.py::test_every_shape_occurs[machine-misuse]": 21,
    "test_workload_shapes.py::test_every_shape_occurs[machine-no-misuse]": 20,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[PartialKeptAfterPromotion]": 20,
    "test_third_party_pool.py::test_both_phases_find_the_interaction_bugs_with_short_traces"
    "[PromotionKeepsPartialKeys]": 19,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[ResetWhileInUse]": 17,
    "test_refinement.py::test_every_seeded_pool_bug_is_caught_by_exhaustive_exploration"
    "[reuse_notice_names_position]": 15,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[FreeWithoutRefcountCheck]": 14,
    "test_agreement.py::test_the_phase_fails_with_a_readable_counterexample": 14,
    "test_features.py::test_each_phase_makes_every_legal_pair_meet[machine-misuse]": 14,
    "test_refinement.py::test_pools_that_cannot_be_pickled_are_copied_or_replayed[Unpicklable-deepcopy]": 12,
    "test_machine.py::test_the_machine_finds_what_only_the_campaign_found[InsertOverwritesPrimary]": 12,
    "test_oracle_black_box.py::test_traceback_shows_where_the_pool_raised": 12,
    "test_agreement.py::test_the_compiled_terms_agree_with_z3_on_a_sample[hbs1]": 12,
    "test_machine.py::test_without_misuse_only_running_dry_is_refused": 11,
    "test_agreement.py::test_the_domain_covers_every_key_and_content_of_the_bmc": 11,
    "test_agreement.py::test_a_pool_with_events_off_agrees_too": 10,
    "test_machine.py::test_rules_reach_every_operation_of_the_model": 10,
    "test_refinement.py::test_misuse_is_reached_and_refused_alike": 9,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[TouchLeavesBlockFree]": 9,
    "test_bmc.py::test_seeded_bug_is_found_with_a_short_trace[reuse_notice_names_position]": 9,
    # measured in a clean clone's non-editable install (.ci/run's tests stage)
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[NullBlockHashed]": 60,
    "test_machine.py::test_the_machine_finds_what_only_the_campaign_found[CacheWithoutCaching]": 39,
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace[cached-to-head]": 28,
    "test_conform.py::test_seeded_bug_is_caught_with_a_short_trace[RefusedFreeKeepsPartialEffect]": 16,
    "test_features.py::test_each_phase_makes_every_legal_pair_meet[machine-no-misuse]": 15,
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace[mm-absolute-offset]": 14,
    "test_bmc.py::test_seeded_bug_is_found_with_a_short_trace[evict_spares_blocks_in_use]": 13,
    "test_bmc.py::test_seeded_bug_is_found_with_a_short_trace[free_hashed_to_head]": 12,
    "test_example_db.py::test_a_failure_one_shard_finds_is_replayed_first_by_another[directory]": 70,
    "test_agreement.py::test_the_encoding_agrees_with_the_model_on_every_state_and_call_to_depth_2[hbs2]": 24,
    "test_refinement.py::test_pools_that_cannot_be_pickled_are_copied_or_replayed[Uncopyable-replay]": 23,
    "test_drive.py::test_a_misbehaving_process_gets_a_verdict_and_leaves_nothing_behind"
    "[spawn-extra8-the pool process hung at call 7]": 13,
}


# Checks run once per seeded bug (or per pool shape) whose every case kvpool verify's CI stage
# also makes (the seeded-bugs, refinement and BMC phases): the default run keeps the first cases
# in collection order, as many as given; the others are slow. Seconds: all the cases, measured
# as above with both cores busy.
SAMPLED = {
    "test_proofs.py::test_seeded_bug_is_refuted": (4, 89),
    "test_bmc.py::test_seeded_bug_is_found_with_a_short_trace": (3, 85),
    "test_bugs.py::test_the_lockstep_catches_every_broken_pool": (6, 24),
    "test_refinement.py::test_every_seeded_pool_bug_is_caught_by_exhaustive_exploration": (4, 93),
    "test_refinement.py::test_the_pool_refines_the_model": (1, 33),
    "test_oracle_black_box.py::test_each_planted_bug_is_caught": (1, 36),
    "test_drive.py::test_each_planted_bug_is_caught_with_a_short_trace": (2, 32),
    "test_long_lived.py::test_long_lived_runs_agree_on_kvpools_pool_and_churn": (1, 27),
    "test_coverage.py::test_the_campaign_alone_reaches_every_branch": (1, 25),
}


@pytest.hookimpl(tryfirst=True)  # before -m picks the cases to run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    kept: dict[str, int] = {}
    for item in items:
        case = item.nodeid.removeprefix("tests/")
        test = case.partition("[")[0]
        if case in SLOW_CASES:
            item.add_marker(pytest.mark.slow)
        elif test in SAMPLED:
            kept[test] = kept.get(test, 0) + 1
            if kept[test] > SAMPLED[test][0]:
                item.add_marker(pytest.mark.slow)
