"""Bounded model checking of the executable model (kvpool.proofs.bmc), and its seeded bugs."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from kvpool.bugs import BUGS
from kvpool.bugs.actions import patched
from kvpool.bugs.check import bmc_config, find_with_bmc
from kvpool.cli.bmc import main as bmc_main
from kvpool.model import (
    ACTIONS,
    CALLER_ACTIONS,
    INVARIANTS,
    OPERATIONS,
    QUERIES,
    ContractBroken,
    Output,
    PoolState,
    violated,
)
from kvpool.model import contracts as C
from kvpool.model.properties import (
    EVENT_LOG,
    QUEUE_ORDER,
    broken_by,
    policy_queue,
)
from kvpool.proofs import bmc
from kvpool.proofs.bmc.branches import measure as measure_branches
from kvpool.proofs.bmc.branches import shortfall
from kvpool.proofs.bmc.domains import scope_of

SMALL = bmc.Bounds(blocks=4)
NET = 3600.0
"""The searches below are bounded by their depth; their time budget is only a safety net, far
above what a loaded machine needs, and a search it cuts fails its test (``complete``, or the
bug not found)."""
ACTION_FORMS = [name for name, bug in BUGS.items() if bug.action is not None]


def _found(bug: str) -> bmc.Outcome:
    """The search for ``bug`` (in the bug's own pool), shared with the other tests."""
    out: bmc.Outcome = find_with_bmc(bug, SMALL, depth=6, seconds=NET).trace
    return out


@pytest.mark.slow
def test_model_passes_bmc_to_depth_two() -> None:
    out = bmc.explore(SMALL, depth=2, seconds=NET)
    assert out.ok, bmc.format_trace(out, SMALL)
    assert out.complete and out.depth == 2 and out.states > 1000


def test_model_passes_bmc_with_two_token_hash_chunks() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    out = bmc.explore(cfg, depth=2, seconds=NET)
    assert out.ok and out.complete, bmc.format_trace(out, cfg)


def test_every_action_is_explored() -> None:
    """The argument domains reach every model action with an accepted call."""
    s0 = SMALL.initial()
    s1, _ = ACTIONS["get_new_blocks"](s0.copy(), 2)  # the actions update in place: three states
    s2, _ = ACTIONS["cache_full_blocks"](s1.copy(), SMALL.requests()[0], [1, 2], 0, 2, 1, 0)
    taken = set()
    for s in (s0, s1, s2):
        for name, args in bmc.calls(s, SMALL, SMALL.requests()):
            t = bmc.apply_call(ACTIONS, s, (name, args))
            if t is not None and not t.refused:
                taken.add(name)
    assert taken == set(ACTIONS) | set(CALLER_ACTIONS)


def test_budget_stops_the_search() -> None:
    """A spent budget stops the search before the next state (0 s: before the first level, on
    any machine, so the outcome does not depend on how fast the search runs)."""
    out = bmc.explore(SMALL, depth=50, seconds=0.0)
    assert not out.complete and out.ok and out.depth == 0 and out.transitions == 0


@pytest.mark.parametrize("bug", ACTION_FORMS)
def test_seeded_bug_is_found_with_a_short_trace(bug: str) -> None:
    out = _found(bug)
    assert out.violation, f"{bug} not found to depth {out.depth}"
    assert 1 <= len(out.trace) <= 6
    action = BUGS[bug].action
    assert action is not None and any(st.action == action[0] for st in out.trace)


@pytest.mark.slow
def test_seeded_bugs_break_invariants_and_event_properties() -> None:
    broken = {name for bug in ACTION_FORMS for name in _found(bug).violation}
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
    assert "cache_full_blocks(" in text and "index r0[:" in text and "events Stored" in text


def test_refused_call_that_changes_state_is_reported() -> None:
    out = _found("counter_before_check")
    assert out.violation == ["refused_call_changes_nothing"]
    assert out.trace[-1].refused and out.trace[-1].refusal == "NOT_ENOUGH_FREE_BLOCKS"


def test_main_exit_codes_and_json(tmp_path: Any, capsys: Any) -> None:
    out = tmp_path / "bmc.json"
    assert bmc_main(["--depth", "1", "--blocks", "3", "--seconds", str(NET), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["depth"] == 1 and doc["states"] > 1
    assert "depth 1 fully explored" in capsys.readouterr().out
    assert bmc_main(["--depth", "3", "--blocks", "3", "--seconds", str(NET),
                     "--bug", "touch_leaves_block_free"]) == 1
    assert "VIOLATION" in capsys.readouterr().out


def test_event_properties_can_fail() -> None:
    """Finding, pinned: cache_full_blocks listing one block twice emits BlockRemoved for a
    key before the BlockStored that announces it (vLLM does the same); so the model names
    that call a broken contract, and the event property catches an action that accepts it."""
    r = SMALL.requests()[0]
    s1, _ = ACTIONS["get_new_blocks"](SMALL.initial(), 1)
    args = (r, [1, 1], 0, 2, 1, 0)
    with pytest.raises(ContractBroken, match="cached_once_per_call"):
        ACTIONS["cache_full_blocks"](s1, *args)
    with patched(C, cached_once_per_call=lambda blocks: None):
        s2, _ = ACTIONS["cache_full_blocks"](s1.copy(), *args)
    call = OPERATIONS["cache_full_blocks"].transition(s1, s2, args, out=s2.out)
    assert [p for p in broken_by(call) if p in EVENT_LOG] == ["event_removals_name_live_keys"]
    # A notice to a watcher never registered on the block (touch tells none).
    stray = Output(fired=[(bmc.watcher_a, 1)])
    touched, _ = ACTIONS["touch"](s1.copy(), [1])
    assert broken_by(OPERATIONS["touch"].transition(s1, touched, ([1],), out=stray)) == [
        "fired_watchers_were_registered"]


@pytest.mark.parametrize(("bug", "prop", "frame"), [
    ("alloc_pops_tail", "allocation_takes_queue_head", True),
    ("touch_swap_remove", "queue_keeps_relative_order", True),
    ("free_pushes_head_one_by_one", "queue_follows_eviction_policy", False),
    ("free_hashed_to_head", "queue_follows_eviction_policy", False),
])
def test_eviction_order_bugs_break_only_order_properties(bug: str, prop: str, frame: bool) -> None:
    """The invariants are blind to the queue's order; the order properties are not.

    Two of them also change what lies outside the call's declared footprint (``frame``):
    handing out the tail's blocks instead of the head's, and moving an untouched block in
    the queue; the footprint property sees that, and nothing else does.
    """
    out = _found(bug)
    assert prop in out.violation
    others = set(out.violation) - set(QUEUE_ORDER)
    assert others == ({"changes_stay_in_footprint"} if frame else set()), out.violation
    assert violated(out.trace[-1].after) == []


def test_free_hashed_to_head_trace_shows_the_queue() -> None:
    text = bmc.format_trace(_found("free_hashed_to_head"), SMALL)
    assert "VIOLATION of queue_follows_eviction_policy after 3 step(s)" in text
    assert re.search(r"block 1 hashes - -> r0\[:(\d)\]/g0@\1", text)  # cached, so it belongs at the tail
    assert "3. free_blocks(block_ids=[1])" in text and "free queue [2, 3] -> [1, 2, 3]" in text


def test_policy_queue_states_the_eviction_order() -> None:
    """The order spec on a hand-made case: unhashed to the head, cached to the tail,
    each in the order its last reference is dropped; touch removes in place."""
    def call(before: PoolState, name: str, args: tuple[Any, ...], after: PoolState | None = None) -> Any:
        return OPERATIONS[name].transition(before, before if after is None else after, args,
                                           out=None if after is None else after.out)

    r = SMALL.requests()[0]
    s, _ = ACTIONS["get_new_blocks"](SMALL.initial(), 3)
    s, _ = ACTIONS["cache_full_blocks"](s, r, [1, 3], 0, 2, 1, 0)
    s, _ = ACTIONS["touch"](s, [3])  # block 3: two references
    args = ([3, 2, 1, 3],)
    assert policy_queue(call(s, "free_blocks", args)) == (2, 1, 3)
    after, _ = ACTIONS["free_blocks"](s.copy(), *args)
    assert after.free == (2, 1, 3)
    assert broken_by(call(s, "free_blocks", args, after)) == []
    assert policy_queue(call(after, "touch", ([1, 0],))) == (2, 3)
    assert policy_queue(call(s, "unpin_blocks", ([2, 1], bmc.watcher_a))) == (2, 1)
    # Block 2 moving is outside touch([1])'s footprint too.
    assert broken_by(call(after, "touch", ([1],), replace(after, free=(3, 2)))) == [
        "queue_keeps_relative_order", "queue_follows_eviction_policy", "changes_stay_in_footprint"]


# --------------------------------------------------------------------------
# Symmetry reduction and the events-off pool.


def _orbits(cfg: bmc.Bounds, depth: int) -> tuple[set[tuple[object, ...]], int]:
    keys: set[tuple[object, ...]] = set()
    renamings = bmc.renamings_of(cfg)

    def visit(s: PoolState) -> None:
        keys.add(bmc.orbit_key(s, renamings))

    out = bmc.explore(cfg, depth=depth, seconds=NET, visit=visit)
    assert out.ok and out.complete, bmc.format_trace(out, cfg)
    return keys, out.states


def test_symmetry_reduction_loses_no_state() -> None:
    """Exploring one state per renaming class reaches every class the full search reaches."""
    cfg = bmc.Bounds(blocks=3)
    full, n_full = _orbits(replace(cfg, symmetry=False), 2)
    reduced, n_reduced = _orbits(cfg, 2)
    assert reduced == full
    assert n_reduced == len(reduced) < n_full


def test_orbit_key_identifies_exactly_renamed_states() -> None:
    r = SMALL.requests()[0]
    s0 = SMALL.initial()
    one, _ = ACTIONS["touch"](s0.copy(), [1])  # the actions update in place
    two, _ = ACTIONS["touch"](s0.copy(), [2])
    assert one != two and bmc.orbit_key(one) == bmc.orbit_key(two)  # in-use block renamed
    g0, _ = ACTIONS["cache_full_blocks"](s0.copy(), r, [1], 0, 1, 1, 0)
    g1, _ = ACTIONS["cache_full_blocks"](s0.copy(), r, [1], 0, 1, 1, 1)
    ren = bmc.renamings_of(SMALL)
    assert bmc.orbit_key(g0) != bmc.orbit_key(g1)
    assert bmc.orbit_key(g0, ren) == bmc.orbit_key(g1, ren)  # groups renamed
    h2, _ = ACTIONS["cache_full_blocks"](s0.copy(), r, [2], 0, 1, 1, 0)
    assert bmc.orbit_key(g0, ren) != bmc.orbit_key(h2, ren)  # the queue orders free blocks


def test_model_passes_bmc_with_events_off() -> None:
    cfg = bmc.Bounds(blocks=3, events_on=False)
    out = bmc.explore(cfg, depth=2, seconds=NET)
    assert out.ok and out.complete, bmc.format_trace(out, cfg)


def test_bug_config_and_cli_for_an_events_off_bug(capsys: Any) -> None:
    assert bmc_config(BUGS["stored_event_when_disabled"]).events_on is False
    assert bmc_config(BUGS["free_same_block_twice"]) == bmc.Bounds()
    assert bmc_main(["--depth", "2", "--seconds", str(NET), "--bug", "stored_event_when_disabled"]) == 1
    text = capsys.readouterr().out
    assert "VIOLATION of no_events_when_disabled" in text and "events off" in text


# --------------------------------------------------------------------------
# The call domains reach every branch and every argument shape (issue 23): a domain that
# stops generating a legal call (never replace_existing_hashes=True, say) fails here.

DOMAIN_RUNS = ((bmc.Bounds(), 2), (bmc.Bounds(blocks=3, hash_block_size=2), 3),
               (bmc.Bounds(blocks=3, hash_block_size=2, events_on=False), 3))
"""The ci profile's BMC pools, and one with events off (a move of an unannounced entry)."""

NOT_FOR_THE_BMC = ("RefusalKind.INVALID_ARGUMENT", "RefusalKind.UNKNOWN_BLOCK",
                   "RefusalKind.CACHING_DISABLED", "s.caching", "null_counted", "boundary_partials",
                   '"hashes_name_one_prefix"')
"""Branches the BMC does not take by design: argument-shape refusals (the refinement's misuse
makes those calls), a pool's configuration the BMC does not build (caching off, vLLM 0.33's
settings: the refinement and the lockstep build them), and a hash collision (its requests hash
apart: the contract is the one assumption, checked only where a key is reused)."""


def _domain(name: str, s: PoolState, cfg: bmc.Bounds) -> list[tuple[Any, ...]]:
    return list(OPERATIONS[name].domain(s, scope_of(cfg)))


def _one_step_states(cfg: bmc.Bounds) -> list[PoolState]:
    states: list[PoolState] = []
    assert bmc.explore(cfg, 1, NET, visit=states.append).ok
    return states


def test_the_domains_reach_every_branch_and_pair_that_declared_calls_reach() -> None:
    """The domains' coverage is judged by what the model does with their calls (bmc/domain-branches)."""
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states = _one_step_states(cfg)
    cov = measure_branches(states, cfg)
    assert cov.ok, shortfall(cov)
    assert len(cov.reference) > 150 and len(cov.reference_pairs) > 1000
    assert cov.reference_calls > cov.domain_calls  # the reference is not the domain


def _narrowed(cfg: bmc.Bounds, drop: Callable[[str, tuple[Any, ...]], bool]
              ) -> Callable[[PoolState], Iterator[tuple[str, tuple[Any, ...]]]]:
    return lambda s: ((n, a) for n, a in bmc.calls(s, cfg, cfg.requests()) if not drop(n, a))


@pytest.mark.parametrize(("operation", "drop", "what"), [
    ("cache_full_blocks", lambda n, a: any(isinstance(x, list) and len(set(x)) < len(x) for x in a),
     "cached_once_per_call"),
    ("cache_partial_block", lambda n, a: n == "cache_partial_block" and a[5], "replace_existing_hashes"),
    ("touch", lambda n, a: n == "touch" and len(a[0]) > 1, "s.free.remove(b)"),
], ids=["a-repeat-inside-one-listing", "never-replacing", "touching-one-block"])
def test_a_domain_that_drops_a_class_of_calls_the_model_treats_apart_is_caught(
        operation: str, drop: Callable[[str, tuple[Any, ...]], bool], what: str) -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states = _one_step_states(cfg)
    cov = measure_branches(states, cfg, _narrowed(cfg, drop), only={operation})
    assert not cov.ok
    shown = "\n".join(shortfall(cov, 100))
    assert what in shown and "e.g. " + operation in shown, shown


def _guard_without(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard helper that lost its check (as a mutant of model/guards.py would)."""
    from kvpool.model import guards

    monkeypatch.setattr(guards, check, lambda *_a, **_k: None)


@pytest.mark.parametrize("check", ["check_count", "check_group", "check_block_size", "check_chunks",
                                   "check_ids"])
def test_a_guard_that_lost_an_argument_check_lets_misuse_through(
        check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.proofs.bmc.misuse import check_misuse

    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states = _one_step_states(cfg)
    assert check_misuse(states, cfg).ok
    _guard_without(check, monkeypatch)
    out = check_misuse(states, cfg)
    assert not out.ok and out.let_through, check


@pytest.mark.slow
def test_the_domains_reach_every_branch_of_every_action() -> None:
    from kvpool.oracle.search.coverage import measure

    def run() -> None:
        for cfg, depth in DOMAIN_RUNS:
            assert bmc.explore(cfg, depth, 600).ok

    _, cov = measure(run, "bmc", misuse=False)
    queries = {OPERATIONS[n].next.__name__ for n in QUERIES} | {OPERATIONS[n].guard.__name__ for n in QUERIES}
    missed = [b for b in cov.missed if not any(why in b.source or why in b.into for why in NOT_FOR_THE_BMC)
              and not _in_function(b, queries)]
    assert missed == [], "\n".join(map(str, missed))
    assert cov.covered > 100


def _in_function(b: Any, names: set[str]) -> bool:
    """Whether branch ``b`` lies in a function of its file named in ``names``."""
    import inspect

    from kvpool.model import guards, pool

    module = {"guards.py": guards, "pool.py": pool}.get(b.file)
    if module is None:
        return False
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            body, first = inspect.getsourcelines(fn)
            if first <= b.line < first + len(body):
                return True
    return False


# The domains' own promises (their docstrings): which calls each one offers, exactly.  A search
# passes with a domain that offers more or fewer calls; these tests are what pins one.

@pytest.mark.parametrize(("hbs", "counts"), [(1, {1, 2, 3, 4}), (2, {2, 4})])
def test_writes_and_inserts_cover_each_whole_chunk_of_a_request(hbs: int, counts: set[int]) -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=hbs)
    s = cfg.initial()
    assert {nt for _b, _r, nt in _domain("write_block", s, cfg)} == counts  # requests: 4 tokens
    assert {nt for _r, nt, _g, _b, _n in _domain("_insert_block_hash", s, cfg)} == counts


def test_an_insert_is_a_primary_exactly_where_the_block_has_none() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states = [s for s in _one_step_states(cfg) if any(p is not None for p in s.primary)]
    assert states
    for s in states:
        for _r, nt, _g, b, primary_tokens in _domain("_insert_block_hash", s, cfg):
            assert primary_tokens == (nt if s.primary[b] is None else None)


def test_the_sized_operations_take_the_hash_block_size_and_twice_it() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    s = cfg.initial()
    calls = _domain("emit_cached_block_events", s, cfg)
    assert {bs for _r, _n, bs, _g in calls} == {2, 4}
    assert {n for _r, n, _bs, _g in calls} == {0, 1}  # no hit, and a hit on the request's first block
    assert len(calls) == len(set(map(repr, calls))) == 3 * 2 * 2 * 2
    assert {a[4] for a in _domain("cache_full_blocks", s, cfg)} == {2, 4}
    assert {a[4] for a in _domain("cache_partial_block", s, cfg)} == {2, 4}


def test_a_pool_that_takes_boundary_partials_is_offered_them_and_explored() -> None:
    """vLLM 0.33's settings (partial entries at block boundaries, the null block's count left alone)."""
    cfg = bmc.Bounds(blocks=3, hash_block_size=2, reference="0.33")
    s = cfg.initial()
    assert s.boundary_partials and not s.null_counted
    calls = _domain("cache_partial_block", s, cfg)
    assert any(bs == cfg.hash_block_size and not rep for _r, _b, _nt, _g, bs, rep in calls)
    assert bmc.explore(cfg, 2, NET).ok


def test_a_partial_entry_ends_inside_a_block_unless_it_replaces_the_whole_request() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    s = cfg.initial()
    calls = _domain("cache_partial_block", s, cfg)
    at_boundary = [c for c in calls if c[4] == cfg.hash_block_size]
    assert at_boundary and all(nt == len(r.all_token_ids) and g == cfg.groups[0] and rep is True
                               for r, _b, nt, g, _bs, rep in at_boundary)
    assert len(at_boundary) == len(cfg.requests()) * cfg.blocks
    inside = [c for c in calls if c[4] != cfg.hash_block_size]
    assert all(nt % bs for _r, _b, nt, _g, bs, _rep in inside)
    assert {(nt, g, rep) for _r, _b, nt, g, _bs, rep in inside} == {
        (2, g, rep) for g in cfg.groups for rep in (False, True)}


def test_full_block_ranges_cache_something_new_but_one_no_op_per_request_size_and_group() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    calls = _domain("cache_full_blocks", cfg.initial(), cfg)
    no_ops = [c for c in calls if c[2] >= c[3]]
    assert no_ops and all(c[1] == [0, 0] for c in no_ops)
    assert len({(c[0].request_id, c[4], c[5]) for c in no_ops}) == len(no_ops)
    assert all(type(c[3]) is int for c in calls)  # a count, never a float
    assert {(c[1][0], c[2]) for c in calls if len(c[1]) == 2 and c[2]} == {(0, 1)}
    pairs = {(a, b) for a in range(cfg.blocks) for b in range(cfg.blocks)}
    for r, bs, g in itertools.product(cfg.requests(), (2, 4), cfg.groups):
        fresh = {tuple(c[1]) for c in calls if c[0] == r and c[4] == bs and c[5] == g and c[2] == 0}
        assert {(b,) for b in range(cfg.blocks)} | pairs <= fresh


def test_two_block_unpins_carry_the_first_watcher() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    calls = _domain("unpin_blocks", cfg.initial(), cfg)
    assert {w for ids, w in calls if len(ids) == 2} == {bmc.WATCHERS[0]}
    assert {w for ids, w in calls if len(ids) == 1} == set(bmc.WATCHERS)


def test_allocations_ask_for_one_block_up_to_every_real_block() -> None:
    cfg = bmc.Bounds(blocks=4, hash_block_size=2)
    assert _domain("get_new_blocks", cfg.initial(), cfg) == [(1,), (2,), (3,)]


def test_masks_skip_either_block_of_two_new_ones_and_only_there() -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    masks: dict[int, set[Any]] = {}
    for _r, _ids, nc, nf, _bs, _g, mask in _domain("cache_full_blocks", cfg.initial(), cfg):
        masks.setdefault(nf - nc, set()).add(None if mask is None else tuple(mask))
    assert masks[2] == {None, (True, False), (False, True)}
    assert all(m == {None} for new, m in masks.items() if new != 2)
