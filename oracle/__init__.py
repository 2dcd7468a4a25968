"""kvpool.oracle: the model against any pool with the reference API, call by call.

Its rooms:

* :mod:`.core`: one call on the model and on a pool, compared (adapter, abstraction,
  observation, lockstep);
* :mod:`.generate`: which calls to make (workloads, directed calls, the legal corpus);
* :mod:`.search`: generators run against a pool until the two differ (campaigns, the
  state machine, bounded refinement, shrinking, coverage, the conformance phases);
* :mod:`.trace`, :mod:`.drive`, :mod:`.shadow`: the front ends for a recorded trace,
  a pool in another process, a pool inside a running engine;
* :mod:`.events`: KV-event streams as routers read them.

The files are listed in ``docs/ARCHITECTURE.md``.
"""
