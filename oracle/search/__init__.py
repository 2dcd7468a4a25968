"""The searches: generators run against a pool until the two sides differ.

:mod:`.campaign` (seeded random runs, shrunk by :mod:`.shrink`), :mod:`.machine`
(Hypothesis' state machine, its rules in the ``machine_*`` modules, its
examples kept by :mod:`.database`),
:mod:`.refinement` (every short sequence of a small pool); :mod:`.conform` runs
the two conformance phases and :mod:`.coverage` says what they reached.
"""
