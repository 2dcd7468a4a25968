"""The list of operations and invariants has one source of truth: kvpool.model.

These tests fail when an operation or invariant is added in one place and
not enumerated, documented or exercised in the others.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter

import kvpool.model.actions as actions
import kvpool.model.invariants as invariants
import kvpool.model.properties as properties
from kvpool.impl import BlockPool
from kvpool.model import ACTIONS, CALLER_ACTIONS, INVARIANTS, LEMMAS, QUERIES
from kvpool.model.invariants import DERIVED_FROM
from kvpool.model.properties import EVENT_LOG, QUEUE_ORDER, STEP_PROPERTIES
from kvpool.model.state import PoolState
from kvpool.oracle.campaign import run_one

# Methods of the pool that are not operations of the model.
NOT_OPERATIONS: set[str] = set()


def _public_functions(module: object) -> dict[str, object]:
    return {
        name: fn for name, fn in inspect.getmembers(module, inspect.isfunction)
        if not name.startswith("_") and fn.__module__ == getattr(module, "__name__", None)
    }


def _takes_state(fn: object) -> bool:
    params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    return bool(params) and params[0].annotation in ("PoolState", PoolState)


def test_every_model_action_and_query_is_registered() -> None:
    defined = {n for n, f in _public_functions(actions).items() if _takes_state(f)}
    registered = {**ACTIONS, **QUERIES, **CALLER_ACTIONS}
    assert defined == {f.__name__ for f in registered.values()}
    # Registered under the pool's name: the same name, or the pool's private one for it.
    assert all(name.lstrip("_") == f.__name__ for name, f in registered.items())
    assert not set(ACTIONS) & set(QUERIES)
    assert not (set(ACTIONS) | set(QUERIES)) & set(CALLER_ACTIONS)


def test_every_invariant_is_registered_and_documented_in_one_line() -> None:
    defined = {n for n, f in _public_functions(invariants).items() if _takes_state(f)}
    assert defined - {"violated"} == set(INVARIANTS) | set(LEMMAS)
    assert not set(INVARIANTS) & set(LEMMAS)
    assert all(set(DERIVED_FROM[n]) <= set(INVARIANTS) for n in LEMMAS)
    for name, pred in {**INVARIANTS, **LEMMAS}.items():
        doc = inspect.getdoc(pred)
        assert doc and "\n" not in doc, f"{name} needs a one-line docstring"


def test_every_public_pool_method_is_a_model_operation() -> None:
    methods = {
        n for n, _ in inspect.getmembers(BlockPool, inspect.isfunction) if not n.startswith("_")
    }
    operations = set(ACTIONS) | set(QUERIES)
    assert methods - NOT_OPERATIONS == {n for n in operations if not n.startswith("_")}
    assert all(callable(getattr(BlockPool, n, None)) for n in operations)  # vLLM's private ones too


def test_every_action_has_a_docstring() -> None:
    for name, fn in {**ACTIONS, **QUERIES}.items():
        assert inspect.getdoc(fn), name


def test_the_workload_exercises_every_operation() -> None:
    calls: Counter[str] = Counter()
    for seed in range(6):
        calls.update(step.op for step in run_one(BlockPool, seed, 600).trace)
    missing = (set(ACTIONS) | set(QUERIES)) - set(calls)
    assert not missing, f"the oracle workload never calls {sorted(missing)}"


def test_every_step_property_is_registered_and_documented_in_one_line() -> None:
    defined = {n for n, f in _public_functions(properties).items()
               if list(inspect.signature(f).parameters) == ["t"]}
    assert defined - {"broken_by"} == set(STEP_PROPERTIES)
    assert not set(STEP_PROPERTIES) & set(INVARIANTS)
    for name, pred in STEP_PROPERTIES.items():
        doc = inspect.getdoc(pred)
        assert doc and "\n" not in doc, f"{name} needs a one-line docstring"
    assert set(QUEUE_ORDER) | set(EVENT_LOG) <= set(STEP_PROPERTIES)


def test_every_layer_names_properties_as_the_model_does() -> None:
    """One name per property: z3's invariants and order properties, the event checker's rules."""
    from kvpool.oracle import events_check
    from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS
    from kvpool.proofs.order import LEMMAS, ORDER_PROPERTIES

    assert set(SYM_INVARIANTS) | set(NOT_ENCODED) == set(INVARIANTS)
    assert set(ORDER_PROPERTIES) - set(LEMMAS) <= set(STEP_PROPERTIES)
    rules = set(re.findall(r'Violation\(\s*"([\w-]+)"', inspect.getsource(events_check)))
    assert rules - {"parent-unknown"} == set(EVENT_LOG) & rules and len(rules) == 3, rules
