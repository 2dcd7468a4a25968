"""The seeded-bug catalogue (kvpool.bugs): every form caught, every property refuting one.

A check that cannot fail proves nothing, so each layer's check is run on the
broken forms of the catalogue: z3 must refute each broken step, the BMC must
find each broken action, the lockstep must catch each broken pool.  And no
property is dead weight: every invariant and every step property of the
model refutes at least one bug somewhere.
"""

from __future__ import annotations

import pytest

from kvpool.bugs import BUGS, SHARED_CODE, forms
from kvpool.bugs.check import catch_with_lockstep, every_check
from kvpool.model import INVARIANTS
from kvpool.model.properties import STEP_PROPERTIES
from kvpool.proofs.order import LEMMAS, ORDER_PROPERTIES

POOL_FORMS = [name for name, bug in BUGS.items() if bug.pool is not None]


def test_every_bug_has_a_story_and_a_form() -> None:
    for name, bug in BUGS.items():
        assert bug.name == name and bug.story and forms(bug), name
    assert set(SHARED_CODE) <= set(POOL_FORMS)


@pytest.mark.parametrize("bug", POOL_FORMS)
def test_the_lockstep_catches_every_broken_pool(bug: str) -> None:
    caught = catch_with_lockstep(bug, runs=16, steps=2000)
    assert caught.by, f"{bug} ({BUGS[bug].story}): {caught.detail}"


def test_shared_code_mutants_show_in_what_a_consumer_reads() -> None:
    """The event and hashing mutants are caught in events, results or the index they change."""
    seen = {part for name in SHARED_CODE for part in catch_with_lockstep(name, runs=16).by}
    assert "pending events" in seen and ("result" in seen or "index" in seen), seen


@pytest.mark.slow  # 190 s; kvpool verify's seeded-bugs phase runs every bug in CI
def test_every_invariant_and_step_property_refutes_some_bug() -> None:
    used: set[str] = set()
    missed = []
    for name in BUGS:
        for caught in every_check(name):
            if caught.method != "lockstep":
                used |= set(caught.by)
            if not caught.by:
                missed.append(f"{name} by {caught.method}")
    assert missed == []
    assert set(INVARIANTS) - used == set()
    assert set(STEP_PROPERTIES) - used == set()
    assert used <= set(INVARIANTS) | set(STEP_PROPERTIES) | set(ORDER_PROPERTIES) | set(LEMMAS)
