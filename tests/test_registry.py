"""One source of truth: every table of operations agrees with the model's declarations.

Each operation is declared once (:data:`kvpool.model.OPERATIONS`); every other
layer keeps a table derived from it or written beside it.  These tests fail
when any table lists an operation the declarations do not, or misses one, or
disagrees with a declaration on an argument, and when an operation's parts do
not fit together (a guard or an update that cannot take its declared
arguments, a domain that yields calls the declaration refuses to bind, a split
into z3 steps the declaration does not name).  They also keep the invariants
and step properties registered and documented where every layer enumerates
them.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvpool.model.contracts as model_contracts
import kvpool.model.derived as model_derived
import kvpool.model.domains as model_domains
import kvpool.model.footprints as model_footprints
import kvpool.model.guards as model_guards
import kvpool.model.invariants as invariants
import kvpool.model.pool as model_pool
import kvpool.model.properties as properties
import kvpool.model.split as model_split
from kvpool.bugs import BUGS, SHARED_CODE
from kvpool.bugs import pools as bug_pools
from kvpool.impl import BlockPool
from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.model import (
    ACTIONS,
    CALLER_ACTIONS,
    INVARIANTS,
    LEMMAS,
    OPERATIONS,
    POOL_OPERATIONS,
    PUBLIC_OPERATIONS,
    QUERIES,
    Operation,
    PoolState,
)
from kvpool.model.invariants import DERIVED_FROM
from kvpool.model.kinds import REQUIRED, ArgKind
from kvpool.model.operations import ResultKind
from kvpool.model.properties import EVENT_LOG, QUEUE_ORDER, STEP_PROPERTIES
from kvpool.oracle.core.adapter import REFERENCE_API, ReferencePool, missing_api, required_api
from kvpool.oracle.generate.defaults import WRITTEN, unwritten
from kvpool.oracle.search import refinement
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.trace import schema
from kvpool.proofs import bmc
from kvpool.proofs import transitions as T

ROOT = Path(__file__).resolve().parent.parent
ROLES = {"action": ACTIONS, "query": QUERIES, "caller": CALLER_ACTIONS}


def _public_functions(module: object) -> dict[str, Any]:
    return {
        name: fn for name, fn in inspect.getmembers(module, inspect.isfunction)
        if not name.startswith("_") and fn.__module__ == getattr(module, "__name__", None)
    }


def _takes_state(fn: Any) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return bool(params) and params[0].annotation in ("PoolState", PoolState)


# --------------------------------------------------------------------------
# The model's own tables: derived from the declarations.


def test_the_derived_tables_partition_the_declarations_by_role() -> None:
    for role, table in ROLES.items():
        assert list(table) == [n for n, op in OPERATIONS.items() if op.role == role], role
    assert not set(ACTIONS) & set(QUERIES) and not (set(ACTIONS) | set(QUERIES)) & set(CALLER_ACTIONS)
    assert set(ACTIONS) | set(QUERIES) | set(CALLER_ACTIONS) == set(OPERATIONS)
    pool_ops = tuple(n for n, op in OPERATIONS.items() if op.role != "caller")
    assert pool_ops == POOL_OPERATIONS
    assert tuple(n for n in pool_ops if not n.startswith("_")) == PUBLIC_OPERATIONS
    private = set(POOL_OPERATIONS) - set(PUBLIC_OPERATIONS)
    assert private == {"_insert_block_hash", "_maybe_evict_cached_block"}
    for name, op in OPERATIONS.items():
        assert op.name == name and op.role in ROLES, name
        # Registered under the pool's name: the update's own name, or the pool's private one for it.
        assert name.lstrip("_") == op.next.__name__ == ROLES[op.role][name].__name__, name


def test_every_update_and_guard_the_model_defines_is_declared() -> None:
    """A function of model/pool.py or model/guards.py no other function there calls is an
    operation's update or guard: one written and not declared is an operation left out."""
    for module, part in ((model_pool, "next"), (model_guards, "guard")):
        functions = {n: f for n, f in _public_functions(module).items() if _takes_state(f)}
        called = {name for f in functions.values() for name in f.__code__.co_names}
        declared = {getattr(op, part) for op in OPERATIONS.values()}
        roots = {n for n, f in functions.items() if n not in called}
        assert {n for n in roots if functions[n] not in declared} == set(), module.__name__
        homes = (module.__name__, model_derived.__name__)  # written there, or (a guard) derived
        assert all(fn.__module__ in homes for fn in declared), module.__name__


