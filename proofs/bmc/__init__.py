"""Bounded model checking of the executable model (``kvpool bmc``).

The inductive proofs (:mod:`kvpool.proofs.inductive`) are about an
abstraction of the model; this package checks the model itself.  From a
small concrete pool it explores *every* sequence of calls up to a depth,
breadth first, over small finite argument domains (:mod:`.domains`), one
state per class of renamed states (:mod:`.symmetry`), and after every step
checks every model invariant (:data:`kvpool.model.INVARIANTS`) and every step
property (:data:`kvpool.model.properties.STEP_PROPERTIES`): the queue order,
the event log, reuse notices, refusals that change nothing.  A refusal by a
variant that mutates before its check (as an in-place implementation would)
carries the state it left behind as ``error.state``.

Modules: :mod:`.domains` (what is explored), :mod:`.symmetry` (canonical
states), :mod:`.search` (the search), :mod:`.printing` (a violating trace);
:mod:`kvpool.bugs` holds the broken actions the search must find.
"""

from __future__ import annotations

from .domains import TOKENS, WATCHERS, Action, Bounds, Call, Request, calls, watcher_a, watcher_b
from .printing import describe, format_trace, key_labels, show_arg
from .search import Outcome, PartFigures, apply_call, explore, merge_parts
from .symmetry import canonical, orbit_key, renamings_of, state_digest, state_key

__all__ = ["TOKENS", "WATCHERS", "Action", "Bounds", "Call", "Outcome", "PartFigures", "Request",
           "apply_call", "calls", "canonical", "describe", "explore", "format_trace", "key_labels",
           "merge_parts", "orbit_key", "renamings_of", "show_arg", "state_digest", "state_key",
           "watcher_a", "watcher_b"]
