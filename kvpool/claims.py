"""The claims table: every named property of the model, and what establishes it.

A reviewer's one page of what is known and how.  One row per property
(:data:`kvpool.model.INVARIANTS`, :data:`kvpool.model.LEMMAS` and
:data:`kvpool.model.properties.STEP_PROPERTIES`), one column per method:

* ``z3`` — proven for every step, for a pool of any size (:mod:`kvpool.proofs`);
* ``bmc`` — checked in every state of every call sequence of small pools, up to a depth
  per pool (a bound: states deeper than it are not explored);
* ``lockstep`` — checked on the model after every call of the random
  workloads while the pool's observation equals the model's;
* ``bugs`` — the seeded bugs that break it (a property no bug breaks could
  be vacuous);
* ``tests`` — the test files that name it (in a source checkout);
* ``beyond`` — what carries a verdict reached within a bound (a pool size, a depth) past
  that bound: the inductive proof for any pool size, the per-block split of a batch, the
  symmetry of the search; or that nothing does (:func:`beyond`).  What would carry the
  agreement and the BMC to larger pools (a small-model, or cutoff, argument) is stated in
  :data:`CUTOFF`, unproven.

Without a ``kvpool verify`` result the table says what each method is set
up to establish; with one (:func:`claims_table` ``doc=``) it says what that
run established: proof statuses, the depth the BMC reached on which pools,
how many calls agreed, which bugs were caught.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvpool.model import INVARIANTS, LEMMAS
from kvpool.model.invariants import DERIVED_FROM
from kvpool.model.properties import STEP_PROPERTIES
from kvpool.proofs.invariants import NOT_ENCODED, PARTIAL
from kvpool.proofs.order import LEMMAS as ORDER_LEMMAS
from kvpool.proofs.order import ORDER_PROPERTIES
from kvpool.proofs.step_properties import NOT_ENCODED_STEPS, SYM_STEP_PROPERTIES, applies
from kvpool.proofs.transitions import STEPS

Row = dict[str, Any]

BY_CONSTRUCTION: dict[str, str] = {
    "refused_call_changes_nothing": "a refused call is the identity step: no step of a refusal exists",
}
"""Step properties that hold in the z3 encoding by the way the steps are written."""


def _phase(doc: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    if doc is None:
        return None
    found = next((p for p in doc.get("phases", []) if p.get("name") == name), None)
    return None if found is None or found.get("skipped") else found


COMPLETED_BY: dict[str, str] = {
    "free_queue_holds_exactly_idle_blocks": "the eviction-order proof's queue_well_formed adds 'once'",
}
"""Invariants whose dropped conjunct another proof establishes, for any pool size."""


def _scope(name: str) -> str:
    """For which pools a z3 verdict on invariant ``name`` speaks: all of them, unless the encoding
    drops a conjunct no other proof establishes (then that conjunct only within the BMC's depth)."""
    if name in PARTIAL and name not in COMPLETED_BY:
        return (f"any pool size without one conjunct ({PARTIAL[name]}); that conjunct is checked "
                "by the BMC within its depth and by the lockstep, not for any pool size")
    notes = [n for n in (PARTIAL.get(name), COMPLETED_BY.get(name)) if n]
    return "any pool size" + (f" ({'; '.join(notes)})" if notes else "")


def _tally(cells: list[Mapping[str, Any]]) -> str:
    proven = sum(c["status"] == "proven" for c in cells)
    return f"{'proven' if proven == len(cells) else 'NOT PROVEN'}: {proven}/{len(cells)}"


def _z3_invariant(name: str, proofs: Mapping[str, Any] | None) -> str:
    if name in NOT_ENCODED:
        return f"not encoded: {NOT_ENCODED[name]}"
    if proofs is None:
        return f"every step preserves it, {_scope(name)}: {len(STEPS)} steps"
    cells = [proofs["initial"][name], *(row[name] for row in proofs["matrix"].values())]
    return f"{_tally(cells)} (initial + {len(cells) - 1} steps), {_scope(name)}"


def _z3_step_property(name: str, proofs: Mapping[str, Any] | None) -> str:
    if name in ORDER_PROPERTIES:
        order = (proofs or {}).get("order")
        if not order:
            return "the eviction-order proof: every queue step keeps it, any pool size"
        return f"{_tally([row[name] for row in order['matrix'].values()])} queue steps, any pool size"
    if name in BY_CONSTRUCTION:
        return f"by construction: {BY_CONSTRUCTION[name]}"
    if name in SYM_STEP_PROPERTIES:
        steps = [st for st in STEPS if applies(name, st)]
        if proofs is None or name not in proofs.get("properties", {}):
            return f"every step it speaks of keeps it, any pool size: {len(steps)} step(s)"
        return f"{_tally(list(proofs['properties'][name].values()))} steps, any pool size"
    return f"not stated: {NOT_ENCODED_STEPS.get(name, 'no symbolic form')}"


def _z3_lemma(name: str, proofs: Mapping[str, Any] | None) -> str:
    premises = " & ".join(DERIVED_FROM[name])
    if proofs is None or name not in proofs.get("lemmas", {}):
        return f"follows from {premises}, any pool size"
    status = proofs["lemmas"][name]["status"]
    return f"{'proven' if status == 'proven' else 'NOT PROVEN'} from {premises}, any pool size"


def _bmc(bmc_phase: Mapping[str, Any] | None, budget: Mapping[str, Any] | None) -> str:
    if bmc_phase is not None:
        runs = [f"depth {r['depth']}{'' if r['complete'] else ' (cut)'} on {r['blocks']} blocks, "
                f"hbs {r['hash_block_size']}" for r in bmc_phase.get("runs", [])]
        failed = not bmc_phase.get("ok", True)
        return ("VIOLATED; " if failed else "every state reachable within the depth: ") + "; ".join(runs)
    if budget is not None:
        pools = "; ".join(f"depth {p[2] if len(p) > 2 else budget.get('bmc_depth')} on {p[0]} blocks, "
                          f"hbs {p[1]}" for p in budget.get("bmc_pools", []))
        return f"every state reachable within the depth: {pools}"
    return "every state of small pools reachable within the profile's depths (kvpool verify)"


def _lockstep(phase: Mapping[str, Any] | None) -> str:
    if phase is None:
        return "after every call of the seeded workloads, pool and model observed equal"
    verdict = "" if phase.get("ok", True) else "DIVERGED; "
    return (f"{verdict}{phase.get('calls', 0):,} calls over {phase.get('runs', 0)} runs, "
            "checked after every call")


def _tests_naming(names: list[str]) -> dict[str, list[str]]:
    """Test files that name each property (empty outside a source checkout)."""
    root = Path(__file__).resolve().parents[1] / "tests"
    texts = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(root.glob("test_*.py"))]
    return {n: [file for file, text in texts if n in text] for n in names}


