"""The ``agreement`` phase of ``kvpool verify``: the z3 encoding computes what the model computes.

On every state the BMC keeps (to the profile's depth, on each pool) each z3
invariant and lemma must equal the model's predicate of the same name, on
the state and on perturbations of it that make the model's predicate false;
on every call from those states the z3 steps must be enabled exactly when
the model accepts, and yield the model's next state and events
(:mod:`kvpool.proofs.agreement`).  One case per invariant or lemma, one per
step, and one for the compiled terms against z3 itself on a sample.  The
pools run in parallel processes, one per core.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from .budget import Budget, pool_depths
from .phases import Case, Phase, cut_failure, failure, in_order
from .progress import Progress

if TYPE_CHECKING:  # the proofs (and z3) are imported when the phase runs
    from kvpool.proofs.agreement import Disagreement, Report, Sampled


def _one_pool(blocks: int, hbs: int, depth: int, seconds: float, perturb: int,
              samples: int, seed: int, events: bool = True) -> tuple[Report, Sampled]:
    """One pool's check and its z3 sample (run in a worker process)."""
    # lazy: z3 and the proofs load when the phase runs
    from kvpool.proofs import bmc
    from kvpool.proofs.agreement import check, z3_sample

    cfg = bmc.Bounds(blocks=blocks, hash_block_size=hbs, events_on=events)
    report = check(cfg, depth, seconds, perturb=perturb)
    return report, z3_sample(cfg, samples, seed)


