"""kvpool.proofs: z3 proves every model operation preserves every invariant, for any pool size.

Modules, one job each:

* :mod:`.symbolic` — the abstract state over uninterpreted sorts (unbounded pool);
* :mod:`.invariants` — the model's invariants over it, same names, plus
  ``NOT_ENCODED`` (what has no symbolic form, and why);
* :mod:`.transitions` — each model action as per-block steps (pre, post);
* :mod:`.inductive` — the (step x invariant) preservation matrix, the
  initial-state and non-vacuity checks;
* :mod:`.order` — the free queue's order (eviction order) with places, proven
  for any pool size;
* :mod:`.bmc` — bounded model checking of the executable model (``kvpool bmc``);
* :mod:`.finite` — counterexample search in a finite scope (quantifiers grounded);
* :mod:`.step_properties` — the model's step properties over one step, same names;
* :mod:`.evaluate` — the z3 terms compiled once into Python over a finite
  interpretation (checked against z3 on a sample);
* :mod:`.agreement` — the encoding against the model on every state and call
  the BMC makes on small pools (:mod:`.evaluate` does the computing);
* :mod:`.concrete` — a concrete model state as a finite z3 interpretation,
  so tests can check that the steps agree with the model's operations;
* :mod:`.prove` — every proof at once, as plain results (``kvpool prove``).

The broken steps the proofs must refute are in :mod:`kvpool.bugs`.
``z3`` is imported here and never by ``kvpool.model``.
"""