def test_each_part_of_a_declaration_lives_in_its_module() -> None:
    """Written in its module, or derived from the arguments' kinds (model/derived.py)."""
    modules = {"guard": model_guards, "requires": model_contracts, "next": model_pool,
               "footprint": model_footprints, "split": model_split, "domain": model_domains}
    for name, op in OPERATIONS.items():
        for part, module in modules.items():
            assert getattr(op, part).__module__ in (module.__name__, model_derived.__name__), (name, part)


def test_every_action_has_a_docstring() -> None:
    for name, fn in {**ACTIONS, **QUERIES, **CALLER_ACTIONS}.items():
        assert inspect.getdoc(fn), name
        assert OPERATIONS[name].doc, name


# --------------------------------------------------------------------------
# Every part of a declaration takes the declared arguments.


def _dummies(op: Operation) -> list[object]:
    return [object() for _ in op.args]


def _explicit(fn: Callable[..., Any], skip: int) -> tuple[list[inspect.Parameter], bool]:
    """The parameters after the first ``skip``, and whether the rest is ``*args``."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    star = any(p.kind is p.VAR_POSITIONAL for p in params)
    return [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD], star


def _fits(fn: Callable[..., Any], op: Operation, skip: int, what: str) -> None:
    """``fn(<skip leading values>, *declared args)`` binds; its named parameters are the declared
    names (all of them, or a prefix before ``*args``) with the declared defaults."""
    sig = inspect.signature(fn)
    lead = [object()] * skip
    sig.bind(*lead, *_dummies(op))  # all arguments, positionally
    required = [object()] * sum(not a.optional for a in op.args)
    sig.bind(*lead, *required)  # the defaults filled in by fn where the declaration has them
    params, star = _explicit(fn, skip)
    names = [a.name for a in op.args]
    assert [p.name for p in params] == (names[:len(params)] if star else names), (op.name, what)
    for p, a in zip(params, op.args, strict=False):
        want = inspect.Parameter.empty if a.default is REQUIRED else a.default
        assert p.default == want, (op.name, what, p.name)


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_every_part_of_a_declaration_takes_its_arguments(name: str) -> None:
    op = OPERATIONS[name]
    for part in ("guard", "requires", "next", "footprint"):
        _fits(getattr(op, part), op, 1, part)  # (state, *args)
    _fits(op.split, op, 2, "split")  # (state, result, *args)
    inspect.signature(op.domain).bind(object(), object())  # (state, scope)
    if op.queue is not None:
        _fits(op.queue, op, 1, "queue")  # (state before, *args)
    if op.pool_call is not None:
        inspect.signature(op.pool_call).bind({}, object())  # (arguments by name, translate)


def test_the_declared_kinds_are_all_known_to_the_trace_format() -> None:
    assert set(typing.get_args(ArgKind)) == set(schema.TRACE_KIND)
    assert set(typing.get_args(ResultKind)) == set(schema.TRACE_RESULT)
    assert {a.kind for op in OPERATIONS.values() for a in op.args} <= set(schema.TRACE_KIND)
    assert {op.result for op in OPERATIONS.values()} <= set(schema.TRACE_RESULT)


# --------------------------------------------------------------------------
# Domains and splits on the bounded model checker's small pools.

SMALL_POOLS = (bmc.Bounds(blocks=3), bmc.Bounds(blocks=3, hash_block_size=2))


def _small_states(cfg: bmc.Bounds) -> list[PoolState]:
    """The states the BMC keeps to depth 1, and one with a hashed block held twice."""
    states: list[PoolState] = []
    out = bmc.explore(cfg, depth=1, seconds=600, visit=lambda s: states.append(s.copy()))
    assert out.complete and out.ok
    s, _ = ACTIONS["get_new_blocks"](cfg.initial(), 2)
    s, _ = ACTIONS["cache_full_blocks"](s, cfg.requests()[0], [1, 2], 0, 1, cfg.hash_block_size, 0)
    s, _ = ACTIONS["touch"](s, [1])
    return [*states, s]


def _is_block(v: Any, s: PoolState) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < s.num_blocks


KIND_CHECKS: dict[str, Callable[[Any, PoolState], bool]] = {
    "count": lambda v, s: isinstance(v, int) and v >= 0,
    "block": _is_block,
    "blocks": lambda v, s: isinstance(v, list) and all(_is_block(b, s) for b in v),
    "block_ids": lambda v, s: isinstance(v, list) and all(_is_block(b, s) for b in v),
    "request": lambda v, s: hasattr(v, "block_hashes") and hasattr(v, "all_token_ids"),
    "watcher": lambda v, s: callable(v),
    "hash": lambda v, s: isinstance(v, bytes),
    "group": lambda v, s: isinstance(v, int) and v >= 0,
    "groups": lambda v, s: isinstance(v, list) and all(isinstance(g, int) for g in v),
    "size": lambda v, s: isinstance(v, int) and v > 0 and v % s.hash_block_size == 0,
    "tokens": lambda v, s: isinstance(v, int) and v > 0 and v % s.hash_block_size == 0,
    "tokens?": lambda v, s: v is None or (isinstance(v, int) and v > 0),
    "flag": lambda v, s: isinstance(v, bool),
    "mask?": lambda v, s: v is None or (isinstance(v, list) and all(isinstance(m, bool) for m in v)),
}


def _calls(states: list[PoolState], cfg: bmc.Bounds) -> Iterator[tuple[PoolState, str, tuple[Any, ...]]]:
    for s in states:
        for name, args in bmc.calls(s, cfg, cfg.requests()):
            yield s, name, args
        for name, args in refinement.queries(s, cfg.requests(), cfg.groups):
            yield s, name, args


@pytest.mark.parametrize("cfg", SMALL_POOLS, ids=["hbs1", "hbs2"])
def test_every_domain_yields_calls_its_declaration_binds_with_the_declared_kinds(cfg: bmc.Bounds) -> None:
    assert set(KIND_CHECKS) == set(schema.TRACE_KIND)
    seen: Counter[str] = Counter()
    for s, name, args in _calls(_small_states(cfg), cfg):
        op = OPERATIONS[name]
        bound = op.bind(args)  # a TypeError here: the domain and the declaration disagree
        assert len(args) == len(op.args), (name, args)  # the domains pass every argument
        for a, v in zip(op.args, bound, strict=True):
            assert KIND_CHECKS[a.kind](v, s), (name, a.name, a.kind, v)
        seen[name] += 1
    explored = {n for n, op in OPERATIONS.items() if op.role != "query"}
    assert set(seen) == explored | set(QUERIES), set(OPERATIONS) - set(seen)


@pytest.mark.parametrize("cfg", SMALL_POOLS, ids=["hbs1", "hbs2"])
def test_every_split_uses_only_the_steps_its_declaration_names(cfg: bmc.Bounds) -> None:
    """On every call the BMC makes from small states (and every query), accepted or refused."""
    used: dict[str, set[str]] = {name: set() for name in OPERATIONS}
    for s, name, args in _calls(_small_states(cfg), cfg):
        op = OPERATIONS[name]
        if op.role == "query":
            result = ROLES["query"][name](s.copy(), *args)
        else:
            t = bmc.apply_call(ACTIONS, s, (name, args))
            if t is None:
                continue  # a broken caller contract: no step to take
            result = t.result  # None when refused
        split = op.split(s, result, *op.bind(args))
        names = {step for step, _args in split.steps} | ({split.exhaust} if split.exhaust else set())
        assert names and names <= set(op.steps), (name, args, names, op.steps)
        assert all(len(a) == len(T.STEPS[step].args) for step, a in split.steps), (name, split)
        used[name] |= names
    assert all(used.values()), {n for n, u in used.items() if not u}


def test_the_declared_steps_are_the_z3_steps() -> None:
    """Every step a declaration names exists, and every z3 step is some declaration's."""
    named = {step for op in OPERATIONS.values() for step in op.steps}
    assert named <= set(T.STEPS), named - set(T.STEPS)
    assert set(T.STEPS) <= named, set(T.STEPS) - named
    assert all(op.steps for op in OPERATIONS.values())


