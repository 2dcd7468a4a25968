"""The phases of ``kvpool verify``, each a list of cases: one per proof, per seeded bug, per
BMC run, per lockstep run, per conformance target, per trace or event file.

A case is a JUnit test case, an entry of the JSON document
(``kvpool/VERIFY_SCHEMA.md``) and a row of the report; a failing one carries
a Failure object with a picture of the pool at each step where there is one.
The project's modules are imported by the phase that needs them, so a
skipped phase costs nothing.
"""

from __future__ import annotations

import base64
import binascii
import multiprocessing
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvpool.oracle.core.adapter import Adapter
from kvpool.shard import Shard

from .budget import Budget, pool_depths
from .progress import Progress

WHOLE_RUN = Shard()
T = TypeVar("T")

if TYPE_CHECKING:  # the proofs (and z3) are imported when the proofs phase runs
    from kvpool.bugs.check import Caught
    from kvpool.proofs.prove import Check


@dataclass
class Case:
    """One checked claim: a JUnit test case."""

    id: str
    name: str
    ok: bool
    seconds: float
    failure: dict[str, Any] | None = None


@dataclass
class Phase:
    """One phase's cases and its own figures (``extra``, flattened into the JSON)."""

    name: str
    seconds: float = 0.0
    skipped: bool = False
    cases: list[Case] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    elsewhere: int | None = None
    """The shard that runs this phase whole, when it is not this one (then ``skipped`` too)."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    def finish(self, start: float, extra: dict[str, Any]) -> Phase:
        """This phase with its figures, timed from ``start`` (a ``time.perf_counter()``)."""
        self.seconds, self.extra = time.perf_counter() - start, extra
        return self

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3),
                "skipped": self.skipped, "elsewhere": self.elsewhere,
                "cases": [asdict(c) for c in self.cases], **self.extra}


def in_order(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], workers: int,
             first: Sequence[int] | None = None) -> Iterator[T]:
    """``fn(*job)`` for each job, yielded in the jobs' order: in ``workers`` spawned processes when
    more than one, submitted in ``first``'s order (the longest first bounds the wall time)."""
    if workers <= 1:
        yield from (fn(*job) for job in jobs)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {i: ex.submit(fn, *jobs[i]) for i in (range(len(jobs)) if first is None else first)}
        for i in range(len(jobs)):
            yield futures[i].result()


