"""``kvpool verify``: every check of the project in one command, for CI and reviewers.

Phases, in order: the inductive z3 proofs; the seeded bugs that show the
proofs and the bounded model checker can fail; bounded model checking of the
executable model; the lockstep campaign of kvpool.impl against the model;
conformance of every ``--impl``/``--adapter`` given; and every recorded
``--trace`` / ``--events`` file.  Each phase yields *cases* (one per proof,
per seeded bug, per BMC run, per lockstep run, per conformance target, per
file), which become JUnit test cases, entries of the JSON document
(``kvpool/VERIFY_SCHEMA.md``) and rows of the report.

Exit status: 0 when every case passed, 1 when any failed (a counterexample,
an ``unknown`` proof, a divergence), 2 on a usage error, reported in one line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from kvpool import __version__
from kvpool.cli.usage import UsageError, UsageParser, load_adapter
from kvpool.oracle.adapter import Adapter

SCHEMA = "kvpool.verify/1"
PHASES = ("proofs", "seeded-bugs", "bmc", "lockstep", "conformance", "traces")


@dataclass(frozen=True)
class Budget:
    """How much each phase explores; a profile is a named budget."""

    bmc_depth: int = 2
    bmc_seconds: float = 60.0
    bmc_pools: tuple[tuple[int, int], ...] = ((4, 1), (4, 2))
    """BMC runs as (blocks including the null block, hash_block_size)."""
    steps: int = 2000
    runs: int = 4
    examples: int = 50
    machine_steps: int = 25
    seed: int = 0
    timeout_ms: int = 30_000


PROFILES: dict[str, Budget] = {
    "ci": Budget(),
    "dev": Budget(bmc_depth=3, bmc_seconds=300.0, steps=10_000, runs=8, examples=200),
    "deep": Budget(bmc_depth=4, bmc_seconds=1800.0, bmc_pools=((4, 1), (4, 2), (5, 1)),
                   steps=50_000, runs=16, examples=1000, machine_steps=50),
}
"""ci: under a minute on 2 cores; dev: a few minutes; deep: an hour-scale campaign."""


# ------------------------------------------------------------------ results


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

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3),
                "skipped": self.skipped, "cases": [asdict(c) for c in self.cases], **self.extra}


def failure(kind: str, message: str, details: str = "",
            trace: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Failure object of the schema."""
    return {"kind": kind, "message": message, "details": details, "trace": trace or []}


# ----------------------------------------------------------------- progress


class Progress:
    """Plain progress lines: what a CI log should show."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def start(self, phase: str, total: int) -> None:
        print(f"== {phase} ({total} {'case' if total == 1 else 'cases'})", file=self.out, flush=True)

    def advance(self, note: str = "") -> None:
        if note:
            print(f"   {note}", file=self.out, flush=True)

    def done(self, phase: Phase) -> None:
        print(f"   {phase.name}: {_phase_line(phase)}", file=self.out, flush=True)

    def close(self) -> None:
        pass


class RichProgress(Progress):
    """A bar per phase on a terminal (``rich``)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bars

        self.console = Console(file=out)
        self.bars = Bars(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                         console=self.console, transient=False)
        self.bars.start()
        self.task: Any = None

    def start(self, phase: str, total: int) -> None:
        self.task = self.bars.add_task(phase, total=max(total, 1), note="")

    def advance(self, note: str = "") -> None:
        self.bars.update(self.task, advance=1, note=note[:60])

    def done(self, phase: Phase) -> None:
        self.bars.update(self.task, completed=self.bars.tasks[-1].total,
                         note=("[green]" if phase.ok else "[red]") + _phase_line(phase))

    def close(self) -> None:
        self.bars.stop()


def make_progress(out: TextIO, plain: bool | None = None) -> Progress:
    """Bars on a terminal, plain lines in CI (no TTY, or ``CI=true``) or without rich."""
    if plain is None:
        plain = not out.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not plain:
        try:
            return RichProgress(out)
        except ImportError:
            pass
    return Progress(out)


def _phase_line(phase: Phase) -> str:
    if phase.skipped:
        return "skipped"
    bad = sum(not c.ok for c in phase.cases)
    status = "ok" if not bad else f"FAILED ({bad} of {len(phase.cases)})"
    return f"{status}, {len(phase.cases)} cases in {phase.seconds:.1f}s"


# ------------------------------------------------------------------- phases