def test_covers_says_what_the_declarations_say() -> None:
    """``proofs/transitions.COVERS`` (printed by ``kvpool prove`` and in its JSON) is written by
    hand: each state-changing operation and the caller's writes, with exactly the declared steps."""
    declared = {n: op.steps for n, op in OPERATIONS.items() if op.role != "query"}
    assert declared == T.COVERS


# --------------------------------------------------------------------------
# The oracle's tables: the trace format, the reference API, the refinement's queries.


def test_the_trace_schema_has_every_pool_operation_with_its_declared_arguments() -> None:
    assert list(schema.ARG_KINDS) == list(POOL_OPERATIONS)
    for name in POOL_OPERATIONS:
        op = OPERATIONS[name]
        assert schema.ARG_KINDS[name] == {a.name: schema.TRACE_KIND[a.kind] for a in op.args}, name
        assert list(schema.ARG_KINDS[name]) == [a.name for a in op.args], name
    optional = {(n, a.name) for n in POOL_OPERATIONS for a in OPERATIONS[n].args if a.optional}
    assert optional == schema.OPTIONAL_ARGS
    results = {n: schema.TRACE_RESULT[OPERATIONS[n].result] for n in POOL_OPERATIONS
               if OPERATIONS[n].result != "none"}
    assert results == schema.RESULT_KINDS
    assert all(schema.TRACE_RESULT[OPERATIONS[n].result] is None for n in set(POOL_OPERATIONS)
               - set(schema.RESULT_KINDS))
    assert "write_block" not in schema.ARG_KINDS  # the caller's own writes: no pool sees them


