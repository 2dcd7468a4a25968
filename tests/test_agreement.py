"""The z3 encoding against the model (kvpool.proofs.agreement) and its evaluator (kvpool.proofs.evaluate).

The check must pass on the real encoding, catch each seeded encoding bug with
a concrete state, and rest on an evaluator that computes what z3 computes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
import z3  # type: ignore[import-untyped]

from kvpool import verify
from kvpool.model import ACTIONS, INVARIANTS, LEMMAS
from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import extends
from kvpool.proofs import agreement, bmc
from kvpool.proofs import transitions as T
from kvpool.proofs.evaluate import Carriers, Undetermined, abstract, compile_predicate, cross_check
from kvpool.proofs.invariants import SYM_INVARIANTS
from kvpool.proofs.step_properties import SymStepProperty
from kvpool.proofs.symbolic import EMPTY, NULL, Block, KeySort, SymState, prefix

HBS1 = bmc.Bounds(hash_block_size=1)
HBS2 = bmc.Bounds(hash_block_size=2)


def _secondary_state() -> Any:
    """Block 1 hashed under r1's first key with r0's 2-token partial key as a secondary one.

    Reached by the BMC's own calls: a partial entry (r0, 2 tokens, at block size 4), then
    r1's full block of 2 tokens, which shares that prefix (2 is not longer: the partial stays
    primary, the full key is added as a secondary).
    """
    r0, r1, _r2 = HBS1.requests()
    s = HBS1.initial()  # a fresh state: the actions update it in place
    s, _ = ACTIONS["get_new_blocks"](s, 1)
    s, _ = ACTIONS["cache_partial_block"](s, r0, 1, 2, 0, 4, False)
    s, _ = ACTIONS["cache_partial_block"](s, r1, 1, 2, 1, 4, False)
    return replace(s, events=[])


# --------------------------------------------------------------------------
# The real encoding agrees with the model.


@pytest.mark.parametrize("cfg", [HBS1, HBS2], ids=["hbs1", "hbs2"])
def test_the_encoding_agrees_with_the_model_on_every_state_and_call_to_depth_2(cfg: bmc.Bounds) -> None:
    rep = agreement.check(cfg, 2, perturb=3)
    assert rep.complete and rep.depth == 2
    assert dict(rep.disagreements) == {}, {c: [e.detail for e in x] for c, x in rep.examples.items()}
    assert rep.never_false == [] and rep.ok
    assert set(rep.invariants) == set(SYM_INVARIANTS) | set(LEMMAS)
    assert all(t and f for t, f in rep.invariants.values()), rep.invariants
    assert all(enabled for enabled, _refused in rep.steps.values()), rep.steps
    refused = {n for n, (_e, r) in rep.steps.items() if r}
    assert {"alloc", "release", "unpin", "cache_full", "cache_partial", "move", "write"} <= refused
    assert rep.unfaithful > 0  # duplicated queue members, empty index lists, ... were tried


@pytest.mark.slow  # 39 s
def test_the_search_keeps_exactly_the_bmc_states() -> None:
    for cfg in (HBS1, HBS2):
        out = bmc.explore(cfg, 2, 3600)  # a safety net: the verdict is the depth, not the load
        rep = agreement.check(cfg, 2, perturb=0)
        assert out.complete and rep.complete
        assert rep.states == out.states
        assert rep.calls >= out.transitions  # plus the calls that break a caller contract


def test_a_pool_with_events_off_agrees_too() -> None:
    rep = agreement.check(replace(HBS2, events_on=False), 2, perturb=5)
    assert rep.ok, {c: [e.detail for e in x] for c, x in rep.examples.items()}


def test_a_model_announcing_with_events_off_is_caught_on_a_pool_with_events_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agreement's events-off pool (agreement_events_off): z3 leaves the announcements alone
    there, so a model that records one is refused; a pool with events on cannot show it."""
    from dataclasses import replace as with_field

    from kvpool.model import OPERATIONS

    op = OPERATIONS["_insert_block_hash"]

    def announcing(s: Any, request: Any, prefix_tokens: int, group: int, block_id: int, n: Any) -> None:
        op.next(s, request, prefix_tokens, group, block_id, n)
        s.announced.add(((request.block_hashes[prefix_tokens // s.hash_block_size - 1], group), block_id))

    monkeypatch.setitem(OPERATIONS, "_insert_block_hash", with_field(op, next=announcing))
    off = agreement.check(bmc.Bounds(blocks=3, hash_block_size=2, events_on=False), 2, perturb=0, first=True)
    assert "step/insert" in off.disagreements, off.disagreements
    assert "live" in off.examples["step/insert"][0].detail


def test_every_call_from_a_state_with_secondary_keys_agrees() -> None:
    s = _secondary_state()
    assert s.secondary[1] and s.primary[1] is not None
    rep = agreement.check(HBS1, 1, perturb=1, start=s)
    assert rep.ok, {c: [e.detail for e in x] for c, x in rep.examples.items()}
    assert rep.steps["evict"][0] and rep.steps["cache_full"][0]


def test_without_perturbations_no_invariant_is_shown_false() -> None:
    """Reached states satisfy every invariant: the "false" direction needs the perturbations."""
    rep = agreement.check(HBS2, 1, perturb=0)
    assert not rep.disagreements
    assert set(rep.never_false) == set(agreement.CHECKED) and not rep.ok


def test_every_perturbation_kind_breaks_what_it_says() -> None:
    """Each checked predicate is false on some perturbation of the states at depth 1."""
    rep = agreement.check(HBS1, 1, perturb=1)
    assert rep.ok and len(rep.perturbations) >= 25, rep.perturbations


# --------------------------------------------------------------------------
# Seeded encoding bugs: each is caught, with a concrete state.

_k = z3.Const("bound.k", KeySort)
_b = z3.Const("bound.b", Block)


def _weak_soundness(s: SymState) -> Any:
    """index_entries_are_sound for PRIMARY keys only (the audit's weakening)."""
    return z3.ForAll([_k, _b], z3.Implies(
        z3.And(s.idx[_k, _b], s.prim[_b], s.pkey[_b] == _k), prefix(s.names[_k], s.holds[_b])))


def test_soundness_weakened_to_primary_keys_is_caught() -> None:
    rep = agreement.check(HBS1, 1, perturb=1, start=_secondary_state(),
                          predicates={"index_entries_are_sound": _weak_soundness})
    bad = rep.examples["invariant/index_entries_are_sound"]
    assert bad and "model False, z3 True" in bad[0].detail
    s = bad[0].state  # a block whose SECONDARY key names a prefix the block does not hold
    unsound = [(k, b) for k, bs in s.index.items() for b in bs
               if not extends(s.holds[b], s.names[k])]
    assert unsound and all(s.primary[b] is None or s.primary[b].key != k for k, b in unsound)


def _step(name: str, fn: Any) -> T.StepSpec:
    return T.StepSpec(fn, T.STEPS[name].args, name)


def test_a_step_forgetting_holders_is_caught() -> None:
    def touch(s: SymState, b: Any) -> T.SymStep:
        st = T.touch(s, b)
        return replace(st, post=replace(st.post, holders=s.holders))

    rep = agreement.check(HBS1, 1, perturb=0, steps={"touch": _step("touch", touch)})
    (first, *_rest) = rep.examples["step/touch"]
    assert "holders" in first.detail and first.what.startswith("touch([")
    assert set(rep.disagreements) == {"step/touch"}


@pytest.mark.slow
def test_a_step_with_too_strong_a_precondition_is_caught() -> None:
    def release(s: SymState, b: Any) -> T.SymStep:  # forgets that the null block may be freed
        st = T.release(s, b)
        return replace(st, pre=s.ref[b] > 0)

    rep = agreement.check(HBS1, 2, perturb=0, steps={"release": _step("release", release)})
    bad = rep.examples["step/release"]
    assert bad and "precondition of step 1 (release(0)) is false" in bad[0].detail
    assert "model: accepted" in bad[0].what


def test_a_step_with_too_weak_a_precondition_is_caught() -> None:
    def cache_full(s: SymState, b: Any, k: Any, t: Any, c: Any) -> T.SymStep:  # no conflict check
        st = T.cache_full(s, b, k, t, c)
        kept = [p for p in st.pre.children() if not p.eq(z3.Or(z3.Not(s.prim[b]), s.ptok[b] < t))]
        assert len(kept) == len(st.pre.children()) - 1
        return replace(st, pre=z3.And(*kept))

    rep = agreement.check(HBS2, 2, perturb=0, steps={"cache_full": _step("cache_full", cache_full)})
    bad = rep.examples["step/cache_full"]
    assert bad and "refused HASH_CONFLICT" in bad[0].what and "z3 enables every step" in bad[0].detail


def test_a_removed_set_missing_an_entry_is_caught() -> None:
    x, k = z3.Const("lam.x", Block), z3.Const("lam.k", KeySort)

    def evict(s: SymState, b: Any) -> T.SymStep:  # announces only the primary key's removal
        st = T.evict(s, b)
        return replace(st, removed=z3.Lambda([k, x], z3.And(x == b, s.prim[b], s.pkey[b] == k)))

    rep = agreement.check(HBS1, 1, perturb=0, start=_secondary_state(),
                          steps={"evict": _step("evict", evict)})
    (first, *_rest) = rep.examples["step/evict"]
    assert first.what.startswith("evict_blocks([1])")
    assert "step 1 (evict(1)) removed" in first.detail and first.state.secondary[1]


def test_a_wrong_next_state_names_the_field() -> None:
    def unpin(s: SymState, b: Any) -> T.SymStep:  # forgets to register the watcher
        st = T.unpin(s, b)
        return replace(st, post=replace(st.post, watched=s.watched))

    s, _ = ACTIONS["get_new_blocks"](HBS1.initial(), 2)
    rep = agreement.check(HBS1, 1, perturb=0, start=s, steps={"unpin": _step("unpin", unpin)})
    (first, *_rest) = rep.examples["step/unpin"]
    assert first.detail.startswith("watched: z3 (False, ")


# --------------------------------------------------------------------------
# The evaluator computes what z3 computes.


@pytest.mark.parametrize("cfg", [HBS1, HBS2], ids=["hbs1", "hbs2"])
def test_the_compiled_terms_agree_with_z3_on_a_sample(cfg: bmc.Bounds) -> None:
    out = agreement.z3_sample(cfg, 22, seed=cfg.hash_block_size)
    assert out.mismatches == []
    assert set(out.steps) == set(T.STEPS) and set(out.predicates) == set(agreement.CHECKED)
    assert out.enabled >= 11  # results compared cell by cell, not only preconditions


def test_the_cross_check_has_teeth() -> None:
    """A compiled step checked against another step's z3 terms is reported."""
    d = agreement.domain_of(HBS1)
    cs = agreement.compile_all(d)
    s, _ = ACTIONS["get_new_blocks"](HBS1.initial(), 2)
    assert cross_check(d, s, T.STEPS["touch"], (1,), cs.steps["touch"]) == []
    assert cross_check(d, s, T.STEPS["touch"], (1,), cs.steps["release"]) == [
        "touch post: z3 does not give the compiled result"]
    wrong = compile_predicate(d, lambda st: z3.BoolVal(False), "false")
    assert cross_check(d, s, pred=SYM_INVARIANTS["null_block_inert"], compiled_pred=wrong) == [
        "predicate: z3 True, compiled False"]


def test_an_undefined_cell_decides_nothing_but_does_not_hide_what_decides() -> None:
    """Kleene's logic: ``names`` of an unnamed key is free in z3, so a formula that depends on
    it is undetermined, and one that does not (another disjunct decides) is not."""
    d = agreement.domain_of(HBS1)
    s = HBS1.initial()  # nothing named, nothing indexed
    k = z3.Const("bound.k", KeySort)
    decided = lambda st: z3.ForAll([k], z3.Or(st.names[k] == EMPTY, z3.Not(st.idx[k, NULL])))  # noqa: E731
    free = lambda st: z3.ForAll([k], st.names[k] == EMPTY)  # noqa: E731
    assert compile_predicate(d, decided)(abstract(d, s)) is True
    with pytest.raises(Undetermined):
        compile_predicate(d, free)(abstract(d, s))
    for pred in (decided, free):
        assert cross_check(d, s, pred=pred, compiled_pred=compile_predicate(d, pred)) == []


def test_the_domain_covers_every_key_and_content_of_the_bmc() -> None:
    rep = agreement.check(HBS2, 2, perturb=0)  # a key or content outside it would raise KeyError
    d = agreement.domain_of(HBS2)
    assert rep.states and EMPTY_PREFIX in d.contents and len(d.keys) == len(set(d.keys))
    assert isinstance(Carriers.covering([HBS2.initial()]), Carriers)


def test_model_and_encoding_name_the_same_predicates() -> None:
    assert set(agreement.CHECKED) <= set(INVARIANTS) | set(LEMMAS)
    assert set(agreement.MODEL_PREDICATES) == set(INVARIANTS) | set(LEMMAS)


# --------------------------------------------------------------------------
# Step properties both ways, and the queue as a sequence.

DEEP = bmc.Bounds(blocks=3, hash_block_size=2)
"""Three calls reach two cached blocks freed together and a reset after an unpin."""


def test_every_step_property_and_the_queue_agree_both_ways() -> None:
    rep = agreement.check(DEEP, 3, perturb=4)
    assert rep.ok, {c: [e.detail for e in x] for c, x in rep.examples.items()}
    assert set(rep.properties) == set(agreement.COMPARED_PROPERTIES)
    assert all(held and broken for held, broken in rep.properties.values()), rep.properties
    assert rep.never_broken == [] and rep.queues > 10_000


def _weak_announcements(s: SymState, _args: Any, st: T.SymStep) -> Any:
    """The event property without "an announcement never doubles a live one"."""
    b, k = z3.Const("bound.b", Block), z3.Const("bound.k", KeySort)
    return z3.Implies(z3.And(st.pre, s.events), z3.ForAll([k, b], st.post.live[k, b] == st.post.idx[k, b]))


def test_a_weakened_z3_step_property_is_caught() -> None:
    rep = agreement.check(DEEP, 2, perturb=1, properties={
        "event_announcements_match_index": SymStepProperty(None, _weak_announcements)})
    assert set(rep.disagreements) == {"property/event_announcements_match_index"}
    first = rep.examples["property/event_announcements_match_index"][0]
    assert "a Stored of a live entry" in first.what and "model False, z3 True" in first.detail


def _fresh_announcements_only(s: SymState, _args: Any, st: T.SymStep) -> Any:
    """The event property without "the live announcements after the step are the index": weaker
    by one conjunct, and no alteration made for the property itself breaks that conjunct."""
    b, k = z3.Const("bound.b", Block), z3.Const("bound.k", KeySort)
    return z3.Implies(z3.And(st.pre, s.events), z3.ForAll([k, b], z3.Implies(
        st.stored[k, b], z3.Not(z3.And(s.live[k, b], z3.Not(st.removed[k, b]))))))


def test_a_z3_step_property_weaker_by_any_conjunct_is_caught_on_other_alterations() -> None:
    """Every property is compared on every alteration and on perturbed next states, not only the
    property an alteration was made for: "z3 true, model false" is a disagreement too."""
    rep = agreement.check(DEEP, 2, perturb=1, properties={
        "event_announcements_match_index": SymStepProperty(None, _fresh_announcements_only)})
    assert set(rep.disagreements) == {"property/event_announcements_match_index"}
    found = rep.examples["property/event_announcements_match_index"]
    assert all("model False, z3 True" in d.detail for d in found)
    assert not any("a Stored of a live entry" in d.what for d in found)


def _reset_forgets_only(s: SymState, _args: Any, st: T.SymStep) -> Any:
    """The reset property without "enabled exactly when no real block is in use"."""
    b, k = z3.Const("bound.b", Block), z3.Const("bound.k", KeySort)
    return z3.Implies(st.pre, z3.And(z3.ForAll([k, b], z3.Not(st.post.idx[k, b])),
                                     z3.ForAll([b], z3.Not(st.post.watched[b]))))


def _alloc_anything(s: SymState, args: Any, st: T.SymStep) -> Any:
    """The allocation property reduced to "a handed-out block is real"."""
    return z3.Implies(st.pre, args[0] != NULL)


def _recache_shorter_only(s: SymState, args: Any, st: T.SymStep) -> Any:
    """The conflict property with "a prefix as long" turned into "a longer prefix"."""
    b, t = args[0], args[2]
    return z3.Implies(st.pre, z3.Or(z3.Not(s.prim[b]), s.ptok[b] <= t))


@pytest.mark.parametrize(("prop", "steps", "claim", "label"), [
    ("reset_needs_an_idle_pool", ("reset",), _reset_forgets_only, "a reset refused on an idle pool"),
    ("allocation_succeeds_iff_enough_free", ("alloc",), _alloc_anything,
     "an allocation refused with enough idle blocks"),
    ("conflicting_caches_are_refused", ("cache_full",), _recache_shorter_only,
     "a block cached again at a prefix as long"),
], ids=["reset", "alloc", "recache"])
def test_a_z3_property_about_enabling_weakened_is_caught_on_calls_refused_on_purpose(
        prop: str, steps: tuple[str, ...], claim: Any, label: str) -> None:
    """The properties about when a step is enabled are compared both ways too: a call the model
    would have to accept is refused on purpose, with its last z3 step disabled."""
    rep = agreement.check(DEEP, 2, perturb=1, properties={prop: SymStepProperty(steps, claim)})
    assert set(rep.disagreements) == {f"property/{prop}"}, rep.disagreements
    found = rep.examples[f"property/{prop}"]
    assert any(label in d.what and "model False, z3 True" in d.detail for d in found), found


def _evicted_without_primary(s: SymState, args: Any, st: T.SymStep) -> Any:
    """The eviction property without "no primary key": the index and the secondaries alone."""
    b, k = args[0], z3.Const("bound.k", KeySort)
    return z3.Implies(st.pre, z3.ForAll([k], z3.And(z3.Not(st.post.sec[b, k]), z3.Not(st.post.idx[k, b]))))


def test_a_z3_property_weakened_where_only_an_unreachable_next_state_differs_is_caught() -> None:
    """A next state with a primary key the index lacks (a perturbation) tells the two apart."""
    rep = agreement.check(DEEP, 2, perturb=1, properties={
        "evicted_blocks_leave_the_index": SymStepProperty(("evict",), _evicted_without_primary)})
    assert set(rep.disagreements) == {"property/evicted_blocks_leave_the_index"}
    found = rep.examples["property/evicted_blocks_leave_the_index"]
    assert any("a primary key the index lacks" in d.what for d in found), found


@pytest.mark.slow  # 26 s; kvpool verify's seeded bugs include it
def test_a_queue_step_freeing_cached_blocks_to_the_head_is_caught() -> None:
    from kvpool.bugs import BUGS

    _name, fn, sorts = BUGS["free_hashed_to_head"].queue
    rep = agreement.check(DEEP, 3, perturb=0, queue={"release": (fn, sorts)})
    assert "queue/order" in rep.disagreements
    assert "the model's" in rep.examples["queue/order"][0].detail


def test_every_accepted_call_is_a_sequence_of_queue_steps() -> None:
    """The queue plan of each split step kind (free_blocks reserves its head places first)."""
    s = HBS1.initial()
    s, _ = ACTIONS["get_new_blocks"](s, 2)
    after = s.copy()
    p = agreement.plan(s, "free_blocks", ([1, 2],), None)
    assert agreement.queue_plan(p, after) == [("open_batch", (2,)), ("release", (1,)), ("release", (2,))]


# --------------------------------------------------------------------------
# The verify phase.


def test_the_phase_fails_with_a_readable_counterexample(monkeypatch: pytest.MonkeyPatch) -> None:
    def touch(s: SymState, b: Any) -> T.SymStep:
        st = T.touch(s, b)
        return replace(st, post=replace(st.post, holders=s.holders))

    monkeypatch.setattr(agreement, "STEPS", {**T.STEPS, "touch": _step("touch", touch)})
    budget = verify.Budget(agreement_pools=((4, 2),), agreement_depth=2, agreement_perturb=4,
                           agreement_samples=2)
    from kvpool.verify.phase_agreement import run_agreement

    phase = run_agreement(budget, verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    bad = [c for c in phase.cases if not c.ok]
    assert [c.id for c in bad] == ["agreement/step/touch"]
    fail = bad[0].failure
    assert fail is not None and "holders" in fail["message"]
    assert "block 0 (null): ref 0" in fail["details"] and "touch([" in fail["details"]
    assert fail["trace"][0]["picture"]["blocks"]
    # 859 before the ghost ``names`` forgot a key with its last entry, 700 before the domains
    # touched and unpinned two blocks at once and replaced contents at a block boundary (issue 23).
    assert phase.extra["states"] == 832 and phase.extra["invariants"]["null_block_inert"]["false"]
    assert phase.extra["steps"]["touch"]["enabled"] > 0 and phase.extra["complete"]
