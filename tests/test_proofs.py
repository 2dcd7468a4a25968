"""The z3 proofs (kvpool.proofs): the matrix, its sanity checks, and agreement with the model."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import z3  # type: ignore[import-untyped]

from kvpool.bugs import BUGS
from kvpool.bugs.check import refute_queue, refute_z3
from kvpool.cli.prove import main as prove_main
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.model import (
    ACTIONS,
    CALLER_ACTIONS,
    INVARIANTS,
    LEMMAS,
    ContractBroken,
    PoolState,
    initial_state,
    violated,
)
from kvpool.model.properties import STEP_PROPERTIES
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import Prefix, content, hashes_at
from kvpool.proofs import order
from kvpool.proofs import transitions as T
from kvpool.proofs.concrete import Universe, compare, compare_batch
from kvpool.proofs.inductive import (
    COUNTEREXAMPLE,
    NONE_IN_SCOPE,
    PROVEN,
    UNKNOWN,
    Result,
    check_enabled,
    check_initial,
    check_lemma,
    check_preservation,
    check_step_property,
    find_counterexample,
    matrix,
    settle,
)
from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS, SYM_LEMMAS
from kvpool.proofs.order import LEMMAS as ORDER_LEMMAS
from kvpool.proofs.order import ORDER_PROPERTIES
from kvpool.proofs.step_properties import (
    NOT_ENCODED_STEPS,
    SYM_STEP_DOCS,
    SYM_STEP_PROPERTIES,
    applies,
)
from kvpool.proofs.symbolic import SymState

# --------------------------------------------------------------------------
# Coverage: one source of truth for actions and invariants (kvpool.model).


def test_every_model_invariant_is_encoded_or_explained() -> None:
    assert set(SYM_INVARIANTS) | set(NOT_ENCODED) == set(INVARIANTS)
    assert not set(SYM_INVARIANTS) & set(NOT_ENCODED)
    assert all(NOT_ENCODED.values())
    assert set(SYM_LEMMAS) == set(LEMMAS)


def test_every_model_step_property_is_encoded_or_explained() -> None:
    proven = set(SYM_STEP_PROPERTIES) | (set(ORDER_PROPERTIES) - set(ORDER_LEMMAS))
    assert proven | set(NOT_ENCODED_STEPS) == set(STEP_PROPERTIES)
    assert not set(SYM_STEP_PROPERTIES) & set(NOT_ENCODED_STEPS)
    assert set(SYM_STEP_PROPERTIES) == set(SYM_STEP_DOCS)


def test_every_model_action_is_covered_by_steps() -> None:
    assert set(T.COVERS) == set(ACTIONS) | set(CALLER_ACTIONS)
    assert {s for steps in T.COVERS.values() for s in steps} == set(T.STEPS)


# --------------------------------------------------------------------------
# The proofs.


def test_every_step_preserves_every_invariant() -> None:
    results = matrix()
    bad = {(s, n): r.status for s, row in results.items() for n, r in row.items() if not r.ok}
    assert bad == {}


@pytest.mark.parametrize("name", list(SYM_INVARIANTS))
def test_initial_state_satisfies_invariant_for_any_size(name: str) -> None:
    assert check_initial(name).status == PROVEN


@pytest.mark.parametrize("step", list(T.STEPS))
def test_precondition_is_satisfiable_under_invariants(step: str) -> None:
    assert check_enabled(step).status == PROVEN


@pytest.mark.parametrize("step", ["alloc", "cache_partial", "move"])
def test_correct_steps_have_no_counterexample_in_scope(step: str) -> None:
    """The finite search used for seeded bugs finds nothing in the real steps."""
    for name in SYM_INVARIANTS:
        assert find_counterexample(step, name).status == NONE_IN_SCOPE


def test_reset_guard_is_refuted_by_its_step_property_not_by_invariants() -> None:
    """Reset without its in-use guard still preserves every invariant; the step property
    reset_needs_an_idle_pool is what refutes it, for any pool size."""
    unguarded = T.StepSpec(lambda s: T.SymStep(z3.BoolVal(True), T.reset(s).post), (), "reset")
    assert all(check_preservation(unguarded, n).ok for n in SYM_INVARIANTS)
    assert check_step_property(unguarded, "reset_needs_an_idle_pool").status == COUNTEREXAMPLE


@pytest.mark.parametrize("prop", list(SYM_STEP_PROPERTIES))
def test_every_step_property_holds_of_every_step_it_speaks_of(prop: str) -> None:
    for step in T.STEPS:
        if applies(prop, step):
            assert check_step_property(step, prop).status == PROVEN, (prop, step)


@pytest.mark.parametrize("name", list(SYM_LEMMAS))
def test_every_lemma_follows_from_the_invariants_it_names(name: str) -> None:
    assert check_lemma(name).status == PROVEN


def test_a_lemma_does_not_follow_from_the_wrong_premises(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.model import invariants as model_invariants

    monkeypatch.setitem(model_invariants.DERIVED_FROM, "writable_blocks_are_unindexed",
                        ("ref_counts_non_negative",))
    assert check_lemma("writable_blocks_are_unindexed").status == COUNTEREXAMPLE


def test_an_unknown_is_settled_by_a_counterexample_in_scope() -> None:
    """z3 gives up on cache_partial without its write contract; a small pool refutes it."""
    def no_contract(s: SymState, *args: Any) -> T.SymStep:
        st = T.cache_partial(s, *args)
        kids = st.pre.children()
        return T.SymStep(z3.And(*kids[:-1]), st.post)

    spec = T.StepSpec(no_contract, T.STEPS["cache_partial"].args, "cache_partial")
    gave_up = Result(UNKNOWN, 1.0, "timeout")
    settled = settle(gave_up, spec, "index_entries_are_sound")
    assert settled.status == COUNTEREXAMPLE and settled.detail


def test_an_unknown_without_a_counterexample_stays_a_failure_and_says_so() -> None:
    still = settle(Result(UNKNOWN, 1.0, "timeout"), "alloc", "index_entries_are_sound")
    assert still.status == UNKNOWN and not still.ok
    assert "no counterexample with at most" in still.detail and "unproven" in still.detail


def test_prove_prints_the_small_pool_under_a_refuted_check(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: Any) -> None:
    from kvpool.bugs import BUGS

    monkeypatch.setitem(T.STEPS, "unpin", BUGS["unpin_keeps_reference"].z3)
    assert prove_main(["--timeout-ms", "5000"]) == 1
    text = capsys.readouterr().out
    refuted = text[text.index("✗ invariants preserve unpin ref_counts_equal_holders"):]
    assert "block 1: ref" in refuted and "holder(s)" in refuted


def test_cache_partial_needs_its_write_contract() -> None:
    """Without the caller contract cache_partial breaks soundness (as the model does)."""
    def no_contract(s: SymState, *args: Any) -> T.SymStep:
        st = T.cache_partial(s, *args)
        return T.SymStep(z3.And(*st.pre.children()[:-1]), st.post)

    spec = T.StepSpec(no_contract, T.STEPS["cache_partial"].args)
    assert find_counterexample(spec, "index_entries_are_sound").status == COUNTEREXAMPLE


def test_report_prints_matrix_and_writes_json(tmp_path: Any, capsys: Any) -> None:
    import json

    out = tmp_path / "proofs.json"
    assert prove_main(["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "✓" in text and "✗" not in text and "checks proven" in text
    doc = json.loads(out.read_text())
    assert doc["ok"] and set(doc["matrix"]) == set(T.STEPS)


# --------------------------------------------------------------------------
# Seeded bugs.

Z3_FORMS = [name for name, bug in BUGS.items() if bug.z3 is not None]


@pytest.mark.parametrize("bug", Z3_FORMS)
def test_seeded_bug_is_refuted(bug: str) -> None:
    assert refute_z3(bug).by, f"{bug} ({BUGS[bug].story}) is not refuted"


def test_every_invariant_and_step_property_refutes_some_seeded_bug() -> None:
    used = {name for bug in Z3_FORMS for name in refute_z3(bug).by}
    assert used == set(SYM_INVARIANTS) | set(SYM_STEP_PROPERTIES)


# --------------------------------------------------------------------------
# Agreement: on random reachable states the steps compute what the model computes.


def _on_copy(name: str) -> Any:
    """The model's operation ``name`` applied to a copy: the state before the call stays as it was
    (the model's actions update a state in place; comparing a state with the next needs both)."""
    fn = ACTIONS.get(name) or CALLER_ACTIONS[name]

    def call(s: PoolState, *args: Any) -> tuple[PoolState, Any]:
        return fn(s.copy(), *args)

    call.__name__ = name
    return call


A = SimpleNamespace(**{name.lstrip("_"): _on_copy(name) for name in (*ACTIONS, *CALLER_ACTIONS)})
"""The model's operations by name (``A.insert_block_hash`` is ``_insert_block_hash``), each on a copy."""

STATE_REFUSALS = (RefusalKind.NOT_ENOUGH_FREE_BLOCKS, RefusalKind.NOT_IN_USE, RefusalKind.HASH_CONFLICT,
                  RefusalKind.NULL_BLOCK, RefusalKind.CACHING_DISABLED)
"""Refusals that depend on the state: the step's precondition must be false there."""


def _is_key(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], bytes)