def run_proofs(budget: Budget, progress: Progress) -> Phase:
    """Initial states, preservation of every invariant by every step, non-vacuity."""
    from kvpool.proofs.inductive import PROVEN, check_enabled, check_initial, check_preservation
    from kvpool.proofs.invariants import NOT_ENCODED, SYM_INVARIANTS
    from kvpool.proofs.transitions import COVERS, STEPS

    phase = Phase("proofs")
    names, steps = list(SYM_INVARIANTS), list(STEPS)
    from kvpool.proofs.order import ORDER_PROPERTIES, QSTEPS

    order_checks = 1 + len(QSTEPS) * (len(ORDER_PROPERTIES) + 1)
    progress.start("proofs", len(names) * (len(steps) + 1) + len(steps) + order_checks)

    def case(cid: str, title: str, r: Any, step: str | None = None,
             invariant: str | None = None) -> dict[str, Any]:
        ok = r.status == PROVEN
        trace: list[dict[str, Any]] = []
        if not ok and step and invariant:  # a concrete pool that breaks it, if a small one does
            from kvpool.proof_pictures import counterexample_steps

            trace = counterexample_steps(step, invariant, timeout_ms=budget.timeout_ms)
        kind = "counterexample" if trace or r.status != "unknown" else "unknown"
        phase.cases.append(Case(cid, title, ok, r.seconds, None if ok else failure(
            kind, f"{title}: {r.status}" + (" (a counterexample in finite scope)"
                                            if trace and r.status == "unknown" else ""),
            r.detail, trace)))
        progress.advance("" if ok else f"{title}: {r.status}")
        return {"status": r.status, "seconds": round(r.seconds, 4)}

    start = time.perf_counter()
    initial = {n: case(f"proofs/initial/{n}", f"initial state satisfies {n}",
                       check_initial(n, budget.timeout_ms)) for n in names}
    matrix = {st: {n: case(f"proofs/preserve/{st}/{n}", f"{st} preserves {n}",
                           check_preservation(st, n, budget.timeout_ms), st, n) for n in names}
              for st in steps}
    enabled = {st: case(f"proofs/enabled/{st}", f"{st} precondition satisfiable",
                        check_enabled(st, budget.timeout_ms)) for st in steps}
    phase.extra = {"steps": steps, "matrix": matrix, "initial": initial, "enabled": enabled,
                   "not_encoded": dict(NOT_ENCODED),
                   "covers": {a: list(s) for a, s in COVERS.items()},
                   "order": _order_proofs(budget, case)}
    phase.seconds = time.perf_counter() - start
    return phase


