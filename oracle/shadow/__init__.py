"""A front end inside a running engine: every call of a real pool also runs on the model, compared.

A shadow sits beside one pool with the reference API (vLLM's own
``BlockPool``, kvpool's, another).  Each call goes to the pool first and its
result, or its exception, goes back to the caller unchanged: the engine
behaves exactly as without the shadow.  The call is then recorded as plain
data (:mod:`.record`) and checked on the model through the lockstep
(:mod:`.check`): results, refusals, the events the call queued, the reuse
watchers it fired, the whole pool and every invariant every ``full_every``
calls, and, where the checker runs beside the pool, each call's footprint.
By default the checking runs in a checker process beside the engine
(:mod:`.hub`, :mod:`.child`), so that the engine's thread only records;
``KVPOOL_SHADOW_CHECK=inline`` checks on the engine's thread.  Each call is
written to the pool's working file (:mod:`.working`): memory does not grow
with the run.

On the first divergence or broken caller contract of a pool its trace (every
call since the pool was created; the last call's line carries the pool's
observation where the checker saw it, so that ``kvpool check-trace`` names
the same call) is kept in :data:`ENV_DIR`, one line is logged, and that pool
is no longer checked; with :data:`ENV_STRICT` set to 1 (inline checking) a
:class:`ShadowDivergence` is raised from the call instead.  A failure of the
shadow itself stops the shadow, never the engine.

Two ways to put one on: :func:`shadowed_class` and :class:`ShadowPool`
(:mod:`.faces`).  Standard library, the model and the oracle only: no z3, no
Hypothesis.
"""

from __future__ import annotations

from .faces import ShadowPool, shadow_of, shadowed, shadowed_class
from .hub import finish, sync
from .record import Shadow
from .settings import (
    ENV_CHECK,
    ENV_DIR,
    ENV_FULL_EVERY,
    ENV_KEEP,
    ENV_REFERENCE,
    ENV_STRICT,
    TOTALS,
    ShadowDivergence,
    Totals,
    shadow_dir,
)

__all__ = ["ENV_CHECK", "ENV_DIR", "ENV_FULL_EVERY", "ENV_KEEP", "ENV_REFERENCE", "ENV_STRICT", "TOTALS",
           "Shadow", "ShadowDivergence", "ShadowPool", "Totals", "finish", "shadow_dir", "shadow_of",
           "shadowed", "shadowed_class", "sync"]
