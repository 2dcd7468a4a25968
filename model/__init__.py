"""kvpool.model: the executable specification of vLLM's block pool.

Read it in this order: :mod:`.state` (the variables), :mod:`.events` and
:mod:`.refusals` (the values it emits and raises), :mod:`.request` (what it
reads of a request), :mod:`.actions` (one transition per operation) and
:mod:`.invariants` (named predicates).  It imports nothing but the standard
library: every value it compares a pool against is computed here.
"""

from .actions import ACTIONS, QUERIES
from .events import Cleared, Event, Removed, Stored
from .invariants import INVARIANTS, violated
from .refusals import Refusal, RefusalKind
from .state import NULL, REFERENCES, Key, PoolState, Primary, initial_state

__all__ = ["ACTIONS", "INVARIANTS", "NULL", "QUERIES", "REFERENCES", "Cleared", "Event", "Key",
           "PoolState", "Primary", "Refusal", "RefusalKind", "Removed", "Stored", "initial_state",
           "violated"]