def _bugs_by_property(doc: Mapping[str, Any] | None) -> dict[str, list[str]] | None:
    seeded = _phase(doc, "seeded-bugs")
    if seeded is None:
        return None
    out: dict[str, dict[str, None]] = {}  # a dict per property: the bugs in order, once each
    for bug in seeded.get("bugs", []):
        for prop in bug.get("refuted_by", []):
            out.setdefault(prop, {})[bug["name"]] = None
    return {prop: list(bugs) for prop, bugs in out.items()}


SYMMETRY = ("within a pool size, every state the search leaves out is a renaming of one it checks "
            "(real blocks, groups and watchers are treated alike: the model, the domains and every "
            "property; tests/test_bmc.py finds the same states up to renaming without the reduction)")
"""What carries the BMC and the agreement from the states they keep to all the states they reach."""

CUTOFF = ("unproven: no small-model argument carries the agreement (the z3 steps compute the model's "
          "calls) or the BMC past the pools they explore.  One would follow from (1) each z3 step "
          "changing only the cells of the blocks and keys it names (true by construction: Store and "
          "per-block Lambdas, not proven as a lemma), (2) each model call changing only its declared "
          "footprint (changes_stay_in_footprint: checked by the BMC within its bound, not proven), and "
          "(3) each guard and contract deciding from the footprint's blocks and the free count alone "
          "(plain Python: not stated anywhere); then a disagreement on N blocks would show on the "
          "blocks a call names, the null block and the one or two blocks a property quantifies over. "
          "(3) fails as written for get_new_blocks (the queue's head) and reset_prefix_cache (every "
          "block), whose z3 steps read the whole pool too.")