def test_the_reference_api_is_the_public_pool_operations_not_written_out() -> None:
    """The Protocol names no operation (the declarations are the API); the check reads them."""
    assert set(OPERATIONS) >= REFERENCE_API  # vLLM's API, every operation of it declared
    assert set(required_api()) == {n for n in REFERENCE_API if not n.startswith("_")}
    assert tuple(n for n in PUBLIC_OPERATIONS if n in required_api()) == required_api()  # declared order
    assert not {n for n, f in vars(ReferencePool).items() if callable(f) and not n.startswith("_")}
    assert isinstance(BlockPool(4, True, 1), ReferencePool)
    assert missing_api(BlockPool) == []


@pytest.mark.parametrize("name", PUBLIC_OPERATIONS)
def test_the_pool_takes_each_public_operation_as_declared(name: str) -> None:
    """One parameter per declared argument (vLLM's names), optional alike, with the declared defaults."""
    pool = list(inspect.signature(getattr(BlockPool, name)).parameters.values())[1:]
    op = OPERATIONS[name]
    assert op.pool_call is None  # public operations pass their arguments one for one
    assert [p.default is not inspect.Parameter.empty for p in pool] == [a.optional for a in op.args]
    assert [p.default for p in pool if p.default is not inspect.Parameter.empty] == [
        a.default for a in op.args if a.optional]


