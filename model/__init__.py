"""kvpool.model: the executable specification of vLLM's block pool.

Read it in this order: :mod:`.state` (the variables), :mod:`.events` and
:mod:`.refusals` (the values it emits and raises), :mod:`.request` (what it
reads of a request), :mod:`.contracts` (what the caller must keep),
:mod:`.actions` (one transition per operation), :mod:`.invariants` (named
predicates on a state) and :mod:`.properties` (named predicates on a call).
It imports nothing but the standard library: every value it compares a pool
against is computed here.
"""

from .actions import ACTIONS, CALLER_ACTIONS, QUERIES
from .contracts import CONTRACTS, ContractBroken
from .events import Cleared, Event, Removed, Stored
from .invariants import INVARIANTS, LEMMAS, violated
from .refusals import Refusal, RefusalKind
from .state import NULL, REFERENCES, Key, PoolState, Primary, initial_state

__all__ = ["ACTIONS", "CALLER_ACTIONS", "CONTRACTS", "INVARIANTS", "LEMMAS", "NULL", "QUERIES",
           "REFERENCES", "Cleared", "ContractBroken", "Event", "Key", "PoolState", "Primary",
           "Refusal", "RefusalKind", "Removed", "Stored", "initial_state", "violated"]
