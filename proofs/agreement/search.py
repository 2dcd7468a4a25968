"""The search: the BMC's states and calls, each checked (:func:`check`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kvpool.model.levels import Stop, Stopwatch, breadth_first
from kvpool.model.state import PoolState

from .. import bmc
from ..evaluate.interp import Interp, abstract
from ..invariants import SymInvariant
from ..step_properties import SymStepProperty
from ..transitions import StepSpec
from .calls import Outcome, check_call
from .report import Report, Run
from .scope import compile_all, domain_of
from .states import check_state, perturbations


def check(cfg: bmc.Bounds, depth: int, seconds: float = 3600.0, *, perturb: int = 1,
          steps: Mapping[str, StepSpec] | None = None,
          predicates: Mapping[str, SymInvariant] | None = None,
          properties: Mapping[str, SymStepProperty] | None = None,
          queue: Mapping[str, tuple[Callable[..., Any], Any]] | None = None,
          start: PoolState | None = None, first: bool = False) -> Report:
    """Check the encoding on every state the BMC keeps up to ``depth`` and every call it makes.

    The search is :func:`kvpool.proofs.bmc.explore`'s (same calls, same symmetry reduction, same
    states), without its property checks: each kept state's predicates are compared, and those of
    one in ``perturb`` of its perturbations (rotating, so that consecutive states get different
    ones; 0: none); each call from a state above the last level is compared.
    ``steps``/``predicates``/``properties``/``queue`` replace compiled terms by name (seeded
    encoding bugs); ``start`` replaces the initial state (a focused check).  Stops after
    ``seconds``, or with ``first`` at the first disagreement (``complete`` is then false).
    """
    watch = Stopwatch()
    compiled = compile_all(domain_of(cfg), steps, predicates, properties, queue)
    rep = Report(cfg.blocks, cfg.hash_block_size, depth, events=cfg.events_on)
    run = Run(compiled, rep, perturb)
    rep.invariants = {n: [0, 0] for n in compiled.predicates}
    rep.steps = {n: [0, 0] for n in compiled.steps}
    requests = cfg.requests()
    key = bmc.state_key(cfg)

    def visit(s: PoolState) -> Interp:
        rep.states += 1
        interp = abstract(compiled.domain, s)
        check_state(run, s, interp, "a state the BMC keeps")
        if perturb:
            run.turn += 1
            for j, (label, ps) in enumerate(perturbations(s, compiled.domain, run.turn)):
                if (run.turn + j) % perturb != 0:
                    continue
                rep.perturbed += 1
                rep.perturbations[re.sub(r"-?\d+", "N", label)] += 1
                check_state(run, ps, abstract(compiled.domain, ps), f"perturbed: {label}")
        return interp

    def expand(node: tuple[PoolState, Interp], _level: int) -> list[tuple[PoolState, Interp]]:
        s, interp = node
        memo: dict[tuple[Any, ...], Outcome] = {}
        nxt: list[tuple[PoolState, Interp]] = []
        for call in bmc.calls(s, cfg, requests):
            after = check_call(run, s, interp, memo, call)
            if after is not None:
                c = key(after)  # the key reads no events, notices or metrics
                if c not in seen:
                    seen.add(c)
                    after.events = []
                    nxt.append((after, visit(after)))
            if first and rep.disagreements:
                raise Stop
        return nxt

    s0 = start.copy() if start is not None else cfg.initial()
    s0.events = []
    seen = {key(s0)}
    levels = breadth_first([(s0, visit(s0))], depth, expand, over_budget=watch.past(seconds))
    rep.depth, rep.complete = levels.depth, levels.complete
    rep.seconds, rep.cpu_seconds = watch.seconds(), watch.cpu_seconds()
    return rep