def test_a_pool_that_cannot_take_an_operation_as_declared_is_named() -> None:
    class Narrow(BlockPool):
        def touch(self) -> None:  # type: ignore[override]
            """Takes no blocks."""

    class Wide(BlockPool):
        def get_usage(self, scale: float) -> float:  # type: ignore[override]
            """Wants an argument the declaration does not have."""
            return scale

    class Lacking:
        pass

    class Required(BlockPool):
        def cache_partial_block(self, request: Any, block: Any, num_tokens: int, kv_cache_group_id: int,
                                block_size: int, replace_existing_hashes: bool) -> Any:
            """Wants the optional flag."""

    assert missing_api(Narrow) == ["touch(block_ids)"]
    assert missing_api(Wide) == ["get_usage()"]
    assert missing_api(Required) == ["cache_partial_block(request, block_id, num_tokens, kv_cache_group_id, "
                                     "block_size) without replace_existing_hashes"]
    assert missing_api(Lacking) == list(required_api())
    assert missing_api(BlockPool(4, True, 1)) == []  # an instance: its bound methods


def test_every_pool_operation_is_a_method_of_the_pool() -> None:
    methods = {n for n, _ in inspect.getmembers(BlockPool, inspect.isfunction) if not n.startswith("_")}
    assert methods == set(PUBLIC_OPERATIONS)
    assert all(callable(getattr(BlockPool, n, None)) for n in POOL_OPERATIONS)  # vLLM's private ones too
    for name in set(POOL_OPERATIONS) - set(PUBLIC_OPERATIONS):
        op = OPERATIONS[name]
        pool = list(inspect.signature(getattr(BlockPool, name)).parameters.values())[1:]
        if op.pool_call is None:
            assert len(pool) == len(op.args), name


def test_the_refinement_queries_every_query() -> None:
    cfg = SMALL_POOLS[0]
    assert {n for n, _args in refinement.queries(cfg.initial(), cfg.requests())} == set(QUERIES)


def test_every_operation_a_consumer_names_is_declared() -> None:
    """Calls written out by name in the oracle's workloads and the seeded bugs name declared
    operations (a renamed operation left behind here would never run)."""
    pattern = re.compile(r'(?:call\(|yield |_act\(|action=\()\s*"(_?[a-z][a-z_]+)"')
    files = [*(ROOT / "oracle").rglob("*.py"), ROOT / "bugs" / "actions.py"]
    named = {m.group(1): f.name for f in files for m in pattern.finditer(f.read_text())}
    assert len(named) >= 12, named  # the pattern still finds the calls
    named |= {b.action[0]: "catalogue.toml" for b in BUGS.values() if b.action is not None}
    assert {n: f for n, f in named.items() if n not in OPERATIONS} == {}


# --------------------------------------------------------------------------
# The seeded bugs and the fuzzer.


def test_the_seeded_pool_mutants_wrap_every_pool_operation() -> None:
    """A mutant of shared code is active in every operation, the private ones vLLM's engine calls
    included (``_maybe_evict_cached_block`` reaches the event code as ``evict_blocks`` does)."""
    assert tuple(bug_pools.OPERATIONS) == POOL_OPERATIONS
    assert SHARED_CODE
    for name in SHARED_CODE:
        form = BUGS[name].pool
        assert form is not None
        wrapped = {op for op in POOL_OPERATIONS if op in vars(form)}
        assert wrapped == set(POOL_OPERATIONS), (name, set(POOL_OPERATIONS) - wrapped)


