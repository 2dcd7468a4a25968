"""An operation declared with little more than its update gets every other part from its arguments' kinds.

``drop_one(block_id)`` exists only here: one ``free_blocks`` listing,
declared with its update, its z3 step, one refusal beyond its kinds and its
queue policy.  Its guard, footprint, split and domain derive from the kinds;
the bounded model checker, the agreement with the z3 steps and the reference
API the oracle requires reach it with no table naming it.  A layer that keeps
a hand-written table per operation again fails here.  The derived parts are
also held to the hand-written ones wherever the kinds say enough for those.
"""

from __future__ import annotations

import io
import random
import typing
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvpool.cli.conform import main as conform_main
from kvpool.impl import BlockPool
from kvpool.model import (
    ACTIONS,
    CALLER_ACTIONS,
    OPERATIONS,
    QUERIES,
    Arg,
    Operation,
    PoolState,
    Refusal,
    derived,
    domains,
    footprints,
    guards,
    split,
)
from kvpool.model import pool as model_pool
from kvpool.model.kinds import ArgKind
from kvpool.model.properties import freed_queue
from kvpool.model.state import NULL
from kvpool.oracle.core.adapter import (
    ClassAdapter,
    kvpool_adapter,
    lacking,
    missing_api,
    optional_api,
    required_api,
)
from kvpool.oracle.core.lockstep import Divergence, Lockstep
from kvpool.oracle.drive import protocol
from kvpool.oracle.drive.serve import Server
from kvpool.oracle.generate.defaults import chooser, default_call, unwritten
from kvpool.oracle.search import refinement
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.search.machine import machine_for
from kvpool.proofs import agreement, bmc
from kvpool.proofs.bmc.branches import measure, shortfall
from kvpool.proofs.bmc.domains import scope_of


def drop_one(s: PoolState, block_id: int) -> None:
    """Drop one reference to one block (``free_blocks`` of one listing)."""
    model_pool.free_blocks(s, [block_id])


DROP_ONE = Operation("drop_one", "action", (Arg("block_id", "block"),), "none", drop_one,
                     steps=("release",), refuses=(derived.held,),
                     queue=lambda before, block_id: freed_queue(before, [block_id]))
"""Declared here alone: its update, its step, one refusal beyond its kinds, its queue policy."""

