"""Does the z3 encoding compute what the model computes?  Checked exhaustively on small pools.

The proofs (:mod:`kvpool.proofs.inductive`) are about the z3 encoding; they are about
the pool only if the encoding says what :mod:`kvpool.model` says.  This package checks
that on every state the bounded model checker keeps (:mod:`kvpool.proofs.bmc`: the same
breadth-first search, the same argument domains, the same symmetry reduction) and on
every call it makes from them:

* **invariants, both ways** (:mod:`.states`): each z3 invariant and lemma, evaluated on
  the encoded state, equals the model's predicate of the same name, on the state and on
  *perturbations* of it that make the model's predicate false;
* **steps** (:mod:`.calls`): each call runs on the model and, through the per-block
  decomposition of :mod:`kvpool.proofs.transitions`, on the z3 steps, which must be
  enabled exactly when the model accepts, and yield the model's next state and events;
* **the queue and the step properties** (:mod:`.properties`): the z3 queue steps leave
  the model's queue in order, and each z3 step property equals the model's, on the call
  and on transitions altered to break one;
* **the compiled terms against z3** (:mod:`.sample`), on a sample: z3 itself is not
  called per state, the terms are compiled once into Python (:mod:`kvpool.proofs.evaluate`).

What the encoding cannot represent is said, not hidden: on *unfaithful* states
(:func:`.states.unfaithful`) the check is only that the z3 invariant is implied by the
model's; calls refused for their arguments' shape and the batch contract
``cached_once_per_call`` have no z3 counterpart and are counted as skipped.

Modules: :mod:`.scope` (a pool's domain and compiled terms), :mod:`.search` (the search,
:func:`check`), :mod:`.states`, :mod:`.calls`, :mod:`.properties`, :mod:`.sample`,
:mod:`.report` (what a run found), :mod:`.show` (a disagreement made readable).
"""

from __future__ import annotations

from .calls import differences, event_entries, plan
from .properties import Plan, queue_plan
from .report import Disagreement, Report
from .sample import Sampled, z3_sample
from .scope import (
    ARGUMENT_REFUSALS,
    BATCH_CONTRACTS,
    CHECKED,
    COMPARED_PROPERTIES,
    MODEL_PREDICATES,
    STATE_REFUSALS,
    Compiledset,
    compile_all,
    domain_of,
)
from .search import check
from .show import show_state
from .states import perturbations, unfaithful

__all__ = ["ARGUMENT_REFUSALS", "BATCH_CONTRACTS", "CHECKED", "COMPARED_PROPERTIES",
           "MODEL_PREDICATES", "STATE_REFUSALS", "Compiledset", "Disagreement", "Plan", "Report", "Sampled",
           "check", "compile_all", "differences", "domain_of", "event_entries", "perturbations", "plan",
           "queue_plan", "show_state", "unfaithful", "z3_sample"]
