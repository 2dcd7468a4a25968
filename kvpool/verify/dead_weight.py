"""No dead weight: every invariant and step property of the model refutes some seeded bug.

A property no broken specification can break might be vacuous.  The seeded-bugs phase says
which properties caught each bug form (its ``bugs`` list); this case reads that list, so it
is computed once over the whole catalogue: at the end of a whole run's phase, and by
``kvpool merge`` over the shards' lists joined (a shard holds only its part of the
catalogue, and decides nothing about the whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .phases import Case, failure

CASE_ID = "seeded-bugs/no-dead-weight"


def dead_weight_case(bugs: Iterable[Mapping[str, Any]]) -> Case:
    """The case: each invariant and step property refutes at least one bug form caught by the
    proofs or the BMC (the lockstep names the pool's observed parts, not properties)."""
    # lazy: the model loads with the phase
    from kvpool.model import INVARIANTS
    from kvpool.model.properties import STEP_PROPERTIES

    used = {p for b in bugs if b.get("method") != "lockstep" for p in b.get("refuted_by", [])}
    dead = [n for n in (*INVARIANTS, *STEP_PROPERTIES) if n not in used]
    fail = None if not dead else failure(
        "violation", f"{len(dead)} propert{'y' if len(dead) == 1 else 'ies'} refute no seeded bug: "
        + ", ".join(dead), "a property no seeded bug breaks may be vacuous: add a bug it catches")
    return Case(CASE_ID, f"every invariant and step property ({len(INVARIANTS) + len(STEP_PROPERTIES)}) "
                "refutes some seeded bug", fail is None, 0.0, fail)


__all__ = ["CASE_ID", "dead_weight_case"]
