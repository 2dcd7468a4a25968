"""Every seeded bug of the project: its story, and its form at each layer that can catch it.

A check that cannot fail proves nothing.  Each entry is one classic
block-pool mistake, told once, and written as it would appear in each layer:

* ``z3`` — a broken per-block step: some invariant's preservation proof must
  find a counterexample (:mod:`kvpool.proofs.inductive`);
* ``queue`` — a broken step of the free queue with places: some order
  property must find a counterexample (:mod:`kvpool.proofs.order`);
* ``action`` — a broken model action: the bounded model checker must reach a
  state that breaks an invariant or a step property (:mod:`kvpool.proofs.bmc`);
* ``pool`` — a broken pool: the lockstep against the model must diverge
  (:mod:`kvpool.oracle.search.campaign`).

The table is data (``catalogue.toml``, one entry per bug); the forms are
code, named after the bug in :mod:`.z3_steps` and :mod:`.actions` (a pool
form names its class in :mod:`.pools`).  :mod:`.check` runs each form;
``kvpool verify``'s ``seeded-bugs`` phase runs them all, and the tests
check that every invariant and every step property refutes at least one bug.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from kvpool.proofs.transitions import StepSpec

from . import actions as act
from . import pools
from . import z3_steps as z3s
from .z3_steps import queue_step, step


@dataclass(frozen=True)
class SeededBug:
    """One mistake, its story, and its form per layer (None where it has none)."""

    name: str
    story: str
    z3: StepSpec | None = None
    queue: Any = None
    """A broken queue step (:data:`kvpool.proofs.order.QSpec`)."""
    action: tuple[str, act.Action] | None = None
    """The model action replaced, and its broken form."""
    bmc: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of the BMC's default pool in which the action form shows."""
    pool: type | None = None


FIELDS = frozenset({"story", "z3", "queue", "action", "bmc", "pool"})


def _bug(name: str, entry: Mapping[str, Any]) -> SeededBug:
    """An entry of the table with its forms: each layer's is named after the bug."""
    if set(entry) - FIELDS or "story" not in entry:
        raise ValueError(f"catalogue.toml [{name}]: a story and some of {sorted(FIELDS - {'story'})}, "
                         f"not {sorted(entry)}")
    return SeededBug(
        name, entry["story"],
        z3=step(entry["z3"], getattr(z3s, name)) if "z3" in entry else None,
        queue=queue_step(entry["queue"], getattr(z3s, name), z3s.QUEUE_ARGS.get(name)) if "queue" in entry
        else None,
        action=(entry["action"], getattr(act, name)) if "action" in entry else None,
        bmc=entry.get("bmc", {}),
        pool=getattr(pools, entry["pool"]) if "pool" in entry else None)


BUGS: dict[str, SeededBug] = {name: _bug(name, entry) for name, entry in tomllib.loads(
    resources.files(__package__).joinpath("catalogue.toml").read_text(encoding="utf-8")).items()}
"""Every seeded bug, by name, in the table's order."""

SHARED_CODE = tuple(name for name, bug in BUGS.items() if getattr(bug.pool, "patches", None))
"""Mutants of the pool's event and hashing code: invisible while the model shared that code."""


def forms(bug: SeededBug) -> list[str]:
    """The layers at which ``bug`` has a form."""
    return [f for f in ("z3", "queue", "action", "pool") if getattr(bug, f) is not None]
