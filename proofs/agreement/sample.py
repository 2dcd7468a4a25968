"""The compiled terms against z3 itself, on a sample of states of random walks (:func:`z3_sample`)."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import ACTIONS
from kvpool.model.request import content
from kvpool.model.state import PoolState

from .. import bmc
from ..evaluate.against_z3 import cross_check
from ..evaluate.compiled import Compiled
from ..evaluate.interp import Carriers, Interp, abstract
from ..evaluate.runtime import Undetermined
from ..symbolic import Block, Content, KeySort
from ..transitions import StepSpec
from .scope import CHECKED, compile_all, domain_of
from .states import perturbations


@dataclass
class Sampled:
    """How the compiled terms fared against z3 on a sample."""

    steps: Counter[str] = field(default_factory=Counter)
    """Step instances checked, by step (precondition, and the result where it holds)."""
    enabled: int = 0
    predicates: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def checks(self) -> int:
        return sum(self.steps.values()) + sum(self.predicates.values())


def _random_args(rng: random.Random, cfg: bmc.Bounds, requests: Sequence[bmc.Request], d: Carriers,
                 spec: StepSpec) -> tuple[Any, ...]:
    """Arguments of ``spec`` from the BMC's domains (a key, its token count and its prefix agree)."""
    hbs = cfg.hash_block_size
    r = rng.choice(requests)
    t = hbs * rng.randint(1, len(r.block_hashes))
    out: list[Any] = []
    for name, sort in spec.args:
        if sort.eq(Block):
            out.append(rng.randrange(cfg.blocks))
        elif sort.eq(KeySort):
            out.append(d.key_id[(r.block_hashes[t // hbs - 1], rng.choice(cfg.groups))])
        elif sort.eq(Content):
            out.append(d.content_id[content(r, t, hbs)])
        elif name == "t":
            out.append(t)
        else:
            out.append(rng.random() < 0.5)
    return tuple(out)


def z3_sample(cfg: bmc.Bounds, n: int, seed: int = 0) -> Sampled:
    """Check the compiled steps and predicates against z3 (:func:`.evaluate.cross_check`) on ``n``
    states of random walks through the BMC's calls: on each, one step (rotating; arguments drawn
    until its precondition holds, if it can) and one predicate on the state or a perturbation."""
    start = time.perf_counter()
    rng = random.Random(seed)
    d = domain_of(cfg)
    cs = compile_all(d)
    requests = cfg.requests()
    out = Sampled()
    s = cfg.initial()
    walked = 0
    steps, preds = list(cs.specs), list(cs.predicates)
    for i in range(n):
        name = steps[i % len(steps)]
        spec, interp = cs.specs[name], abstract(d, s)
        args = _random_args(rng, cfg, requests, d, spec)
        for _ in range(20):
            if _safe_pre(cs.steps[name], interp, args):
                break
            args = _random_args(rng, cfg, requests, d, spec)
        enabled = _safe_pre(cs.steps[name], interp, args)
        out.mismatches += [f"{m} on {_show_state_short(s)}, args {args}"
                           for m in cross_check(d, s, spec, args, cs.steps[name])]
        out.steps[name] += 1
        out.enabled += enabled
        pname = preds[i % len(preds)]
        edits = list(perturbations(s, d, i)) if i % 2 else []
        label, ps = rng.choice(edits) if edits else ("as reached", s)
        out.mismatches += [f"{m} ({pname}, {label}) on {_show_state_short(ps)}"
                           for m in cross_check(d, ps, pred=CHECKED[pname],
                                                compiled_pred=cs.predicates[pname])]
        out.predicates[pname] += 1
        s, walked = _walk(rng, cfg, requests, s, walked)
    out.seconds = time.perf_counter() - start
    return out


def _safe_pre(step: Compiled, interp: Interp, args: tuple[Any, ...]) -> bool:
    try:
        return step.pre(interp, *args)
    except Undetermined:
        return False


def _walk(rng: random.Random, cfg: bmc.Bounds, requests: Sequence[bmc.Request], s: PoolState,
          walked: int) -> tuple[PoolState, int]:
    """One random accepted call from ``s`` (back to the initial state every few calls)."""
    if walked >= 4:
        return cfg.initial(), 0
    calls = list(bmc.calls(s, cfg, requests))
    for call in rng.sample(calls, min(len(calls), 64)):
        step = bmc.apply_call(ACTIONS, s, call)
        if step is not None and not step.refused:
            step.after.events = []
            return step.after, walked + 1
    return cfg.initial(), 0


def _show_state_short(s: PoolState) -> str:
    return (f"ref {list(s.ref)}, free {list(s.free)}, "
            f"hashed {[b for b, p in enumerate(s.primary) if p is not None]}")
