"""The judge of one mutant, in a fresh process: the formal side alone, cheapest check first.

``python -P judge.py JOB`` reads a pickled job (the mutated module's name and syntax tree,
the checks to run in order, the step budget) and prints one JSON line: the verdict, the
check that gave it and what it said.  The mutated module replaces the real one before
anything of kvpool is imported; nothing else changes.

The checks are those of ``kvpool verify --profile ci`` that do not run a pool: the z3
proofs, the agreement of the encoding with the model (every pool of the profile, then its
"never seen" cases), the z3 samples of the compiled terms, the BMC (every pool), the
domains' coverage of the model's branches, the refusal of misuse and the legal corpus. No
unit test, no seeded bug, no lockstep. The first concrete failure (a counterexample, a
violation, an exception on a concrete input) refutes the mutant and ends the judge. z3
answering ``unknown`` is not concrete.

**Budgets by work, not time.**  Every function and loop body of the mutated module counts a
step (:func:`spec_mutation.mutate.instrumented`); past the job's budget the judge stops with
the verdict ``timeout``, a category of its own that is never counted as refuted.  z3 gets a
resource limit per query (``rlimit``, deterministic) far above what any proof of the
unmutated specification needs.  The process's CPU and memory limits (set by the caller) are
a backstop only, and their verdicts are categories of their own too.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import pickle
import resource
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

STEP = "__spec_step__"
Z3_RLIMIT = 30_000_000
"""Per z3 query; the unmutated proofs need at most 1.2 million (measured: ``rlimit count``)."""


class StepBudget(BaseException):
    """The mutated module ran more steps than the job allows (a BaseException: nothing catches it)."""


@dataclass
class Job:
    """What the judge is given (pickled as a dict: the judge runs as a script of its own)."""

    modules: list[tuple[str, str, ast.Module]]
    """Each mutated module: its import name, its file (for tracebacks and ``__file__``) and its
    syntax tree, instrumented with the step counter."""
    checks: tuple[str, ...]
    step_budget: int
    cpu_seconds: int = 0
    """A backstop on the process (0: none)."""
    memory_bytes: int = 0


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the mutated module from its tree; every other module as usual."""

    def __init__(self, job: Job, step: Callable[[], None]) -> None:
        self.served = {name: (path, tree) for name, path, tree in job.modules}
        self.step = step

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.served:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=self.served[fullname][0])

    def exec_module(self, module: ModuleType) -> None:
        path, tree = self.served[module.__name__]
        module.__file__ = path
        module.__dict__[STEP] = self.step
        exec(compile(tree, path, "exec"), module.__dict__)


@dataclass
class Failure:
    kind: str
    """``counterexample``, ``violation`` or ``exception`` (concrete); ``unknown`` (not)."""
    message: str


def _ci() -> Any:
    from kvpool.verify.budget import PROFILES, pool_depths

    budget = PROFILES["ci"]
    return budget, pool_depths(budget.bmc_pools, budget.bmc_depth), pool_depths(
        budget.agreement_pools, budget.agreement_depth)


CASES = {"domain-branches": "coverage_case", "legal-corpus": "legal_case", "misuse-refused": "misuse_case"}
"""Checks that are a case of ``kvpool verify`` (:mod:`kvpool.verify.phases`), by the function making it."""


