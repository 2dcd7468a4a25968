"""kvpool.model: the executable specification of vLLM's block pool.

Read it in this order: :mod:`.state` (the variables), :mod:`.actions` (one
transition per operation) and :mod:`.invariants` (named predicates).
"""

from .actions import ACTIONS, QUERIES
from .invariants import INVARIANTS, violated
from .state import NULL, REFERENCES, PoolState, Primary, initial_state

__all__ = ["ACTIONS", "INVARIANTS", "NULL", "QUERIES", "REFERENCES", "PoolState", "Primary",
           "initial_state", "violated"]