def test_a_shared_code_mutant_is_on_along_the_private_eviction_path() -> None:
    """The drift issue 21 found: the wrong group bytes in ``BlockRemoved`` showed through
    ``evict_blocks`` but not through ``_maybe_evict_cached_block``, which the table left out."""
    r = Request("r", [1, 2], block_hasher=get_request_block_hasher(1))
    groups = {}
    for cls in (BlockPool, bug_pools.RemovedGroupFromWrongBytes):
        pool = cls(4, True, 1, enable_kv_cache_events=True)
        (block,) = pool.get_new_blocks(1)
        pool.cache_full_blocks(r, [block], 0, 1, 1, 1)
        pool.take_events()
        assert pool._maybe_evict_cached_block(block) is True
        (removed,) = pool.take_events()
        groups[cls] = removed.group_idx
    assert groups[BlockPool] == 1 and groups[bug_pools.RemovedGroupFromWrongBytes] == 1 << 24


def test_the_fuzzer_mutates_op_into_every_operation() -> None:
    spec = importlib.util.spec_from_file_location("fuzz_readers", ROOT / "fuzz" / "fuzz_readers.py")
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    ops = harness._ops()
    assert set(ops) - {"no_such_op"} == set(POOL_OPERATIONS) and "no_such_op" not in OPERATIONS


# --------------------------------------------------------------------------
# What the workloads reach, and the invariants and step properties.


def test_the_generators_name_only_declared_operations_as_written_by_hand() -> None:
    assert set(POOL_OPERATIONS) >= WRITTEN
    assert unwritten() == [n for n in POOL_OPERATIONS if n not in WRITTEN]


def test_the_workload_exercises_every_operation() -> None:
    calls: Counter[str] = Counter()
    for seed in range(6):
        calls.update(run_one(BlockPool, seed, 600).ops_seen)
    missing = set(POOL_OPERATIONS) - set(calls)
    assert not missing, f"the oracle workload never calls {sorted(missing)}"
    assert set(calls) <= set(POOL_OPERATIONS)


def test_every_invariant_is_registered_and_documented_in_one_line() -> None:
    defined = {n for n, f in _public_functions(invariants).items() if _takes_state(f)}
    assert defined - {"violated"} == set(INVARIANTS) | set(LEMMAS)
    assert not set(INVARIANTS) & set(LEMMAS)
    assert all(set(DERIVED_FROM[n]) <= set(INVARIANTS) for n in LEMMAS)
    for name, pred in {**INVARIANTS, **LEMMAS}.items():
        doc = inspect.getdoc(pred)
        assert doc and "\n" not in doc, f"{name} needs a one-line docstring"
        assert "at" in inspect.signature(pred).parameters, f"{name} cannot be asked about some blocks"


def test_every_step_property_is_registered_and_documented_in_one_line() -> None:
    # policy_queue(t) reads a transition too, but it is the eviction policy, not a property.
    defined = {n for n, f in _public_functions(properties).items()
               if list(inspect.signature(f).parameters) == ["t"]}
    assert defined - {"broken_by", "policy_queue"} == set(STEP_PROPERTIES)
    assert not set(STEP_PROPERTIES) & set(INVARIANTS)
    for name, pred in STEP_PROPERTIES.items():
        doc = inspect.getdoc(pred)
        assert doc and "\n" not in doc, f"{name} needs a one-line docstring"
    assert set(QUEUE_ORDER) | set(EVENT_LOG) <= set(STEP_PROPERTIES)


def test_every_layer_names_properties_as_the_model_does() -> None:
    """One name per property: z3's invariants and order properties, the event checker's rules."""
    from kvpool.oracle.events import online
    from kvpool.oracle.events.kinds import VIOLATIONS
    from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS
    from kvpool.proofs.order import LEMMAS, ORDER_PROPERTIES

    assert set(SYM_INVARIANTS) | set(NOT_ENCODED) == set(INVARIANTS)
    assert set(ORDER_PROPERTIES) - set(LEMMAS) <= set(STEP_PROPERTIES)
    rules = set(re.findall(r'Violation\(\s*"([\w-]+)"', inspect.getsource(online)))
    assert rules == set(VIOLATIONS), rules  # the stream's own rules are named as their model properties
    assert rules - {"parent-unknown", "hash-repeated"} == set(EVENT_LOG) & rules and len(rules) == 4, rules
