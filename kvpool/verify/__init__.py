"""``kvpool verify``: every check of the project in one run, for CI and reviewers.

Phases, in order: the inductive z3 proofs; the agreement of their encoding
with the model on every state and call of small pools; the seeded bugs that
show the proofs and the bounded model checker can fail; bounded model checking of the
executable model; the lockstep campaign of kvpool.impl against the model; its
bounded refinement (every call sequence of small pools, beside the model);
conformance of every ``--impl``/``--adapter`` given; and every recorded
``--trace`` / ``--events`` file.  Each phase yields *cases* (one per proof,
per seeded bug, per BMC run, per lockstep run, per refinement pool, per
conformance target, per file), which become JUnit test cases, entries of the
JSON document (``kvpool/VERIFY_SCHEMA.md``) and rows of the report.

Modules: :mod:`.budget` (profiles), :mod:`.phases` (the cases of each
phase), :mod:`.phase_agreement` (the agreement phase), :mod:`.phase_refinement`
(the refinement phase), :mod:`.plan` (a run: its settings, the phases in
order), :mod:`.outputs` (JSON, JUnit, the
summary), :mod:`.progress`, :mod:`.shard` (what shard ``I`` of ``N`` runs),
:mod:`.merge` (the shards' documents joined into one run's).  The command line is :mod:`kvpool.cli.verify`.
"""

from kvpool.shard import Shard, ShardError

from .budget import PHASES, PROFILES, SCHEMA, Budget
from .outputs import summary, write_outputs
from .phase_agreement import run_agreement
from .phase_refinement import run_refinement
from .phases import Target, run_bmc, run_conformance, run_lockstep, run_proofs, run_seeded_bugs, run_traces
from .plan import Settings, run
from .progress import Progress, make_progress

__all__ = [
    "PHASES", "PROFILES", "SCHEMA", "Budget", "Progress", "Settings", "Shard", "ShardError", "Target",
    "make_progress", "run", "run_agreement", "run_bmc", "run_conformance", "run_lockstep", "run_proofs",
    "run_refinement", "run_seeded_bugs", "run_traces", "summary", "write_outputs",
]