def _watcher(_b: int) -> None:
    return None


def _request(rng: random.Random, hbs: int) -> Request:
    tokens = [rng.choice((1, 2)) for _ in range(rng.randint(hbs, 4 * hbs))]
    return Request(f"r{rng.random()}", tokens, block_hasher=get_request_block_hasher(hbs))


def _call(rng: random.Random, s: PoolState) -> tuple[str, list[Any], Any, tuple[Any, ...]]:
    """A random single-block call: (step, step args as model values, model fn, model args)."""
    n, hbs = s.num_blocks, s.hash_block_size
    hashed = [i for i, p in enumerate(s.primary) if p is not None]
    b = rng.choice(hashed) if hashed and rng.random() < 0.4 else rng.randrange(n)
    g = rng.choice((0, 1))
    bs = hbs * rng.choice((1, 2))
    kind = rng.choice(["alloc", "alloc", "release", "touch", "unpin", "evict", "reset", "cache_full",
                       "cache_full", "cache_partial", "cache_partial", "move", "identity",
                       "write", "insert"])
    if kind == "alloc":
        return "alloc", [s.free.first(1)[0] if s.free else None], A.get_new_blocks, (1,)
    if kind == "release":
        return "release", [b], A.free_blocks, ([b],)
    if kind == "touch":
        return "touch", [b], A.touch, ([b],)
    if kind == "unpin":
        return "unpin", [b], A.unpin_blocks, ([b], _watcher)
    if kind == "evict":
        return "evict", [b], A.evict_blocks, ([b],)
    if kind == "reset":
        return "reset", [], A.reset_prefix_cache, ()
    if kind == "move":
        dst = rng.randrange(n)
        return "move", [b, dst], A.move_block_hashes, (b, dst)
    if kind == "identity":
        return "identity", [], A.take_events, ()
    req = _request(rng, hbs)
    if kind == "write":
        t = hbs * rng.randint(1, len(req.all_token_ids) // hbs)
        return "write", [b, content(req, t, hbs)], A.write_block, (b, req, t)
    if kind == "insert":
        t = hbs * rng.randint(1, len(req.block_hashes))
        key = (req.block_hashes[t // hbs - 1], g)
        return ("insert", [b, key, t, content(req, t, hbs)], A.insert_block_hash, (req, t, g, b, t))
    if kind == "cache_full":
        hashes = hashes_at(req, hbs, bs)
        i = rng.randrange(max(1, len(hashes)))
        ids = [rng.randrange(n) for _ in range(i)] + [b]
        if b == 0 or i >= len(hashes):
            return "identity", [], A.cache_full_blocks, (req, ids, i, i + 1, bs, g)
        t = (i + 1) * bs
        key = (hashes[i], g)
        return ("cache_full", [b, key, t, content(req, t, hbs)], A.cache_full_blocks,
                (req, ids, i, i + 1, bs, g))
    t = hbs * rng.randint(1, max(1, len(req.block_hashes)))
    rep = rng.random() < 0.3
    if b == 0 or t // hbs > len(req.block_hashes):
        return "identity", [], A.cache_partial_block, (req, b, t, g, bs, rep)
    key = (req.block_hashes[t // hbs - 1], g)
    return ("cache_partial", [b, key, t, content(req, t, hbs), rep], A.cache_partial_block,
            (req, b, t, g, bs, rep))


def _z3_args(u: Universe, step: str, args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for (_name, sort), v in zip(T.STEPS[step].args, args, strict=True):
        if sort == z3.IntSort():
            out.append(z3.IntVal(v))
        elif sort == z3.BoolSort():
            out.append(z3.BoolVal(v))
        elif isinstance(v, int):
            out.append(u.blocks[v])
        elif _is_key(v):
            out.append(u.keys[v])
        else:
            out.append(u.contents[v])
    return out


def test_steps_agree_with_model_on_random_reachable_states() -> None:
    rng = random.Random(20261130)
    seen: dict[str, int] = {}
    refused: dict[str, int] = {}
    breaches = 0
    for _walk in range(32):
        s = initial_state(rng.randint(2, 5), rng.random() < 0.85, rng.choice((1, 2)))
        for _ in range(30):
            assert violated(s) == []
            step, vals, fn, margs = _call(rng, s)
            try:
                nxt, result = fn(s, *margs)
            except ContractBroken:
                nxt, result = None, None  # a contract is a precondition of the step
                breaches += 1
            except Refusal as refusal:
                if refusal.kind not in STATE_REFUSALS:
                    continue  # an argument-shape error: abstracted away
                nxt, result = None, None
            if step == "reset" and result is False:
                nxt = None
            if step == "identity" and nxt is None:
                continue  # e.g. cache_full_blocks of NULL without caching: refused before any block
            keys = [v for v in vals if _is_key(v)]
            contents = [v for v in vals if isinstance(v, Prefix)]
            u = Universe.of([s] + ([nxt] if nxt else []), keys, contents)
            if step == "alloc" and vals[0] is None:  # nothing free: no block may be allocated
                assert nxt is None
                assert not any(compare(u, s, None, "alloc", [b]).enabled for b in u.blocks)
                refused["alloc"] = refused.get("alloc", 0) + 1
                continue
            v = compare(u, s, nxt, step, _z3_args(u, step, vals))
            if nxt is None:
                assert not v.enabled, (step, margs)
                refused[step] = refused.get(step, 0) + 1
                continue
            assert v.enabled, (step, margs)
            assert v.agrees, (step, margs)
            seen[step] = seen.get(step, 0) + 1
            s = nxt
    print("agreement", seen, refused, "contract breaches", breaches)
    assert set(seen) == set(T.STEPS), seen
    assert {"alloc", "release", "unpin"} <= set(refused), refused


def _batch(rng: random.Random, s: PoolState) -> tuple[list[tuple[str, list[Any]]], Any, tuple[Any, ...]]:
    """A random batch call and its per-block decomposition (as in transitions' docstring)."""
    n, hbs = s.num_blocks, s.hash_block_size
    ids = [rng.randrange(n) for _ in range(rng.randint(1, 4))]
    kind = rng.choice(["alloc", "release", "touch", "unpin", "evict", "cache_full", "cache_full"])
    if kind == "alloc":
        k = rng.randint(0, min(3, len(s.free)))
        return [("alloc", [b]) for b in s.free.first(k)], A.get_new_blocks, (k,)
    if kind == "unpin":
        return [("unpin", [b]) for b in ids], A.unpin_blocks, (ids, _watcher)
    if kind in ("release", "touch", "evict"):
        fn = {"release": A.free_blocks, "touch": A.touch, "evict": A.evict_blocks}[kind]
        return [(kind, [b]) for b in ids], fn, (ids,)
    bs = hbs * rng.choice((1, 2))
    req = _request(rng, hbs)
    hashes = hashes_at(req, hbs, bs)
    nf = min(len(ids), len(hashes))
    nc = rng.randrange(nf) if nf else 0
    g = rng.choice((0, 1))
    calls = [("cache_full", [b, (hashes[i], g), (i + 1) * bs,
                             content(req, (i + 1) * bs, hbs)])
             for i, b in enumerate(ids[:nf]) if i >= nc and b != 0]
    return calls, A.cache_full_blocks, (req, ids, nc, nf, bs, g)


def test_batches_agree_with_their_per_block_decomposition() -> None:
    """A batch call equals its sequence of per-block steps, refusals included."""
    rng = random.Random(7)
    done: dict[str, int] = {}
    for _walk in range(25):
        s = initial_state(rng.randint(2, 5), rng.random() < 0.85, rng.choice((1, 2)))
        for _ in range(15):
            calls, fn, margs = _batch(rng, s)
            try:
                nxt = fn(s, *margs)[0]
            except ContractBroken as broken:
                if broken.contract == "cached_once_per_call":
                    continue  # a contract on the whole batch: no per-block step sees it
                nxt = None
            except Refusal as refusal:
                if refusal.kind not in STATE_REFUSALS:
                    continue
                nxt = None
            if fn is A.cache_full_blocks and not calls:
                continue
            vals = [v for _step, args in calls for v in args]
            u = Universe.of([s] + ([nxt] if nxt else []),
                            [v for v in vals if _is_key(v)],
                            [v for v in vals if isinstance(v, Prefix)])
            z = [(step, _z3_args(u, step, args)) for step, args in calls]
            v = compare_batch(u, s, nxt, z)
            assert v.enabled == (nxt is not None), (fn.__name__, margs)
            assert v.agrees, (fn.__name__, margs)
            if nxt is not None:
                done[fn.__name__] = done.get(fn.__name__, 0) + 1
                s = nxt
    print("batches", done)
    assert len(done) == 6, done


# --------------------------------------------------------------------------
# The eviction order (proofs/order.py): proofs, seeded bugs, agreement with the model.


def test_every_queue_step_preserves_the_order_properties() -> None:
    assert order.check_order_initial().status == PROVEN
    bad = {(s, p): r.status for s, row in order.order_matrix().items() for p, r in row.items() if not r.ok}
    assert bad == {}
    enabled = {s: order.check_order_enabled(s).status for s in order.QSTEPS}
    assert enabled == dict.fromkeys(order.QSTEPS, PROVEN)


def test_every_order_bug_is_refuted_and_every_order_property_refutes_one() -> None:
    used: set[str] = set()
    for bug in (name for name, b in BUGS.items() if b.queue is not None):
        found = set(refute_queue(bug).by)
        assert found, f"{bug} ({BUGS[bug].story}) is not refuted"
        used |= found
    assert used == set(order.ORDER_PROPERTIES)


def _queue_call(rng: random.Random, s: PoolState) -> tuple[Any, tuple[Any, ...], list[tuple[str, list[Any]]]]:
    """A random call and its queue-step decomposition (as in proofs/order.py's QSTEPS)."""
    n = s.num_blocks
    used = [b for b in range(n) if s.ref[b] > 0] or [0]
    ids = [rng.choice(used) if rng.random() < 0.7 else rng.randrange(n) for _ in range(rng.randint(1, 3))]
    kind = rng.choice(["alloc", "alloc", "free", "free", "unpin", "unpin", "touch", "cache", "evict",
                       "reset"])
    if kind == "alloc":
        k = rng.randint(0, len(s.free))
        return A.get_new_blocks, (k,), [("alloc", [b]) for b in s.free.first(k)]
    if kind == "free":
        return A.free_blocks, (ids,), [("open_batch", [len(ids)])] + [("release", [b]) for b in ids]
    if kind == "unpin":
        ids = [b for b in ids if b != 0] or [rng.randrange(n)]
        return A.unpin_blocks, (ids, _watcher), [("unpin", [b]) for b in ids]
    if kind == "touch":
        return A.touch, (ids,), [("touch", [b]) for b in ids]
    if kind == "reset":
        return A.reset_prefix_cache, (), [("uncache_all", [])]
    if kind == "evict":
        return A.evict_blocks, (ids,), [("recache", [b, False]) for b in ids]
    hbs = s.hash_block_size
    req = _request(rng, hbs)
    nf = min(len(ids), len(req.block_hashes))
    return (A.cache_full_blocks, (req, ids, 0, nf, hbs, 0),
            [("recache", [b, s.caching]) for b in ids[:nf] if b != 0])


def test_queue_steps_agree_with_model_order() -> None:
    """On random reachable states the queue steps compute the model's queue, in order."""
    rng = random.Random(41)
    done: dict[str, int] = {}
    for _walk in range(20):
        s = initial_state(rng.randint(2, 5), rng.random() < 0.85, 1)
        for _ in range(12):
            fn, margs, calls = _queue_call(rng, s)
            try:
                nxt, result = fn(s, *margs)
            except ContractBroken:
                continue  # outside the specification: the order proofs assume the contracts
            except Refusal as refusal:
                if refusal.kind not in STATE_REFUSALS:
                    continue
                nxt, result = None, None
            if fn is A.reset_prefix_cache and result is False:
                nxt = None
            if fn is A.cache_full_blocks and nxt is None:
                continue  # refused for reasons of hashes (conflict, no caching): not the queue's
            enabled, agrees = order.compare_queue(s, nxt, calls)
            assert enabled == (nxt is not None), (fn.__name__, margs, s.free)
            assert agrees, (fn.__name__, margs, s.free, nxt.free if nxt else None)
            if nxt is not None:
                done[fn.__name__] = done.get(fn.__name__, 0) + 1
                if fn is A.free_blocks and tuple(nxt.free)[-1:] != tuple(s.free)[-1:]:
                    done["free_blocks to the tail"] = done.get("free_blocks to the tail", 0) + 1
                s = nxt
    print("queue agreement", done)
    assert len(done) == 8 and min(done.values()) >= 5, done


def test_queue_agreement_catches_a_step_in_the_wrong_place(monkeypatch: Any) -> None:
    """The agreement check has teeth: a release step that frees cached blocks to the head
    disagrees with the model on a cached block's free."""
    r = Request("r", [1, 2], block_hasher=get_request_block_hasher(1))
    s = initial_state(4, True, 1)
    s, _ = A.get_new_blocks(s, 1)
    s, _ = A.cache_full_blocks(s, r, [1], 0, 1, 1, 0)
    nxt, _ = A.free_blocks(s, [1])
    calls: list[tuple[str, list[Any]]] = [("open_batch", [1]), ("release", [1])]
    assert nxt.free == (2, 3, 1) and order.compare_queue(s, nxt, calls) == (True, True)
    _name, bug, sorts = BUGS["free_hashed_to_head"].queue
    monkeypatch.setitem(order.QSTEPS, "release", (bug, sorts))
    assert order.compare_queue(s, nxt, calls) == (True, False)
