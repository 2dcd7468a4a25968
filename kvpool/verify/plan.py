"""A ``kvpool verify`` run: what it was asked for, and its phases in order."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.shard import WHOLE, Shard

from .budget import Budget
from .outputs import document
from .phase_agreement import run_agreement
from .phase_refinement import run_refinement
from .phases import (
    Case,
    Phase,
    Target,
    failure,
    run_bmc,
    run_conformance,
    run_lockstep,
    run_proofs,
    run_seeded_bugs,
    run_traces,
)
from .progress import Progress


@dataclass
class Settings:
    """A validated request for a run (``kvpool verify``'s command line, parsed and checked)."""

    profile: str
    budget: Budget
    targets: list[Target]
    traces: list[str]
    events: list[str]
    vllm_errors: bool
    reference: str
    misuse: bool
    skip: set[str]
    json: str | None
    junit: str | None
    report: str | None
    plain: bool
    shard: Shard = field(default_factory=Shard)
    """This run's part of the work (``--shard I/N``; :mod:`.shard`)."""
    database: str | None = None
    """Hypothesis' example database for the conformance state machine (``KVPOOL_EXAMPLE_DB``)."""


def run(cfg: Settings, progress: Progress) -> dict[str, Any]:
    """Every phase not skipped, in order; the result document."""
    started = datetime.datetime.now(datetime.UTC)
    clock = time.perf_counter()
    b, shard = cfg.budget, cfg.shard
    plan: list[tuple[str, Callable[[], Phase]]] = [
        ("proofs", lambda: run_proofs(b, progress)),
        ("agreement", lambda: run_agreement(b, progress)),
        ("seeded-bugs", lambda: run_seeded_bugs(b, progress, shard)),
        ("bmc", lambda: run_bmc(b, progress, shard)),
        ("lockstep", lambda: run_lockstep(b, progress, shard)),
        ("refinement", lambda: run_refinement(b, progress, shard=shard)),
        ("conformance", lambda: run_conformance(cfg.targets, b, cfg.misuse, cfg.reference, progress,
                                                shard, cfg.database)),
        ("traces", lambda: run_traces(cfg.traces, cfg.events, cfg.vllm_errors, progress)),
    ]
    phases = []
    for name, fn in plan:
        if name in cfg.skip or (name == "traces" and not (cfg.traces or cfg.events)):
            phases.append(Phase(name, skipped=True))  # left out, or no trace to read on any shard
            continue
        if name in WHOLE and shard.owner(name) != shard.index:
            phases.append(Phase(name, skipped=True, elsewhere=shard.owner(name)))
            continue
        try:
            phase = fn()
        except Exception as exc:  # a crash of kvpool itself is a failure, not a traceback
            phase = Phase(name, cases=[Case(f"{name}/crash", f"{name} ran to the end", False, 0.0,
                                            failure("crash", f"{type(exc).__name__}: {exc}"))])
        if not phase.skipped:
            progress.done(phase)
        phases.append(phase)
    return document(phases, cfg.profile, b, started, time.perf_counter() - clock, shard)


__all__ = ["Settings", "run"]
