"""kvpool.bugs: the one catalogue of seeded bugs, each with its forms per layer.

:mod:`.catalogue` (what each bug is), :mod:`.z3_steps`, :mod:`.actions` and
:mod:`.pools` (its form as a broken z3 step, model action and pool),
:mod:`.check` (which check must catch each form).
"""

from .catalogue import BUGS, SHARED_CODE, SeededBug, forms

__all__ = ["BUGS", "SHARED_CODE", "SeededBug", "forms"]