CFG = bmc.Bounds(blocks=4, groups=(0,))
SMALL = settings(max_examples=60, stateful_step_count=25, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def _held_and_cached() -> PoolState:
    """Blocks 1 and 2 held, block 1 cached; block 3 idle."""
    s, _ = ACTIONS["get_new_blocks"](CFG.initial(), 2)
    s, _ = ACTIONS["cache_full_blocks"](s, CFG.requests()[0], [1], 0, 1, 1, 0)
    return s


def _refusal(op: Operation, s: PoolState, *args: Any) -> tuple[str, str] | None:
    try:
        op.guard(s, *args)
    except Refusal as r:
        return r.kind.name, str(r)
    return None


def test_an_operation_declared_with_its_update_gets_its_guard_footprint_split_and_domain() -> None:
    s = _held_and_cached()
    assert _refusal(DROP_ONE, s, 4) == ("UNKNOWN_BLOCK", "block id 4 is not in [0, 4)")
    assert _refusal(DROP_ONE, s, 3) == ("NOT_IN_USE", "drop_one block 3: 1 release(s) but ref count 0")
    assert [_refusal(DROP_ONE, s, b) for b in (NULL, 1, 2)] == [None] * 3
    assert DROP_ONE.footprint(s, 1) == footprints.of_blocks(s, [1]) and DROP_ONE.footprint(s, 1).keys
    assert DROP_ONE.split(s, None, 2) == split.per_block("release", [2])
    assert list(DROP_ONE.domain(s, scope_of(CFG))) == [(b,) for b in range(CFG.blocks)]
    assert DROP_ONE.run(s, (1,)) is None and s.ref[1] == 0 and list(s.free)[-1] == 1  # hashed: the tail


def test_a_declaration_must_say_what_its_kinds_cannot() -> None:
    with pytest.raises(ValueError, match="refuses is for a guard derived"):
        Operation("x", "action", (), "none", drop_one, guard=guards.take_events, refuses=(derived.held,))
    with pytest.raises(ValueError, match="need a split written out"):
        Operation("x", "action", (), "none", drop_one, steps=("cache_full", "identity"))


# --------------------------------------------------------------------------
# The kinds: each argument checked by its kind, in order; a few values of every shape.

KINDS: tuple[ArgKind, ...] = typing.get_args(ArgKind)
BAD: dict[str, tuple[Any, str]] = {
    "block": (4, "UNKNOWN_BLOCK"), "blocks": ([1, -1], "UNKNOWN_BLOCK"), "block_ids": ([9], "UNKNOWN_BLOCK"),
    "count": (-1, "INVALID_ARGUMENT"), "size": (3, "INVALID_ARGUMENT"), "tokens": (0, "INVALID_ARGUMENT"),
    "tokens?": (1, "INVALID_ARGUMENT"), "group": (2**32, "INVALID_ARGUMENT"),
    "groups": ([0, -1], "INVALID_ARGUMENT"), "watcher": (None, "INVALID_ARGUMENT"),
}
"""A wrong value of each kind its check refuses (a request, a hash, a flag and a mask the update
reads, as the hand-written guards leave them)."""


def _probe(*kinds: ArgKind) -> Operation:
    args = tuple(Arg(f"{k.rstrip('?')}_{i}", k) for i, k in enumerate(kinds))
    return Operation("probe", "action", args, "none", drop_one)


WANTED_SHAPES: dict[str, frozenset[str]] = {
    "block": frozenset({"one", "null", "real"}),
    "blocks": frozenset({"1 listed", "2 listed", "null", "real"}),
    "block_ids": frozenset({"1 listed", "null", "real"}),
    "flag": frozenset({"True", "False"}),
    "mask?": frozenset({"none", "mask"}),
    "tokens?": frozenset({"none", "tokens"}),
    "group": frozenset({"group 0", "another group"}),
    "size": frozenset({"hbs", "larger"}),
    "watcher": frozenset({"watcher_a", "watcher_b"}),
    "request": frozenset({"r0", "r1", "r2"}),
}
"""Per declared argument kind, the shapes its values must have (the BMC's domains are judged by the
model's branches, :mod:`kvpool.proofs.bmc.branches`; the values a kind offers, by these)."""


def shape(kind: str, value: Any, cfg: bmc.Bounds) -> set[str]:
    """What an argument of a declared kind looks like, as labels of :data:`WANTED_SHAPES`."""
    if kind in ("block", "blocks", "block_ids"):
        ids = value if isinstance(value, list) else [value]
        return {"one" if kind == "block" else f"{len(ids)} listed", *(["null"] if 0 in ids else []),
                *(["real"] if any(b != 0 for b in ids) else [])}
    if kind == "flag":
        return {repr(value)}
    if kind in ("mask?", "tokens?"):
        return {"none" if value is None else kind[:-1]}
    if kind == "group":
        return {"group 0" if value == 0 else "another group"}
    if kind == "size":
        return {"hbs" if value == cfg.hash_block_size else "larger"}
    if kind == "watcher":
        return {value.__name__}
    if kind == "request":
        return {value.request_id}
    return {"any"}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_offers_values_its_check_accepts_of_every_shape_the_search_wants(kind: ArgKind) -> None:
    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    s, scope = cfg.initial(), scope_of(cfg)
    values = derived.values_of(kind, s, scope)
    op = _probe(kind)
    assert values and all(_refusal(op, s, v) is None for v in values), kind
    seen = set().union(*(shape(kind, v, cfg) for v in values))
    assert WANTED_SHAPES.get(kind, {"any"}) <= seen, kind
    if kind in BAD:
        value, refusal = BAD[kind]
        found = _refusal(op, s, value)
        assert found is not None and found[0] == refusal, (kind, found)
        assert refusal == "UNKNOWN_BLOCK" or op.args[0].name in found[1]  # the message names it
    assert set(BAD) | {"request", "hash", "flag", "mask?"} == set(KINDS)


def test_a_call_wrong_in_two_arguments_is_refused_for_the_first_declared() -> None:
    s = bmc.Bounds(blocks=3, hash_block_size=2).initial()
    for a, b in (("count", "block"), ("block", "count"), ("watcher", "group"), ("group", "watcher")):
        found = _refusal(_probe(a, b), s, BAD[a][0], BAD[b][0])
        assert found is not None and found[0] == BAD[a][1] and (a == "block" or f"{a}_0" in found[1]), found
    # then the declared refusals, in order, on the blocks the call names
    two = Operation("two", "action", (Arg("block_ids", "blocks"),), "none", drop_one,
                    refuses=(derived.real, derived.held))
    for listed in ([1, NULL], [NULL], [NULL, 1]):
        assert _refusal(two, s, listed) == ("NULL_BLOCK", "two cannot take the null block"), listed
    assert _refusal(two, s, [1]) == ("NOT_IN_USE", "two block 1: 1 release(s) but ref count 0")
    no_cache = bmc.Bounds(blocks=3).initial()
    no_cache.caching = False
    cached = Operation("c", "action", (), "none", drop_one, refuses=(derived.caching,))
    assert _refusal(cached, no_cache) == ("CACHING_DISABLED", "c on a pool without prefix caching")


def test_a_domain_is_every_combination_of_its_kinds_values_in_declared_order() -> None:
    s, scope = CFG.initial(), scope_of(CFG)
    op = _probe("flag", "block")
    assert list(op.domain(s, scope)) == [(f, b) for f in (False, True) for b in range(CFG.blocks)]
    assert _probe().domain is domains.no_arguments


# --------------------------------------------------------------------------
# Where the kinds say enough for a hand-written part, the derived one is the same.

SAME_GUARD = ("touch", "evict_blocks", "_maybe_evict_cached_block", "reset_prefix_cache", "take_events",
              "get_cached_block", "is_block_writable", "get_num_free_blocks", "get_usage")
SAME_SPLIT = ("touch",)
SAME_DOMAIN = ("touch", "free_blocks", "reset_prefix_cache", "take_events")
"""Every footprint the kinds can say is derived (none is written out), as are the other operations'
splits and domains: those are checked on their own (the BMC's footprint property, the agreement)."""


@pytest.mark.parametrize(("part", "names"), [("guard", SAME_GUARD), ("split", SAME_SPLIT),
                                              ("domain", SAME_DOMAIN)])
def test_the_parts_compared_with_their_derivation_are_written_out(part: str, names: tuple[str, ...]) -> None:
    # A derived part compared with its derivation would prove nothing.
    for name in names:
        assert getattr(OPERATIONS[name], part).__module__ != derived.__name__, (name, part)


def _rederived(op: Operation) -> Operation:
    """``op`` with every part its kinds can say left out (a split of several steps they cannot)."""
    return Operation(op.name, op.role, op.args, op.result, op.next, steps=op.steps,
                     **({"split": op.split} if len(op.steps) > 1 else {}))


def _calls(s: PoolState, cfg: bmc.Bounds) -> Iterator[tuple[str, tuple[Any, ...]]]:
    yield from bmc.calls(s, cfg, cfg.requests())
    yield from refinement.queries(s, cfg.requests(), cfg.groups)
    yield from refinement.misuse(s, cfg.requests())


@pytest.mark.parametrize("cfg", [bmc.Bounds(blocks=3), bmc.Bounds(blocks=3, hash_block_size=2)],
                         ids=["hbs1", "hbs2"])
def test_the_derived_parts_are_the_hand_written_ones_where_the_kinds_say_enough(cfg: bmc.Bounds) -> None:
    states: list[PoolState] = []
    assert bmc.explore(cfg, depth=1, seconds=600, visit=lambda s: states.append(s.copy())).complete
    compared = 0
    for s in [*states, _held_and_cached()] if cfg.hash_block_size == 1 else states:
        for name, args in _calls(s, cfg):
            op = OPERATIONS[name]
            derived = _rederived(op)
            bound = op.bind(args)
            refusal = _refusal(op, s, *bound)
            if name in SAME_GUARD:
                assert _refusal(derived, s, *bound) == refusal, (name, args)
            if refusal is not None or name in QUERIES:
                continue
            if name in SAME_SPLIT:
                assert derived.split(s, None, *bound) == op.split(s, None, *bound), (name, args)
            compared += 1
        scope = scope_of(cfg)
        for name in SAME_DOMAIN:
            op = OPERATIONS[name]
            assert list(_rederived(op).domain(s, scope)) == list(op.domain(s, scope)), name
    assert compared > 1000


# --------------------------------------------------------------------------
# The layers that read the declarations reach an operation no table names.


@contextmanager
def declared(*ops: Operation, only: tuple[str, ...] | None = None) -> Iterator[None]:
    """``ops`` declared (and, with ``only``, the model's other operations but those left out) for a while."""
    saved = [(table, dict(table)) for table in (OPERATIONS, ACTIONS, CALLER_ACTIONS)]
    try:
        if only is not None:
            for table, was in saved:
                table.clear()
                table.update({n: f for n, f in was.items() if n in only})
        for op in ops:
            OPERATIONS[op.name] = op
            ACTIONS[op.name] = lambda s, *a, op=op: (s, op.run(s, op.bind(a)))
        yield
    finally:
        for table, was in saved:  # in place and in order: every layer holds these very dicts
            table.clear()
            table.update(was)


def test_the_model_checker_and_the_agreement_reach_an_operation_no_table_names() -> None:
    before = list(OPERATIONS)
    with declared(DROP_ONE, only=("get_new_blocks", "cache_full_blocks", "touch")):
        assert list(OPERATIONS) == ["get_new_blocks", "touch", "cache_full_blocks", "drop_one"]
        out = bmc.explore(CFG, depth=2, seconds=600)
        assert out.ok and out.complete, out.violation
        cov = measure([CFG.initial(), _held_and_cached()], CFG, only=("drop_one",))
        assert not shortfall(cov)  # its domain reaches every branch its declared calls reach
        report = agreement.check(CFG, depth=1, start=_held_and_cached())
        assert report.ok and report.complete, dict(report.disagreements)
        enabled, refused = report.steps["release"]
        assert enabled >= 3 and refused >= 1  # drop_one's calls ran through the z3 step
    assert list(OPERATIONS) == before


def test_the_reference_api_checks_an_operation_no_table_names_where_a_pool_has_it() -> None:
    """A pool written before it is checked without it; one that has it must take its arguments."""

    class Dropping(BlockPool):
        def drop_one(self, block: Any) -> None:
            self.free_blocks([block])

    class Wrong(BlockPool):
        def drop_one(self) -> None:
            """Takes no block."""

    with declared(DROP_ONE):
        assert missing_api(BlockPool) == [] and lacking(BlockPool) == ["drop_one"]
        assert missing_api(Dropping) == [] and lacking(Dropping) == []
        assert missing_api(Wrong) == ["drop_one(block_id)"]
        assert "drop_one" in optional_api() and "drop_one" not in required_api()
        pair = run_one(BlockPool, 0, 200)  # the workload leaves it out
        assert pair.ops_seen["drop_one"] == 0 and sum(pair.ops_seen.values()) > 200
        out = io.StringIO()  # kvpool conform checks the rest and says what it left out
        assert conform_main(["--impl", "kvpool.impl:BlockPool", "--runs", "1", "--steps", "150",
                             "--examples", "30"], out=out) == 0, out.getvalue()
        assert "not called (the pool lacks them, as it may): drop_one\n" in out.getvalue()
        # a pool behind the drive protocol says it lacks it, and kvpool accepts that
        fields = protocol.pool_fields(4, True, 1, True)
        for pool, lacks in ((BlockPool, ["drop_one"]), (Dropping, None)):
            answer = Server(pool, observe=False).answer(protocol.encode(protocol.header(fields)))
            assert answer.get("unsupported") == lacks, answer
            read = protocol.read_header_answer(answer)
            assert read.unsupported == frozenset(lacks or ())
    with pytest.raises(protocol.ProtocolError, match="unsupported: expected"):
        protocol.read_header_answer({"ok": True, "unsupported": ["drop_one"]})
    assert missing_api(BlockPool) == [] and lacking(BlockPool) == []
    assert "free_blocks" in required_api() and "drop_one" not in optional_api()


class Dropping(BlockPool):
    """kvpool's pool with ``drop_one``: what an implementation adds for the operation."""

    def drop_one(self, block: Any) -> None:
        self.free_blocks([block])


class DroppingTwice(Dropping):
    """A wrong ``drop_one``: it drops two references (the default scenario must show it)."""

    def drop_one(self, block: Any) -> None:
        self.free_blocks([block, block])


def test_the_workload_calls_an_operation_no_step_names() -> None:
    """Its default scenario, from the kinds alone: legal calls, and wrong ones with misuse on."""
    before = unwritten()
    with declared(DROP_ONE):
        assert unwritten() == [*before, "drop_one"]
        for misuse in (False, True):
            calls = Counter[str]()
            refused = Counter[str]()
            for seed in range(3):
                pair = run_one(Dropping, seed, 300, misuse=misuse)
                calls.update(pair.ops_seen)
                refused.update(pair.refusals_seen)
            assert calls["drop_one"] >= 5, calls
            assert misuse or set(refused) <= {"NotEnoughFreeBlocksError"}, refused
        with pytest.raises(Divergence, match="drop_one"):
            for seed in range(3):
                run_one(DroppingTwice, seed, 300)


def test_a_default_call_reaches_each_shape_of_its_blocks_and_gives_back_what_it_took() -> None:
    """Held blocks, cached ones and the null block legally; with misuse on, an id of no block."""
    met: Counter[str] = Counter()

    class Recording(Dropping):
        def drop_one(self, block: Any) -> None:
            bid = block.block_id
            met["null" if bid == NULL else "none" if bid >= len(self.blocks) else
                "cached" if block.block_hash is not None else "plain"] += 1
            super().drop_one(block)

    cfg = bmc.Bounds(blocks=6, hash_block_size=1)
    with declared(DROP_ONE):
        for misuse in (False, True):
            met.clear()
            pair = Lockstep.fresh(Recording, cfg.blocks, True, 1, events=True)
            for seed in range(40):
                picks = random.Random(seed).choices(range(60), k=12)
                default_call(pair, "drop_one", chooser(picks), cfg.requests()[0], [1], misuse)
                assert pair.model.ref[1:] == [0] * (cfg.blocks - 1), (seed, pair.model.ref)  # given back
                pair.check()
            assert {"null", "cached", "plain"} <= set(met), met
            assert ("none" in met) == misuse, met
            assert pair.refusals_seen or not misuse  # the id of no block, refused on both sides


def test_the_state_machine_calls_an_operation_no_rule_names() -> None:
    # the rule exists only while some operation lacks one of its own: until then seeds draw as before
    assert hasattr(machine_for(kvpool_adapter()), "default_call") == bool(unwritten())
    calls: Counter[str] = Counter()

    class Counting(Dropping):
        def drop_one(self, block: Any) -> None:
            calls["drop_one"] += 1
            super().drop_one(block)

    with declared(DROP_ONE):
        machine = machine_for(ClassAdapter(Counting, "counting", supports_misuse=False))
        run_state_machine_as_test(machine, settings=SMALL)
        assert calls["drop_one"] >= 5, calls
        with pytest.raises(AssertionError, match="drop_one"):
            run_state_machine_as_test(machine_for(kvpool_adapter(DroppingTwice)),
                                      settings=settings(SMALL, database=None, phases=[Phase.generate]))