def failure(kind: str, message: str, details: str = "",
            trace: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Failure object of the schema."""
    return {"kind": kind, "message": message, "details": details, "trace": trace or []}


def run_proofs(budget: Budget, progress: Progress) -> Phase:
    """Initial states, preservation of every invariant by every step, non-vacuity; the eviction order."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.proofs.inductive import PROVEN, Result
    from kvpool.proofs.invariants import NOT_ENCODED
    from kvpool.proofs.order import ORDER_PROPERTIES, QSTEPS
    from kvpool.proofs.prove import check_count, prove_all
    from kvpool.proofs.transitions import COVERS

    phase = Phase("proofs")
    progress.start("proofs", check_count())

    def case(check: Check, r: Result) -> None:
        cid, title = _proof_case(check)
        ok = r.status == PROVEN
        trace: list[dict[str, Any]] = []
        if not ok and check.part in ("invariants", "properties") and check.step and check.name:
            # a concrete pool that breaks it, if a small one does
            from kvpool.proof_pictures import counterexample_steps

            trace = counterexample_steps(check.step, check.name, timeout_ms=budget.timeout_ms)
        kind = "counterexample" if trace or r.status != "unknown" else "unknown"
        gave_up = (f" (z3 gave up within --timeout-ms {budget.timeout_ms}, wall clock: {r.detail})"
                   if r.status == "unknown" else "")
        phase.cases.append(Case(cid, title, ok, r.seconds, None if ok else failure(
            kind, f"{title}: {r.status}" + (" (a counterexample in finite scope)" if trace and gave_up
                                            else gave_up),
            r.detail, trace)))
        progress.advance("" if ok else f"{title}: {r.status}")

    def figures(r: Any) -> dict[str, Any]:
        """A result's status and time; of a table of results, each one's."""
        if isinstance(r, Result):
            return {"status": r.status, "seconds": round(r.seconds, 4)}
        return {k: figures(v) for k, v in r.items()}

    start = time.perf_counter()
    proofs = prove_all(budget.timeout_ms, case)
    order = proofs.order
    return phase.finish(start, {
        "steps": list(proofs.matrix), "matrix": figures(proofs.matrix), "initial": figures(proofs.initial),
        "enabled": figures(proofs.enabled), "lemmas": figures(proofs.lemmas),
        "properties": figures(proofs.properties), "not_encoded": dict(NOT_ENCODED),
        "covers": {a: list(s) for a, s in COVERS.items()},
        "order": {  # the eviction order (proofs/order.py): the free queue as a sequence of places
            "steps": list(QSTEPS), "properties": list(ORDER_PROPERTIES), "initial": figures(order.initial),
            "matrix": figures(order.matrix), "enabled": figures(order.enabled)},
    })


def _proof_case(check: Check) -> tuple[str, str]:
    """A proof's case id and title."""
    st, name = check.step, check.name
    if check.part == "order":
        return {"initial": ("proofs/order/initial", "initial queue is well formed"),
                "preserve": (f"proofs/order/{st}/{name}", f"queue step {st} keeps {name}"),
                "enabled": (f"proofs/order/enabled/{st}", f"queue step {st} precondition satisfiable"),
                }[check.kind]
    return {"initial": (f"proofs/initial/{name}", f"initial state satisfies {name}"),
            "preserve": (f"proofs/preserve/{st}/{name}", f"{st} preserves {name}"),
            "enabled": (f"proofs/enabled/{st}", f"{st} precondition satisfiable"),
            "lemma": (f"proofs/lemma/{name}", f"{name} follows from the invariants"),
            "holds": (f"proofs/property/{st}/{name}", f"{st} keeps {name}"),
            }[check.kind]


BUG_SEARCH_SECONDS = 300.0
"""The most a seeded bug's BMC search (to depth 6) may take: a safety net, hit only when the bug
is missed (a found one stops its search; the slowest takes about 30 s on a loaded 2-core machine)."""


def _bug_checks(name: str, bmc_seconds: float, runs: int, steps: int,
                timeout_ms: int) -> list[tuple[Caught, int | None, bool]]:
    """Every form of one seeded bug against its check, in a worker process: what each caught, and
    for a BMC search the depth it reached and whether it completed (its outcome stays behind: the
    report needs only those two)."""
    # lazy: the catalogue, z3 and the BMC load in the worker that runs the bug
    from kvpool.bugs.check import every_check

    out = []
    for caught in every_check(name, bmc_seconds=bmc_seconds, runs=runs, steps=steps,
                              timeout_ms=timeout_ms):
        search = getattr(caught, "trace", None)
        out.append((caught if search is None else replace(caught, trace=None),
                    getattr(search, "depth", None) if caught.method == "bmc" else None,
                    bool(getattr(search, "complete", True))))
    return out


def run_seeded_bugs(budget: Budget, progress: Progress, shard: Shard = WHOLE_RUN,
                    workers: int | None = None) -> Phase:
    """Every form of every seeded bug is caught: the proofs, the BMC and the lockstep can fail.

    A shard takes the catalogue's bugs ``i`` with ``i mod N == I - 1``, each with all its forms.
    The bugs are checked in ``workers`` processes (default: one per core); the cases keep the
    catalogue's order.
    """
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.bugs import BUGS, forms

    phase = Phase("seeded-bugs")
    mine = {name: bug for i, (name, bug) in enumerate(BUGS.items()) if shard.takes(i)}
    progress.start("seeded-bugs", sum(len(forms(b)) for b in mine.values()))
    bugs: list[dict[str, Any]] = []
    start = time.perf_counter()
    verbs = {"inductive": ("z3 refutes", "refuted"), "order": ("z3 refutes", "refuted"),
             "bmc": ("BMC finds", "found by the BMC"), "lockstep": ("the lockstep catches",
                                                                    "caught by the lockstep")}
    bug_seconds = min(budget.bmc_seconds, BUG_SEARCH_SECONDS)
    args = (bug_seconds, max(8, budget.runs), budget.steps, budget.timeout_ms)

    workers = min(len(mine), (os.cpu_count() or 1) if workers is None else workers)
    for name, checks in zip(mine, in_order(_bug_checks, [(name, *args) for name in mine], workers),
                            strict=True):
        bug = mine[name]
        for caught, depth, complete in checks:
            found = list(caught.by)
            method = "inductive" if caught.method == "order" else caught.method
            bugs.append({"name": name, "story": bug.story, "refuted_by": found, "method": method})
            title, missed = verbs[caught.method]
            why = (f" (its search was cut by the time budget, {bug_seconds:g} s, after depth "
                   f"{depth}: a busy machine?)" if depth is not None and not complete and not found
                   else "")
            phase.cases.append(Case(
                f"seeded-bugs/{caught.method}/{name}", f"{title} {name}", bool(found), caught.seconds,
                None if found else failure("violation", f"seeded bug {name} is not {missed}{why}",
                                           f"{bug.story}\n{caught.detail}")))
            progress.advance(f"{name}: {', '.join(found) or 'NOT ' + missed}")
    if shard.whole:  # a shard holds part of the catalogue: kvpool merge decides on the whole
        from .dead_weight import dead_weight_case  # it imports this module

        phase.cases.append(dead_weight_case(bugs))
    return phase.finish(start, {"bugs": bugs})


def cut_failure(what: str, seconds: float, target: int, depth: int, flag: str) -> dict[str, Any]:
    """A search its time budget stopped before its depth: not verified, so not passed.

    The budgets are wall-clock seconds, there only as a safety net: the verdict is the depth.
    """
    return failure("incomplete", f"{what}: cut by the time budget ({seconds:g} s): not verified to "
                   f"depth {target}", f"every level to depth {depth} was explored, not level {depth + 1}; "
                   f"a busy machine? raise {flag}")


def bmc_failure(out: Any, cfg: Any) -> dict[str, Any]:
    """A BMC violation as a Failure with a picture of the pool after each call."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.pictures import labeller, picture_of_state, trace_step
    from kvpool.proofs import bmc

    labels = bmc.key_labels(cfg)
    label = labeller(labels)
    trace = [trace_step(number, f"{step.action}({', '.join(bmc.show_arg(a) for a in step.args)})",
                        step.refusal or repr(step.result), bmc.describe(step, labels),
                        picture_of_state(step.after, label))
             for number, step in enumerate(out.trace, start=1)]
    return failure("violation", "breaks " + ", ".join(out.violation), bmc.format_trace(out, cfg), trace)


def run_bmc(budget: Budget, progress: Progress, shard: Shard = WHOLE_RUN) -> Phase:
    """Every call sequence of small pools up to the depth; a run its time budget cuts fails.

    A shard explores its part of each pool's search (:func:`kvpool.proofs.bmc.explore`'s
    ``part``); its run carries the figures :mod:`.merge` needs to count each state once.
    """
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.proofs import bmc

    phase = Phase("bmc")
    progress.start("bmc", len(budget.bmc_pools) + len(budget.bmc_references) + 3)
    runs = []
    start = time.perf_counter()
    pools = [(*p, "0.31") for p in pool_depths(budget.bmc_pools, budget.bmc_depth)]
    for blocks, hbs, depth, version in [*pools, *budget.bmc_references]:
        cfg = bmc.Bounds(blocks=blocks, hash_block_size=hbs, reference=version)
        out = bmc.explore(cfg, depth, budget.bmc_seconds, part=None if shard.whole else shard.part,
                          split_depth=budget.bmc_split_depth)
        other = "" if version == "0.31" else f", vLLM {version}"
        name = f"{blocks} blocks, hash_block_size {hbs}{other}"
        slug = (f"{blocks}-blocks-hbs-{hbs}" + ("" if depth == budget.bmc_depth else f"-depth-{depth}")
                + ("" if version == "0.31" else f"-vllm-{version}"))
        runs.append({"name": name, "blocks": blocks, "hash_block_size": hbs,
                     "depth_target": depth, "depth": out.depth, "states": out.states,
                     "transitions": out.transitions, "complete": out.complete, "ok": out.ok,
                     "seconds": round(out.seconds, 3),
                     "part": None if out.part is None else part_json(out.part)})
        fail = (bmc_failure(out, cfg) if not out.ok else None if out.complete else
                cut_failure(f"BMC {name}", budget.bmc_seconds, depth, out.depth, "--bmc-seconds"))
        phase.cases.append(Case(f"bmc/{slug}", f"BMC {name} to depth {depth}", fail is None, out.seconds,
                                fail))
        progress.advance(f"{name}: depth {out.depth}/{depth}, {out.states} states"
                         + ("" if out.part is None else
                            f" (part {shard}: {out.part.owned} of {out.part.frontier} states at depth "
                            f"{out.part.split_depth})"))
    phase.cases += [legal_case(), coverage_case(), misuse_case()]
    for case in phase.cases[-3:]:
        progress.advance(case.name)
    return phase.finish(start, {"runs": runs})


def _one_call_away() -> tuple[Any, list[Any]]:
    """A 3-block pool (hash block size 2) and its states: the fresh pool and those one call away."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.proofs import bmc
    from kvpool.proofs.bmc.search import explore  # the model's own actions, whatever a test swapped

    cfg = bmc.Bounds(blocks=3, hash_block_size=2)
    states: list[Any] = []
    explore(cfg, 1, 600.0, visit=states.append)
    return cfg, states