def _order_proofs(budget: Budget, case: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The eviction order (``proofs/order.py``): the free queue as a sequence of places."""
    from kvpool.proofs.order import (
        ORDER_PROPERTIES,
        QSTEPS,
        check_order,
        check_order_enabled,
        check_order_initial,
    )

    t = budget.timeout_ms
    initial = case("proofs/order/initial", "initial queue is well formed", check_order_initial(t))
    matrix = {st: {p: case(f"proofs/order/{st}/{p}", f"queue step {st} keeps {p}", check_order(st, p, t))
                   for p in ORDER_PROPERTIES} for st in QSTEPS}
    enabled = {st: case(f"proofs/order/enabled/{st}", f"queue step {st} precondition satisfiable",
                        check_order_enabled(st, t)) for st in QSTEPS}
    return {"steps": list(QSTEPS), "properties": list(ORDER_PROPERTIES), "initial": initial,
            "matrix": matrix, "enabled": enabled}


def run_seeded_bugs(budget: Budget, progress: Progress) -> Phase:
    """Every seeded bug is refuted: the proofs and the BMC can fail."""
    from kvpool.proofs import bmc
    from kvpool.proofs.order import ORDER_BUGS, order_refutations
    from kvpool.proofs.seeded_bugs import BUGS, refutations, refuted_by

    phase = Phase("seeded-bugs")
    progress.start("seeded-bugs", len(BUGS) + len(ORDER_BUGS) + len(bmc.BUGS))
    bugs: list[dict[str, Any]] = []
    start = time.perf_counter()

    def record(kind: str, name: str, story: str, found: list[str], took: float) -> None:
        method, caught = ("bmc", "found by the BMC") if kind == "bmc" else ("inductive", "refuted")
        bugs.append({"name": name, "story": story, "refuted_by": found, "method": method})
        phase.cases.append(Case(
            f"seeded-bugs/{kind}/{name}", f"{'BMC finds' if kind == 'bmc' else 'z3 refutes'} {name}",
            bool(found), took,
            None if found else failure("violation", f"seeded bug {name} is not {caught}", story)))
        progress.advance(f"{name}: {', '.join(found) or 'NOT ' + caught}")

    for name, bug in BUGS.items():
        began = time.perf_counter()
        found = refuted_by(refutations(name, timeout_ms=budget.timeout_ms))
        record("inductive", name, bug.story, found, time.perf_counter() - began)
    for name, (_step, story) in ORDER_BUGS.items():
        began = time.perf_counter()
        record("order", name, story, refuted_by(order_refutations(name)), time.perf_counter() - began)
    for name, (action, fn) in bmc.BUGS.items():
        out = bmc.find_bug(name, seconds=min(budget.bmc_seconds, 60.0))
        record("bmc", name, (fn.__doc__ or action).strip().splitlines()[0], out.violation, out.seconds)
    phase.seconds = time.perf_counter() - start
    phase.extra = {"bugs": bugs}
    return phase


def bmc_failure(out: Any, cfg: Any) -> dict[str, Any]:
    """A BMC violation as a Failure with a picture of the pool after each call."""
    from kvpool.pictures import labeller, picture_of_state
    from kvpool.proofs import bmc

    labels = bmc.key_labels(cfg)
    label = labeller(labels)
    trace = []
    for number, step in enumerate(out.trace, start=1):
        call = f"{step.action}({', '.join(bmc.show_arg(a) for a in step.args)})"
        trace.append({"index": number, "call": call,
                      "outcome": step.error or repr(step.result),
                      "changes": bmc.describe(step, labels),
                      "picture": picture_of_state(step.after, label),
                      "pool_picture": None, "differs": []})
    return failure("violation", "breaks " + ", ".join(out.violation), bmc.format_trace(out, cfg), trace)


def run_bmc(budget: Budget, progress: Progress) -> Phase:
    """Every call sequence of small pools up to the depth, within the time budget."""
    from kvpool.proofs import bmc

    phase = Phase("bmc")
    progress.start("bmc", len(budget.bmc_pools))
    runs = []
    start = time.perf_counter()
    for blocks, hbs in budget.bmc_pools:
        cfg = bmc.Config(blocks=blocks, hash_block_size=hbs)
        out = bmc.explore(cfg, budget.bmc_depth, budget.bmc_seconds)
        name = f"{blocks} blocks, hash_block_size {hbs}"
        runs.append({"name": name, "blocks": blocks, "hash_block_size": hbs,
                     "depth_target": budget.bmc_depth, "depth": out.depth, "states": out.states,
                     "transitions": out.transitions, "complete": out.complete, "ok": out.ok,
                     "seconds": round(out.seconds, 3)})
        phase.cases.append(Case(f"bmc/{blocks}-blocks-hbs-{hbs}", f"BMC {name}", out.ok, out.seconds,
                                None if out.ok else bmc_failure(out, cfg)))
        progress.advance(f"{name}: depth {out.depth}/{budget.bmc_depth}, {out.states} states")
    phase.seconds = time.perf_counter() - start
    phase.extra = {"runs": runs}
    return phase


def divergence_failure(exc: BaseException, seed: int | None = None) -> dict[str, Any]:
    """A lockstep divergence (or a crash of the pool) as a Failure with pictures."""
    from kvpool.oracle.lockstep import Divergence

    text = str(exc) if isinstance(exc, Divergence) else f"{type(exc).__name__}: {exc}"
    kind = "divergence" if isinstance(exc, Divergence) else "crash"
    head = (text.splitlines() or [kind])[0]
    where = "" if seed is None else f" (seed {seed})"
    from kvpool.pictures import pictured_steps

    return failure(kind, head + where, text,
                   pictured_steps(exc) if isinstance(exc, Divergence) else [])


def run_lockstep(budget: Budget, progress: Progress) -> Phase:
    """kvpool.impl against the model on seeded random workloads, misuse included."""
    from kvpool.impl import BlockPool
    from kvpool.oracle.campaign import run_one

    phase = Phase("lockstep")
    progress.start("lockstep", budget.runs)
    operations: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    configs = []
    calls = 0
    start = time.perf_counter()
    for run in range(budget.runs):
        seed = budget.seed + run
        run_start = time.perf_counter()
        try:
            pair = run_one(BlockPool, seed, budget.steps)
        except Exception as exc:
            phase.cases.append(Case(f"lockstep/seed-{seed}", f"lockstep seed {seed}", False,
                                    time.perf_counter() - run_start, divergence_failure(exc, seed)))
            progress.advance(f"seed {seed}: DIVERGED")
            continue
        calls += pair.steps
        operations.update(step.op for step in pair.trace)
        errors.update(step.error for step in pair.trace if step.error)
        m = pair.model
        configs.append({"seed": seed, "num_blocks": m.num_blocks, "caching": m.caching,
                        "hash_block_size": m.hash_block_size, "events": m.events_on})
        phase.cases.append(Case(f"lockstep/seed-{seed}", f"lockstep seed {seed}", True,
                                time.perf_counter() - run_start))
        progress.advance(f"seed {seed}: {pair.steps} calls agree")
    phase.seconds = time.perf_counter() - start
    phase.extra = {"implementation": "kvpool.impl:BlockPool", "runs": budget.runs, "calls": calls,
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
                    progress: Progress) -> Phase:
    """Each implementation against the model: the campaign, then the state machine."""
    from kvpool.oracle.conform import Options, run_campaign_phase, run_machine_phase
    from kvpool.pictures import pictured_steps

    phase = Phase("conformance", skipped=not targets)
    if phase.skipped:
        return phase
    progress.start("conformance", len(targets) * 2)
    opts = Options(steps=budget.steps, runs=budget.runs, examples=budget.examples,
                   machine_steps=budget.machine_steps, seed=budget.seed, misuse=misuse,
                   reference=reference)
    rows = []
    start = time.perf_counter()
    for target in targets:
        results = []
        for run in (run_campaign_phase, run_machine_phase):
            result = run(target.adapter, opts)
            results.append(result)
            progress.advance(f"{target.spec} {result.name}: {'ok' if result.ok else 'DIVERGED'}")
        ok = all(r.ok for r in results)
        seconds = sum(r.seconds for r in results)
        bad = next((r for r in results if r.failure is not None), None)
        fail = None
        if bad is not None and bad.failure is not None:
            f = bad.failure
            steps = pictured_steps(f.divergence) if f.divergence is not None else []
            steps = steps or [{"index": i + 1, "call": line, "outcome": "", "changes": [],
                               "picture": None, "pool_picture": None, "differs": []}
                              for i, line in enumerate(f.trace)]
            details = f.details if bad.name == "campaign" else "\n".join(
                ["minimal trace, shrunk by Hypothesis:", *f.trace, "", f.details])
            fail = failure(f.kind, f"{bad.name}: {f.message}", details, steps)
        rows.append({"name": target.adapter.name, "spec": target.spec, "ok": ok,
                     "seconds": round(seconds, 3),
                     "phases": [{"name": r.name, "ok": r.ok, "seconds": round(r.seconds, 3),
                                 "executed": r.executed} for r in results]})
        phase.cases.append(Case(f"conformance/{target.spec}", f"{target.spec} conforms", ok,
                                seconds, fail))
    phase.seconds = time.perf_counter() - start
    phase.extra = {"targets": rows}
    return phase


def run_traces(traces: Sequence[str], events: Sequence[str], vllm_errors: bool,
               progress: Progress) -> Phase:
    """Recorded traces replayed on the model; event streams read as a router reads them."""
    from kvpool.oracle.events_check import check_events
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
            if kind == "trace":
                report: Any = check_trace(path, vllm_errors=vllm_errors)
                count = report.steps
            else:
                report = check_events(path)
                count = report.events
            if not report.ok:
                fail = failure("divergence", report.format().splitlines()[0], report.format())
        except TraceError as exc:  # read before the run; changed since?
            fail, count = failure("crash", str(exc)), 0
        files.append({"path": path, "kind": kind, "ok": fail is None, "steps": count})
        phase.cases.append(Case(f"traces/{kind}/{Path(path).name}", f"{kind} {path}",
                                fail is None, time.perf_counter() - began, fail))
        progress.advance(f"{path}: {'ok' if fail is None else 'DIFFERS'}")
    phase.seconds = time.perf_counter() - start
    phase.extra = {"files": files}
    return phase


# ---------------------------------------------------------------- documents


def invariants_table() -> list[dict[str, Any]]:
    """The model's invariants with their docstrings, and whether z3 proves them."""
    from kvpool.model import INVARIANTS
    from kvpool.proofs.invariants import SYM_INVARIANTS

    return [{"name": name, "doc": (fn.__doc__ or "").strip().splitlines()[0],
             "encoded": name in SYM_INVARIANTS} for name, fn in INVARIANTS.items()]


def reference_differences() -> str:
    """oracle/REFERENCE_DIFFERENCES.md, shipped with the package."""
    try:
        return resources.files("kvpool.oracle").joinpath("REFERENCE_DIFFERENCES.md").read_text("utf-8")
    except OSError:
        return ""


def document(phases: Sequence[Phase], profile: str, budget: Budget, started: datetime.datetime,
             seconds: float) -> dict[str, Any]:
    """The JSON result (``kvpool/VERIFY_SCHEMA.md``)."""
    ok = all(p.ok for p in phases)
    budget_json = asdict(budget)
    budget_json["bmc_pools"] = [list(p) for p in budget.bmc_pools]
    return {"schema": SCHEMA, "kvpool_version": __version__,
            "started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 3),
            "profile": profile, "budget": budget_json, "ok": ok, "exit_code": 0 if ok else 1,
            "invariants": invariants_table(), "reference_differences": reference_differences(),
            "phases": [p.as_json() for p in phases]}


def _trace_text(fail: dict[str, Any]) -> str:
    lines = [f"step {s['index']}: {s['call']} -> {s['outcome']}" for s in fail["trace"]]
    return "\n".join([*lines, "", fail["details"]]).strip()


def junit_xml(doc: dict[str, Any]) -> bytes:
    """One testsuite per phase, one testcase per case; failures carry the trace."""
    suites = ET.Element("testsuites", name="kvpool.verify",
                        tests=str(sum(len(p["cases"]) for p in doc["phases"])),
                        failures=str(sum(not c["ok"] for p in doc["phases"] for c in p["cases"])),
                        time=f"{doc['seconds']:.3f}")
    for p in doc["phases"]:
        suite = ET.SubElement(suites, "testsuite", name=f"kvpool.verify.{p['name']}",
                              tests=str(len(p["cases"])),
                              failures=str(sum(not c["ok"] for c in p["cases"])), errors="0",
                              skipped="0", time=f"{p['seconds']:.3f}")
        for c in p["cases"]:
            case = ET.SubElement(suite, "testcase", classname=f"kvpool.verify.{p['name']}",
                                 name=c["id"], time=f"{c['seconds']:.3f}")
            if c["failure"] is not None:
                el = ET.SubElement(case, "failure", message=c["failure"]["message"],
                                   type=c["failure"]["kind"])
                el.text = _trace_text(c["failure"])
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def summary(doc: dict[str, Any], written: Sequence[str]) -> str:
    """The one-screen summary printed at the end."""
    lines = ["", f"kvpool verify ({doc['profile']} profile, {doc['seconds']:.1f}s)"]
    for p in doc["phases"]:
        bad = [c for c in p["cases"] if not c["ok"]]
        if p["skipped"]:
            lines.append(f"  {p['name']:<12} skipped")
            continue
        status = "ok" if not bad else "FAILED"
        lines.append(f"  {p['name']:<12} {status:<7} {len(p['cases']) - len(bad):>4}/"
                     f"{len(p['cases']):<4} cases {p['seconds']:7.1f}s  {_phase_figure(p)}")
    failed = [c for p in doc["phases"] for c in p["cases"] if not c["ok"]]
    for c in failed[:10]:
        lines.append(f"  FAILED {c['id']}: {c['failure']['message']}")
        lines += [f"      step {s['index']}: {s['call']} -> {s['outcome']}"
                  for s in c["failure"]["trace"][-5:]]
    if len(failed) > 10:
        lines.append(f"  ... and {len(failed) - 10} more failing cases")
    lines += [f"  wrote {w}" for w in written]
    verdict = "PASSED" if doc["ok"] else f"FAILED: {len(failed)} failing case(s)"
    lines.append(f"kvpool verify: {verdict} (exit {doc['exit_code']})")
    return "\n".join(lines)


def _phase_figure(p: dict[str, Any]) -> str:
    """The headline number of a phase."""
    if p["skipped"]:
        return ""
    if p["name"] == "bmc":
        return "; ".join(f"{r['blocks']}b/hbs{r['hash_block_size']}: depth {r['depth']}/"
                         f"{r['depth_target']}, {r['states']} states" for r in p["runs"])
    if p["name"] == "lockstep":
        return (f"{p['calls']} calls ({p['calls_per_second']}/s), {len(p['operations'])} operations, "
                f"{sum(p['errors'].values())} refusals")
    if p["name"] == "conformance":
        return ", ".join(t["spec"] for t in p["targets"])
    if p["name"] == "seeded-bugs":
        return f"{sum(bool(b['refuted_by']) for b in p['bugs'])}/{len(p['bugs'])} refuted"
    if p["name"] == "proofs":
        order = p.get("order") or {"steps": [], "properties": []}
        return (f"{len(p['steps'])} steps x {len(p['initial'])} invariants; eviction order: "
                f"{len(order['steps'])} queue steps x {len(order['properties'])} properties")
    return ""


# ---------------------------------------------------------------- command


def parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="kvpool verify",
        description="Run the z3 proofs, the seeded bugs, bounded model checking, the lockstep\n"
                    "campaign of kvpool.impl and the conformance of every implementation given,\n"
                    "under a profile or an explicit budget. Exit 0 if everything passed, 1 on a\n"
                    "found violation, 2 on a usage error.",
        epilog="examples:\n"
               "  kvpool verify\n"
               "  kvpool verify --profile dev --junit verify.xml --json verify.json --report out/\n"
               "  kvpool verify --impl mypkg.pool:BlockPool --skip proofs --skip seeded-bugs\n"
               "  kvpool verify --trace run.jsonl --events kv-events.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci",
                   help="budget preset: ci (default, under a minute), dev, deep")
    p.add_argument("--impl", action="append", default=[], metavar="MODULE:CLASS",
                   help="a pool class with the reference API to check for conformance (repeatable)")
    p.add_argument("--adapter", action="append", default=[], metavar="MODULE:FACTORY",
                   help="a callable returning a kvpool.oracle.adapter.Adapter (repeatable)")
    p.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="a recorded JSONL trace to replay on the model (repeatable)")
    p.add_argument("--events", action="append", default=[], metavar="FILE",
                   help="a KV-event stream (or trace) to check as a router would (repeatable)")
    p.add_argument("--vllm-errors", action="store_true",
                   help="traces: accept ValueError where the model raises NotEnoughFreeBlocksError")
    p.add_argument("--reference", default="0.31", metavar="VERSION",
                   help="vLLM behaviour the model reproduces: 0.31 (default) or 0.33")
    p.add_argument("--no-misuse", action="store_true",
                   help="conformance: leave out deliberately wrong calls")
    p.add_argument("--skip", action="append", default=[], choices=PHASES, help="leave a phase out")
    budget = p.add_argument_group("budget (overrides the profile)")
    for name, kind, what in (("bmc-depth", int, "BMC depth"), ("bmc-seconds", float, "BMC time per run"),
                             ("steps", int, "calls per lockstep/campaign run"),
                             ("runs", int, "lockstep/campaign runs"),
                             ("examples", int, "state-machine examples per implementation"),
                             ("machine-steps", int, "rules per state-machine example"),
                             ("timeout-ms", int, "z3 timeout per proof")):
        budget.add_argument(f"--{name}", type=kind, help=what, metavar="N" if kind is int else "S")
    budget.add_argument("--seed", type=int, help="first random seed", metavar="N")
    out = p.add_argument_group("outputs")
    out.add_argument("--json", metavar="FILE", help="write the result document (kvpool/VERIFY_SCHEMA.md)")
    out.add_argument("--junit", metavar="FILE", help="write JUnit XML, one testcase per check")
    out.add_argument("--report", metavar="DIR", help="write report.md and report.html for reviewers")
    out.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    return p


