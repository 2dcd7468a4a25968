"""kvpool.model: the executable specification of vLLM's block pool.

Read it in this order: :mod:`.state` (the variables), :mod:`.events` and
:mod:`.refusals` (the values it emits and raises), :mod:`.request` (what it
reads of a request), :mod:`.pool` (one action per operation: the updates),
:mod:`.guards` (when a call is refused), :mod:`.contracts` (what the caller
must keep), :mod:`.kinds` and :mod:`.derived` (what an argument is, and the parts of
an operation its kinds say), :mod:`.operations` (each operation declared once, with all its
parts), :mod:`.invariants` (named predicates on a state) and
:mod:`.properties` (named predicates on a call).  It imports nothing but the
standard library: every value it compares a pool against is computed here.
"""

from .contracts import CONTRACTS, ContractBroken
from .events import Cleared, Event, Removed, Stored
from .footprints import Footprint
from .invariants import EVERYWHERE, INVARIANTS, LEMMAS, Around, violated
from .kinds import Arg
from .operations import (
    ACTIONS,
    CALLER_ACTIONS,
    OPERATIONS,
    POOL_OPERATIONS,
    PUBLIC_OPERATIONS,
    QUERIES,
    Operation,
)
from .refusals import Refusal, RefusalKind
from .state import NULL, REFERENCES, Key, Output, PoolState, Primary, Queue, initial_state

__all__ = ["ACTIONS", "CALLER_ACTIONS", "CONTRACTS", "EVERYWHERE", "INVARIANTS", "LEMMAS", "NULL",
           "OPERATIONS", "POOL_OPERATIONS", "PUBLIC_OPERATIONS", "QUERIES", "REFERENCES", "Arg", "Around",
           "Cleared", "ContractBroken", "Event", "Footprint", "Key", "Operation", "Output", "PoolState",
           "Primary", "Queue", "Refusal", "RefusalKind", "Removed", "Stored", "initial_state", "violated"]