def coverage_case() -> Case:
    """The BMC's call domains reach every branch of every guard, contract and update, and every
    pair of them one call takes, that well-formed calls made from the declarations' argument kinds
    reach from the same states (a fresh pool and the states one call away,
    :mod:`kvpool.proofs.bmc.branches`): a domain that stopped making a class of calls the model
    treats apart (a block listed twice, ``replace_existing_hashes=True``) fails here."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.proofs.bmc.branches import measure, shortfall

    began = time.perf_counter()
    cfg, states = _one_call_away()
    cov = measure(states, cfg)
    lost = shortfall(cov)
    fail = None if cov.ok else failure(
        "violation", f"the BMC's domains miss {len(cov.missing)} branch(es) and {len(cov.missing_pairs)} "
        f"pair(s) of branches that well-formed calls reach: {lost[0]}", "\n".join(lost))
    return Case("bmc/domain-branches", f"the domains reach every branch ({len(cov.reference)}) and pair "
                f"of branches ({len(cov.reference_pairs):,}) of the guards, contracts and updates that "
                f"{cov.reference_calls:,} well-formed calls reach from {len(states)} states",
                fail is None, time.perf_counter() - began, fail)


def misuse_case() -> Case:
    """Calls with one argument wrong for its declared kind are refused by their guard (or are a no-op
    it decides) from a fresh pool and the states one call away (:mod:`kvpool.proofs.bmc.misuse`): a
    guard that lost an argument check fails here, though no search makes such a call."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.proofs.bmc.misuse import check_misuse

    began = time.perf_counter()
    cfg, states = _one_call_away()
    out = check_misuse(states, cfg)
    fail = None if out.ok else failure(
        "violation", f"{len(out.let_through)} call(s) with a wrong argument pass their guard: "
        f"{out.let_through[0] if out.let_through else 'none made'}", "\n".join(out.let_through[:20]))
    return Case("bmc/misuse-refused", f"{out.calls:,} calls with one argument wrong for its kind are refused "
                f"by their guard, from {len(states)} states", fail is None, time.perf_counter() - began, fail)