@dataclass
class Settings:
    """A parsed, validated command line."""

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


def settings_from(argv: Sequence[str] | None) -> Settings:
    """Parse and check everything that can be checked before the run; raise UsageError."""
    from kvpool.cli.usage import check_writable as _check_writable
    from kvpool.model import REFERENCES

    ns = parser().parse_args(argv)
    budget = PROFILES[ns.profile]
    custom = {}
    for name in ("bmc_depth", "bmc_seconds", "steps", "runs", "examples", "machine_steps",
                 "timeout_ms", "seed"):
        value = getattr(ns, name)
        if value is None:
            continue
        if name != "seed" and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
        custom[name] = value
    profile = ns.profile if not custom else f"{ns.profile}+custom"
    if ns.reference not in REFERENCES:
        raise UsageError(f"--reference {ns.reference!r}: choose from {', '.join(REFERENCES)}")
    for flag, paths in (("--trace", ns.trace), ("--events", ns.events)):
        for path in paths:
            _check_readable(flag, path)
    for flag, path in (("--json", ns.json), ("--junit", ns.junit)):
        if path and os.path.dirname(path):
            _check_directory(flag, os.path.dirname(path))
        _check_writable(flag, path)
    if ns.report:
        _check_directory("--report", ns.report)
    targets = [Target(spec, load_adapter(spec, None)) for spec in ns.impl]
    targets += [Target(spec, load_adapter(None, spec)) for spec in ns.adapter]
    return Settings(profile, replace(budget, **custom), targets, ns.trace, ns.events,
                    ns.vllm_errors, ns.reference, not ns.no_misuse, set(ns.skip), ns.json,
                    ns.junit, ns.report, ns.plain)