class Checks:
    """The formal side's checks, by name (``bmc/4-2-2``: blocks, hash block size, depth)."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def run(self, name: str) -> Failure | None:
        kind, _, pool = name.partition("/")
        if kind == "bmc":
            blocks, hbs, depth, *version = pool.split("-")
            return self.bmc(int(blocks), int(hbs), int(depth), *version)
        if kind == "agreement" and pool == "never":
            return self.never()
        if kind == "agreement":
            blocks, hbs, depth, *off = pool.split("-")
            return self.agreement(int(blocks), int(hbs), int(depth), events=not off)
        if name in CASES:
            from kvpool.verify import phases

            case = getattr(phases, CASES[name])()
            return None if case.ok else Failure("violation", case.failure["message"] if case.failure else "")
        return {"proofs": self.proofs, "evaluator": self.evaluator}[name]()

    @staticmethod
    def bmc(blocks: int, hbs: int, depth: int, version: str = "0.31") -> Failure | None:
        from kvpool.proofs import bmc

        out = bmc.explore(bmc.Bounds(blocks=blocks, hash_block_size=hbs, reference=version), depth, 3600.0)
        if out.ok:
            return None
        calls = " ; ".join(f"{t.action}({', '.join(bmc.show_arg(a) for a in t.args)})" for t in out.trace)
        return Failure("violation", f"breaks {', '.join(out.violation)} after {calls}")

    def agreement(self, blocks: int, hbs: int, depth: int, events: bool = True) -> Failure | None:
        from kvpool.proofs import bmc
        from kvpool.proofs.agreement import check

        budget, _b, _a = _ci()
        rep = check(bmc.Bounds(blocks=blocks, hash_block_size=hbs, events_on=events), depth, 3600.0,
                    perturb=budget.agreement_perturb, first=True)
        self.reports.append(rep)
        for case, found in rep.examples.items():
            return Failure("counterexample", f"{case}: {found[0].what}: {found[0].detail}")
        return None

    def never(self) -> Failure | None:
        """The phase's cases over every pool: each predicate seen false, each step accepted, each
        step property broken, some queue compared (as ``kvpool verify`` sums them)."""
        from kvpool.proofs.agreement import CHECKED, COMPARED_PROPERTIES
        from kvpool.proofs.transitions import STEPS

        def total(field: str, name: str, i: int) -> int:
            return sum(getattr(r, field).get(name, [0, 0])[i] for r in self.reports)

        lost = [f"{n} never false" for n in CHECKED if not total("invariants", n, 1)]
        lost += [f"step {n} never accepted" for n in STEPS if not total("steps", n, 0)]
        lost += [f"{n} never broken" for n in COMPARED_PROPERTIES if not total("properties", n, 1)]
        if not sum(r.queues for r in self.reports):
            lost.append("no queue compared")
        return Failure("violation", "; ".join(lost)) if lost else None

    @staticmethod
    def evaluator() -> Failure | None:
        from kvpool.proofs import bmc
        from kvpool.proofs.agreement import z3_sample

        budget, _b, pools = _ci()
        per_pool = max(1, budget.agreement_samples // max(1, len(pools)))
        for i, (blocks, hbs, _d) in enumerate(pools):
            out = z3_sample(bmc.Bounds(blocks=blocks, hash_block_size=hbs), per_pool, budget.seed + i)
            if out.mismatches:
                return Failure("counterexample", out.mismatches[0])
        return None

    @staticmethod
    def proofs() -> Failure | None:
        from kvpool.proofs.inductive import PROVEN
        from kvpool.proofs.prove import prove_all

        budget, _b, _a = _ci()
        unknown: list[str] = []

        class Refuted(Exception):
            pass

        def each(check: Any, result: Any) -> None:
            if result.status == PROVEN:
                return
            what = f"{check.part}/{check.kind}/{check.step or ''}/{check.name or ''}".rstrip("/")
            if result.status == "unknown":
                unknown.append(what)
                return
            raise Refuted(f"{what}: {result.status}")

        try:
            prove_all(budget.timeout_ms, each)
        except Refuted as found:
            return Failure("counterexample", str(found))
        return Failure("unknown", "z3 gave up on " + ", ".join(unknown)) if unknown else None


def default_checks(paths: Sequence[str]) -> tuple[str, ...]:
    """The checks a mutant of ``paths`` is judged by, cheapest first (measured on the unmutated
    specification: a pool is cheaper the shallower and the coarser its hash blocks); the BMC, the
    domains and the corpus run the model alone, so they are left out for a mutant of the z3 side
    only, which they never execute."""
    budget, bmc_pools, agreement_pools = _ci()

    def cost(p: tuple[int, int, int]) -> tuple[int, int, int]:
        return p[2], -p[1], p[0]

    bmc = [f"bmc/{b}-{h}-{d}" for b, h, d in sorted(bmc_pools, key=cost)]
    agreement = [f"agreement/{b}-{h}-{d}-off" for b, h, d in budget.agreement_events_off]
    agreement += [f"agreement/{b}-{h}-{d}" for b, h, d in sorted(agreement_pools, key=cost)]
    if all(p.startswith("proofs/") for p in paths):
        return ("proofs", "evaluator", *agreement, "agreement/never")
    others = [f"bmc/{b}-{h}-{d}-{v}" for b, h, d, v in budget.bmc_references]
    return ("misuse-refused", "legal-corpus", *bmc[:2], *others, "domain-branches", *bmc[2:], *agreement,
            "agreement/never", "proofs", "evaluator")


def judge(job: Job) -> dict[str, Any]:
    """Run the job's checks in order until one refutes the mutant."""
    steps = [0]
    budget = job.step_budget

    def step() -> None:
        steps[0] += 1
        if steps[0] > budget:
            raise StepBudget

    sys.meta_path.insert(0, _Finder(job, step))
    import z3  # type: ignore[import-untyped]

    z3.set_param("rlimit", Z3_RLIMIT)
    began = time.process_time()
    checks = Checks()
    ran: list[dict[str, Any]] = []
    undecided: Failure | None = None
    verdict: dict[str, Any] = {"verdict": "survived"}
    for name in job.checks:
        before, t = steps[0], time.process_time()
        try:
            found = checks.run(name)
        except StepBudget:
            ran.append({"check": name, "steps": steps[0] - before, "cpu": time.process_time() - t})
            verdict = {"verdict": "timeout", "check": name, "kind": "step budget",
                       "message": f"more than {budget:,} steps of the mutated module"}
            break
        except Exception as exc:  # the specification raised on a concrete input: refuted
            found = Failure("exception", "".join(traceback.format_exception_only(exc)).strip()[-500:])
        ran.append({"check": name, "steps": steps[0] - before, "cpu": round(time.process_time() - t, 3)})
        if found is None:
            continue
        if found.kind != "unknown":  # concrete
            verdict = {"verdict": "refuted", "check": name, "kind": found.kind,
                       "message": found.message[:600]}
            break
        undecided = undecided or found
    else:
        if undecided is not None:
            verdict = {"verdict": "undecided", "kind": undecided.kind, "message": undecided.message[:600]}
    return {**verdict, "steps": steps[0], "cpu": round(time.process_time() - began, 3), "checks": ran}


def main(argv: list[str]) -> int:
    with open(argv[1], "rb") as f:
        job = Job(**pickle.load(f))
    if job.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (job.cpu_seconds, job.cpu_seconds + 5))
    if job.memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (job.memory_bytes, job.memory_bytes))
    try:
        out = judge(job)
    except MemoryError:
        out = {"verdict": "backstop", "message": "past the memory backstop"}
    except StepBudget:  # raised while importing the mutated module
        out = {"verdict": "timeout", "kind": "step budget", "message": "while importing"}
    except Exception as exc:  # the mutated module does not import: refuted at once
        out = {"verdict": "refuted", "check": "import", "kind": "exception",
               "message": "".join(traceback.format_exception_only(exc)).strip()[-500:]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