def legal_case() -> Case:
    """Every caller contract accepts the legal corpus whole (:mod:`kvpool.oracle.generate.legal`): a contract
    too strong, which the searches would silently obey by exploring less, fails here."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.oracle.generate.legal import check_legal

    began = time.perf_counter()
    out = check_legal()
    title = f"every contract accepts {out.traces} legal call sequences ({out.calls:,} calls)"
    first = out.refused[0].format().splitlines()[0] if out.refused else "no legal call sequence was found"
    fail = None if out.ok else failure(
        "violation", f"{len(out.refused)} legal call sequence(s) refused: {first}",
        "\n".join(r.format() for r in out.refused))
    return Case("bmc/legal-corpus", title, fail is None, time.perf_counter() - began, fail)


def part_json(part: Any) -> dict[str, Any]:
    """A BMC part's figures; ``beyond`` packed as base64 of zlib'd (8-byte digest, 4-byte calls) rows."""
    rows = b"".join(d + made.to_bytes(4, "big") for d, made in sorted(part.beyond.items()))
    figures = {f.name: getattr(part, f.name) for f in fields(part) if f.name != "beyond"}  # no copy of it
    return {**figures, "index": part.index + 1,
            "beyond": base64.b64encode(zlib.compress(rows, 6)).decode("ascii")}


def part_from_json(data: dict[str, Any]) -> Any:
    """:func:`part_json` read back (a ``ValueError`` if it is not one)."""
    # lazy: the BMC (z3) only to read a BMC part
    from kvpool.proofs.bmc import PartFigures

    try:
        rows = zlib.decompress(base64.b64decode(data["beyond"], validate=True))
    except (binascii.Error, zlib.error, TypeError) as exc:
        raise ValueError(f"a BMC part's states cannot be read: {exc}") from None
    if len(rows) % 12:
        raise ValueError("a BMC part's states are truncated")
    beyond = {rows[i:i + 8]: int.from_bytes(rows[i + 8:i + 12], "big") for i in range(0, len(rows), 12)}
    return PartFigures(**{**{f.name: data[f.name] for f in fields(PartFigures)}, "index": data["index"] - 1,
                          "beyond": beyond})


def divergence_failure(exc: BaseException, seed: int | None = None) -> dict[str, Any]:
    """A lockstep divergence (or a crash of the pool) as a Failure with pictures."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.oracle.core.lockstep import CallerBrokeContract, Divergence

    text = str(exc) if isinstance(exc, Divergence) else f"{type(exc).__name__}: {exc}"
    kind = ("contract" if isinstance(exc, CallerBrokeContract)
            else "divergence" if isinstance(exc, Divergence) else "crash")
    head = (text.splitlines() or [kind])[0]
    where = "" if seed is None else f" (seed {seed})"
    from kvpool.pictures import pictured_steps  # lazy: the pictures load the oracle, for a failure only

    return failure(kind, head + where, text,
                   pictured_steps(exc) if isinstance(exc, Divergence) else [])