def scope_text(budget: Budget) -> str:
    """What the phase covers under ``budget``, in one sentence (the JSON's ``scope``)."""
    pools = "; ".join([f"{b} blocks hbs {h} to depth {d}"
                       for b, h, d in pool_depths(budget.agreement_pools, budget.agreement_depth)]
                      + [f"{b} blocks hbs {h} events off to depth {d}"
                         for b, h, d in budget.agreement_events_off])
    perturbed = ("every perturbation of every state" if budget.agreement_perturb == 1
                 else f"1 in {budget.agreement_perturb} of each state's perturbations, rotating")
    per_pool = max(1, budget.agreement_samples // max(1, len(budget.agreement_pools)))
    return (f"{pools}: every state the BMC keeps to that depth (invariants and "
            f"lemmas, and {perturbed}); every call the BMC makes from the states above the last level "
            f"(its steps, its step properties both ways and the free queue as a sequence); "
            f"the compiled terms against z3 on {per_pool} sampled states per pool")


def run_agreement(budget: Budget, progress: Progress) -> Phase:
    """The encoding against the model on every state and call of the small pools."""
    # lazy: z3 and the proofs load when the phase runs
    from kvpool.proofs.agreement import CHECKED, COMPARED_PROPERTIES
    from kvpool.proofs.transitions import STEPS

    phase = Phase("agreement")
    progress.start("agreement", len(budget.agreement_pools) + len(budget.agreement_events_off) + len(CHECKED)
                   + len(STEPS) + len(COMPARED_PROPERTIES) + 2)
    start = time.perf_counter()
    per_pool = max(1, budget.agreement_samples // max(1, len(budget.agreement_pools)))  # as scope_text says
    pools = [(*p, True) for p in pool_depths(budget.agreement_pools, budget.agreement_depth)]
    pools += [(*p, False) for p in budget.agreement_events_off]
    jobs = [(b, h, d, budget.agreement_seconds, budget.agreement_perturb, per_pool, budget.seed + i, on)
            for i, (b, h, d, on) in enumerate(pools)]
    workers = min(len(jobs), os.cpu_count() or 1)
    results: list[tuple[Report, Sampled]] = []
    # the deepest, then the largest pool first: it bounds the wall time
    first = sorted(range(len(jobs)), key=lambda i: (-jobs[i][2], jobs[i][1]))
    for result in in_order(_one_pool, jobs, workers, first):
        results.append(result)
        progress.advance(_pool_note(result[0]))
    phase.cases = _pool_cases(results, budget) + _cases(results, progress)
    return phase.finish(start, _figures(results, budget))


def _pool_note(r: Report) -> str:
    done = "complete" if r.complete else "CUT by the time budget"
    return (f"{r.blocks} blocks, hbs {r.hash_block_size}{'' if r.events else ', events off'}: "
            f"depth {r.depth}/{r.depth_target} ({done}), "
            f"{r.states:,} states, {r.perturbed:,} perturbed, {r.transitions:,} calls, "
            f"{sum(r.disagreements.values())} disagreements, {r.seconds:.1f}s")


def _pool_cases(results: list[tuple[Report, Sampled]], budget: Budget) -> list[Case]:
    """One case per pool: its states and calls were all checked to the depth (a cut pool fails)."""
    cases = []
    for r, _s in results:
        name = f"{r.blocks} blocks, hbs {r.hash_block_size}" + ("" if r.events else ", events off")
        fail = None if r.complete else cut_failure(f"agreement on {name}", budget.agreement_seconds,
                                                   r.depth_target, r.depth, "--agreement-seconds")
        depth = "" if r.depth_target == budget.agreement_depth else f"-depth-{r.depth_target}"
        depth += "" if r.events else "-events-off"
        cases.append(Case(f"agreement/pool/{r.blocks}-blocks-hbs-{r.hash_block_size}{depth}",
                          f"the encoding is checked on {name} to depth {r.depth_target}", fail is None,
                          r.seconds, fail))
    return cases


def _cases(results: list[tuple[Report, Sampled]], progress: Progress) -> list[Case]:
    # lazy: z3 and the proofs load when the phase runs
    from kvpool.proofs.agreement import CHECKED, COMPARED_PROPERTIES
    from kvpool.proofs.transitions import STEPS

    cases = []
    seconds = sum(r.seconds for r, _ in results)
    share = seconds / (len(CHECKED) + len(STEPS) + len(COMPARED_PROPERTIES) + 1)
    # One case per invariant, step and step property: its disagreements, or the side of its counts
    # ((true, false), (accepted, refused), (held, broken)) it was never seen on, ``never`` and ``why``.
    for kind, names, counted, side, title, shown, never, why in (
            ("invariant", CHECKED, "invariants", 1, "z3's {} equals the model's", "{:,} true, {:,} false",
             "{} is never false on a checked state: its agreement is shown one way only",
             "true on {:,} states, false on none; add a perturbation that breaks it"),
            ("step", STEPS, "steps", 0, "z3 step {} computes the model's calls",
             "{:,} accepted, {:,} refused",
             "no call of step {} was accepted: its result is never compared",
             "refused {1:,} times, accepted never"),
            ("property", COMPARED_PROPERTIES, "properties", 1, "z3's step property {} equals the model's",
             "{:,} held, {:,} broken",
             "{} is never false on a compared transition: its agreement is shown one way only",
             "held on {:,} transitions, broken on none; add an alteration that breaks it")):
        for name in names:
            counts = [sum(getattr(r, counted).get(name, [0, 0])[i] for r, _ in results) for i in (0, 1)]
            bad, heading = _examples(results, f"{kind}/{name}"), title.format(name)
            fail = (_failure(bad, f"{heading}: {len(bad)} disagreement(s), first: {bad[0][1].detail}")
                    if bad else None if counts[side]
                    else failure("violation", never.format(name), why.format(*counts)))
            cases.append(Case(f"agreement/{kind}/{name}", f"{heading} ({shown.format(*counts)})",
                              fail is None, share, fail))
            progress.advance("" if fail is None else fail["message"])
    queues = sum(r.queues for r, _ in results)
    bad = [x for key in sorted({k for r, _ in results for k in r.examples if k.startswith("queue/")})
           for x in _examples(results, key)]
    fail = (_failure(bad, f"the z3 queue steps and the model's queue differ: {bad[0][1].detail}") if bad
            else None if queues else failure("violation", "no queue was compared", ""))
    cases.append(Case("agreement/queue", f"the z3 queue with places leaves the model's queue, in order, "
                      f"after every accepted call ({queues:,})", fail is None, share, fail))
    progress.advance("" if fail is None else fail["message"])
    mismatches = [m for _r, s in results for m in s.mismatches]
    checks = sum(s.checks for _r, s in results)
    zsecs = sum(s.seconds for _r, s in results)
    fail = None if not mismatches else failure(
        "counterexample", f"the compiled terms and z3 differ on {len(mismatches)} of {checks} checks",
        "\n".join(mismatches[:20]))
    cases.append(Case("agreement/evaluator", f"compiled terms equal z3's on {checks} sampled checks",
                      fail is None, zsecs, fail))
    progress.advance("" if fail is None else fail["message"])
    return cases


def _examples(results: list[tuple[Report, Sampled]], case: str) -> list[tuple[Report, Disagreement]]:
    return [(r, d) for r, _s in results for d in r.examples.get(case, [])]


def _failure(bad: list[tuple[Report, Disagreement]], message: str) -> dict[str, Any]:
    """The first disagreements: the model state (pictured), the call or perturbation, the field."""
    # lazy: z3 and the proofs load when the phase runs
    from kvpool.pictures import labeller, picture_of_state, trace_step
    from kvpool.proofs import bmc
    from kvpool.proofs.agreement import show_state

    trace, details = [], []
    for i, (r, d) in enumerate(bad, start=1):
        cfg = bmc.Bounds(blocks=r.blocks, hash_block_size=r.hash_block_size)
        labels = bmc.key_labels(cfg)
        try:
            picture: Any = picture_of_state(d.state, labeller(labels))
        except Exception:  # a perturbed state may be beyond what a picture can show
            picture = None
        trace.append(trace_step(i, d.what, d.detail, picture=picture))
        details += [f"[{r.blocks} blocks, hbs {r.hash_block_size}] {d.what}", f"  differs: {d.detail}",
                    *("  " + line for line in show_state(d.state, labels).splitlines()), ""]
    return failure("counterexample", message, "\n".join(details), trace)


def _tally(counts: list[dict[str, list[int]]], yes: str, no: str) -> dict[str, dict[str, int]]:
    """Each name's pairs of counts summed over the pools, as ``{yes: ..., no: ...}``."""
    out: dict[str, dict[str, int]] = {}
    for pool in counts:
        for name, (a, b) in pool.items():
            row = out.setdefault(name, {yes: 0, no: 0})
            row[yes] += a
            row[no] += b
    return out


def _figures(results: list[tuple[Report, Sampled]], budget: Budget) -> dict[str, Any]:
    reports, samples = [r for r, _ in results], [s for _, s in results]
    skipped: Counter[str] = Counter()
    perturbations: Counter[str] = Counter()
    for r in reports:
        skipped.update(r.skipped)
        perturbations.update(r.perturbations)
    calls, busy = sum(r.transitions for r in reports), sum(r.cpu_seconds for r in reports)
    return {
        "scope": scope_text(budget),
        "pools": [{"name": f"{r.blocks} blocks, hash_block_size {r.hash_block_size}"
                   + ("" if r.events else ", events off"),
                   "blocks": r.blocks, "hash_block_size": r.hash_block_size, "events": r.events,
                   "depth_target": r.depth_target, "depth": r.depth, "complete": r.complete,
                   "states": r.states, "perturbed": r.perturbed, "unfaithful": r.unfaithful,
                   "transitions": r.transitions, "seconds": round(r.seconds, 3),
                   "cpu_seconds": round(r.cpu_seconds, 3)} for r in reports],
        "states": sum(r.states for r in reports),
        "perturbed": sum(r.perturbed for r in reports),
        "unfaithful": sum(r.unfaithful for r in reports),
        "transitions": calls,
        "calls_per_second": round(calls / busy) if busy else 0,
        "skipped_calls": dict(sorted(skipped.items())),
        "invariants": _tally([r.invariants for r in reports], "true", "false"),
        "steps": _tally([r.steps for r in reports], "enabled", "refused"),
        "properties": _tally([r.properties for r in reports], "held", "broken"),
        "queues": sum(r.queues for r in reports),
        "perturbations": dict(sorted(perturbations.items())),
        "evaluator": {"checks": sum(s.checks for s in samples),
                      "steps_enabled": sum(s.enabled for s in samples),
                      "mismatches": sum(len(s.mismatches) for s in samples),
                      "seconds": round(sum(s.seconds for s in samples), 3)},
        "complete": all(r.complete for r in reports),
    }


__all__ = ["run_agreement", "scope_text"]