"""The small-model argument for the agreement and the BMC: what it would need, and that it is not proven."""


def beyond(name: str) -> str:
    """What carries a bounded verdict on property ``name`` past the bound, or that nothing does."""
    model_side = ("; that the encoding is the model's is shown on the agreement's pools and depth only "
                  "(cutoff: unproven)")
    if name in NOT_ENCODED:
        return ("nothing: within the BMC's pools and depth and the lockstep's runs only (no z3 form: "
                f"{NOT_ENCODED[name]}); symmetry within a pool size")
    if name in INVARIANTS:
        if name in PARTIAL and name not in COMPLETED_BY:
            return (f"the inductive proof, for any pool size and any number of calls, without "
                    f"{PARTIAL[name]}, which nothing carries past the BMC's bound{model_side}")
        return ("the inductive proof: the initial state and every step, any pool size and number of "
                f"calls{model_side}")
    if name in LEMMAS:
        return f"z3 from its premises ({' & '.join(DERIVED_FROM[name])}), which carry it as they are carried"
    if name in ORDER_PROPERTIES:
        return ("the order proof on the queue with places, any pool size, every queue step; a call is a "
                "sequence of queue steps (the agreement checks the sequence leaves the model's queue, "
                f"in order, on its pools){model_side}")
    if name in SYM_STEP_PROPERTIES:
        return ("the per-step proof, any pool size, and the per-block split: a batch is a sequence of "
                f"per-block steps (kvpool.model.split), each of which keeps it{model_side}")
    if name in BY_CONSTRUCTION:
        return f"by construction of the encoding ({BY_CONSTRUCTION[name]}); the model's own form: nothing"
    return ("nothing: within the BMC's pools and depth and the lockstep's runs only "
            f"({NOT_ENCODED_STEPS.get(name, 'no symbolic form')}); symmetry within a pool size")


def claims_table(doc: Mapping[str, Any] | None = None) -> list[Row]:
    """One row per property of the model; measured columns when ``doc`` (a verify result) is given."""
    proofs = _phase(doc, "proofs")
    bmc = _bmc(_phase(doc, "bmc"), None if doc is None else doc.get("budget"))
    lockstep = _lockstep(_phase(doc, "lockstep"))
    bugs = _bugs_by_property(doc)
    names = [*INVARIANTS, *LEMMAS, *STEP_PROPERTIES]
    tests = _tests_naming(names)
    kinds: list[tuple[str, Mapping[str, Any], Callable[[str, Mapping[str, Any] | None], str]]] = [
        ("invariant", INVARIANTS, _z3_invariant), ("lemma", LEMMAS, _z3_lemma),
        ("step property", STEP_PROPERTIES, _z3_step_property)]
    return [{"property": name, "kind": kind, "doc": (inspect.getdoc(pred) or "").splitlines()[0],
             "z3": z3_of(name, proofs), "bmc": bmc, "lockstep": lockstep,
             "bugs": None if bugs is None else bugs.get(name, []),
             "tests": tests[name], "beyond": beyond(name)}
            for kind, registry, z3_of in kinds for name, pred in registry.items()]


def lemmas() -> dict[str, str]:
    """Properties the proofs establish on the way that are not properties of the model."""
    return dict(ORDER_LEMMAS)


def format_table(rows: list[Row]) -> str:
    """The table as text, one block per property (the columns are too wide for one line)."""
    out = []
    for r in rows:
        bugs = ("(run kvpool verify)" if r["bugs"] is None
                else ", ".join(r["bugs"]) or "NONE: no seeded bug breaks it")
        out += [f"{r['property']}  [{r['kind']}]", f"    {r['doc']}",
                f"    z3        {r['z3']}", f"    bmc       {r['bmc']}",
                f"    lockstep  {r['lockstep']}", f"    bugs      {bugs}",
                f"    tests     {', '.join(r['tests']) or '-'}", f"    beyond    {r['beyond']}", ""]
    out += [f"symmetry: {SYMMETRY}", f"small-model (cutoff) argument: {CUTOFF}"]
    return "\n".join(out).rstrip() + "\n"