def run_lockstep(budget: Budget, progress: Progress, shard: Shard = WHOLE_RUN) -> Phase:
    """kvpool.impl against the model on seeded random workloads, misuse included.

    A shard takes the runs ``r`` (seed ``seed + r``) with ``r mod N == I - 1``.
    """
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.impl import BlockPool
    from kvpool.oracle.search.campaign import run_one

    phase = Phase("lockstep")
    mine = [run for run in range(budget.runs) if shard.takes(run)]
    progress.start("lockstep", len(mine))
    operations: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    configs = []
    calls = 0
    start = time.perf_counter()
    for run in mine:
        seed = budget.seed + run
        run_start = time.perf_counter()
        fail: dict[str, Any] | None
        try:
            pair = run_one(BlockPool, seed, budget.steps)
        except Exception as exc:
            fail, note = divergence_failure(exc, seed), f"seed {seed}: DIVERGED"
        else:
            fail, note = None, f"seed {seed}: {pair.steps} calls agree"
            calls += pair.steps
            operations.update(pair.ops_seen)
            errors.update(pair.refusals_seen)
            m = pair.model
            configs.append({"seed": seed, "num_blocks": m.num_blocks, "caching": m.caching,
                            "hash_block_size": m.hash_block_size, "events": m.events_on})
        phase.cases.append(Case(f"lockstep/seed-{seed}", f"lockstep seed {seed}", fail is None,
                                time.perf_counter() - run_start, fail))
        progress.advance(note)
    phase.seconds = time.perf_counter() - start
    phase.extra = {"implementation": "kvpool.impl:BlockPool", "runs": len(mine), "calls": calls,
                   "calls_per_second": round(calls / phase.seconds) if phase.seconds else 0,
                   "operations": dict(sorted(operations.items())),
                   "errors": dict(sorted(errors.items())), "configs": configs}
    return phase


@dataclass(frozen=True)
class Target:
    """An implementation to check: its name on the command line and its adapter."""

    spec: str
    adapter: Adapter