def _check_readable(flag: str, path: str) -> None:
    """A trace or event file must exist and be JSON lines before an expensive run starts."""
    from kvpool.oracle.trace import TraceError, json_lines

    try:
        for _ in json_lines(path):
            pass
    except TraceError as exc:
        raise UsageError(f"{flag} {exc}") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None


def _check_directory(flag: str, path: str) -> None:
    """An output directory must be creatable and writable (it is created if missing)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path!r}: is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        probe = Path(path) / ".kvpool-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{flag} {path!r}: cannot write there: {exc.strerror or exc}") from None


def run(cfg: Settings, progress: Progress) -> dict[str, Any]:
    """Every phase not skipped, in order; the result document."""
    started = datetime.datetime.now(datetime.UTC)
    clock = time.perf_counter()
    b = cfg.budget
    plan: list[tuple[str, Callable[[], Phase]]] = [
        ("proofs", lambda: run_proofs(b, progress)),
        ("seeded-bugs", lambda: run_seeded_bugs(b, progress)),
        ("bmc", lambda: run_bmc(b, progress)),
        ("lockstep", lambda: run_lockstep(b, progress)),
        ("conformance", lambda: run_conformance(cfg.targets, b, cfg.misuse, cfg.reference, progress)),
        ("traces", lambda: run_traces(cfg.traces, cfg.events, cfg.vllm_errors, progress)),
    ]
    phases = []
    for name, fn in plan:
        if name in cfg.skip:
            phases.append(Phase(name, skipped=True))
            continue
        try:
            phase = fn()
        except Exception as exc:  # a crash of kvpool itself is a failure, not a traceback
            phase = Phase(name, cases=[Case(f"{name}/crash", f"{name} ran to the end", False, 0.0,
                                            failure("crash", f"{type(exc).__name__}: {exc}"))])
        if not phase.skipped:
            progress.done(phase)
        phases.append(phase)
    return document(phases, cfg.profile, b, started, time.perf_counter() - clock)


def write_outputs(doc: dict[str, Any], cfg: Settings) -> list[str]:
    """The JSON, JUnit and report files asked for; their paths."""
    written = []
    if cfg.json:
        with open(cfg.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        written.append(cfg.json)
    if cfg.junit:
        Path(cfg.junit).write_bytes(junit_xml(doc))
        written.append(cfg.junit)
    if cfg.report:
        from kvpool.report import write_report

        written += [str(p) for p in write_report(doc, Path(cfg.report))]
    return written


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``kvpool verify`` command; returns 0, 1 or 2."""
    out = out or sys.stdout
    try:
        cfg = settings_from(argv)
    except UsageError as exc:
        print(f"kvpool verify: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    progress = make_progress(out, True if cfg.plain else None)
    try:
        doc = run(cfg, progress)
    finally:
        progress.close()
    try:
        written = write_outputs(doc, cfg)
    except OSError as exc:
        print(f"kvpool verify: error: cannot write results: {exc}", file=sys.stderr)
        return 2
    print(summary(doc, written), file=out)
    return int(doc["exit_code"])


__all__ = ["PHASES", "PROFILES", "SCHEMA", "Budget", "Case", "Phase", "junit_xml", "main", "run",
           "settings_from", "summary"]


if __name__ == "__main__":
    raise SystemExit(main())
