"""The encoding's z3 terms evaluated on a finite concrete interpretation, fast.

:mod:`kvpool.proofs.concrete` asks z3 whether a step computes what the model computes:
one solver call per state.  Checking every call the BMC makes (millions) that way would
take days.  Here each z3 term is compiled ONCE, per finite :class:`~.interp.Carriers`,
into plain Python; evaluating it on a concrete state is then a function call.

Cells the model leaves undefined (``pkey``/``ptok`` of an unhashed block, ``names`` of a
key never named) are ``None``.  z3 leaves them free, so a result that DEPENDS on one is
not determined by the model state: every decision that reads one raises
:class:`~.runtime.Undetermined` instead of guessing.  A result computed without raising
is therefore the same under every value of the free cells, which is what
:func:`kvpool.proofs.concrete.compare` asks z3 (:func:`.against_z3.cross_check` checks
the two agree).

Modules: :mod:`.interp` (finite interpretations of a model state and of its queue),
:mod:`.source` (a compiled term), :mod:`.compiler` (a z3 term to Python source),
:mod:`.solutions` (quantifiers over the solutions of their body), :mod:`.runtime` (what
compiled code calls), :mod:`.compiled` (predicates, steps, claims and queue steps as
Python functions), :mod:`.against_z3` (the compiled form checked against z3 itself).
"""

from __future__ import annotations

from .against_z3 import cross_check
from .compiled import Compiled, CompiledQueue, Predicate, compile_predicate, compile_step
from .interp import Carriers, Interp, QInterp, abstract, queue_of, queue_order
from .runtime import Undetermined
from .source import Unsupported

__all__ = ["Carriers", "Compiled", "CompiledQueue", "Interp", "Predicate", "QInterp", "Undetermined",
           "Unsupported", "abstract", "compile_predicate", "compile_step", "cross_check", "queue_of",
           "queue_order"]