def run_conformance(targets: Sequence[Target], budget: Budget, misuse: bool, reference: str,
                    progress: Progress, shard: Shard = WHOLE_RUN, database: str | None = None) -> Phase:
    """Each implementation against the model: the campaign, then the state machine.

    A shard runs its part of both (:class:`kvpool.oracle.search.conform.Options`); ``database``
    is Hypothesis' example database (``KVPOOL_EXAMPLE_DB``).
    """
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.oracle.core.adapter import misuse_setting
    from kvpool.oracle.search.conform import (
        Options,
        observation_level,
        run_campaign_phase,
        run_machine_phase,
    )
    from kvpool.pictures import pictured_steps, trace_step  # lazy: with the oracle above

    phase = Phase("conformance", skipped=not targets)
    if phase.skipped:
        return phase
    progress.start("conformance", len(targets) * 2)
    opts = Options(steps=budget.steps, runs=budget.runs, examples=budget.examples,
                   machine_steps=budget.machine_steps, seed=budget.seed, misuse=misuse,
                   reference=reference, shard=shard.part, database=database)
    rows = []
    start = time.perf_counter()
    for target in targets:
        results = []
        for run in (run_campaign_phase, run_machine_phase):
            result = run(target.adapter, opts)
            results.append(result)
            progress.advance(f"{target.spec} {result.name}: {'ok' if result.ok else 'DIVERGED'}")
        ok, seconds = all(r.ok for r in results), sum(r.seconds for r in results)
        # The state machine's failure first: Hypothesis shrank it to a short trace.
        bad = next((r for r in reversed(results) if r.failure is not None), None)
        fail = None
        if bad is not None and bad.failure is not None:
            f = bad.failure
            steps = pictured_steps(f.divergence) if f.divergence is not None else []
            steps = steps or [trace_step(i + 1, line) for i, line in enumerate(f.trace)]
            details = f.details if bad.name == "campaign" else "\n".join(
                ["minimal trace, shrunk by Hypothesis:", *f.trace, "", f.details])
            fail = failure(f.kind, f"{bad.name}: {f.message}", details, steps)
        rows.append({"name": target.adapter.name, "spec": target.spec, "ok": ok,
                     "seconds": round(seconds, 3),
                     "phases": [{"name": r.name, "ok": r.ok, "seconds": round(r.seconds, 3),
                                 "executed": r.executed, "replayed": r.replayed} for r in results],
                     "observation": observation_level(target.adapter, reference),
                     "misuse": misuse_setting(target.adapter, misuse)[1],
                     "operations": results[0].operations, "refusals": results[0].refusals})
        phase.cases.append(Case(f"conformance/{target.spec}", f"{target.spec} conforms", ok,
                                seconds, fail))
    return phase.finish(start, {"targets": rows})


def run_traces(traces: Sequence[str], events: Sequence[str], vllm_errors: bool,
               progress: Progress) -> Phase:
    """Recorded traces replayed on the model; event streams read as a router reads them."""
    # lazy: a phase's modules load when it runs (module docstring)
    from kvpool.oracle.events.check import check_events
    from kvpool.oracle.trace import TraceError, check_trace

    phase = Phase("traces", skipped=not (traces or events))
    if phase.skipped:
        return phase
    progress.start("traces", len(traces) + len(events))
    files = []
    start = time.perf_counter()
    for kind, path in [*(("trace", p) for p in traces), *(("events", p) for p in events)]:
        began = time.perf_counter()
        fail = None
        try:
            trace = kind == "trace"
            report: Any = check_trace(path, vllm_errors=vllm_errors) if trace else check_events(path)
            count = report.steps if trace else report.events
            if not report.ok:
                fail = failure("divergence", report.format().splitlines()[0], report.format())
        except TraceError as exc:  # read before the run; changed since?
            fail, count = failure("crash", str(exc)), 0
        files.append({"path": path, "kind": kind, "ok": fail is None, "steps": count})
        phase.cases.append(Case(f"traces/{kind}/{Path(path).name}", f"{kind} {path}",
                                fail is None, time.perf_counter() - began, fail))
        progress.advance(f"{path}: {'ok' if fail is None else 'DIFFERS'}")
    return phase.finish(start, {"files": files})


__all__ = ["Case", "Phase", "Target", "bmc_failure", "divergence_failure", "failure", "part_from_json",
           "part_json", "run_bmc", "run_conformance", "run_lockstep", "run_proofs", "run_seeded_bugs",
           "run_traces"]
