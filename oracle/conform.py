"""``kvpool conform``: check any block pool implementation against the model.

Two phases run against the implementation, each compared call by call with
the model through :class:`~kvpool.oracle.lockstep.Lockstep`:

* ``campaign`` -- seeded random workloads (:func:`kvpool.oracle.campaign.run_one`),
  ``--runs`` runs of ``--steps`` calls each: long and fast, not shrunk;
* ``machine`` -- the Hypothesis state machine (:mod:`kvpool.oracle.machine`),
  ``--examples`` examples of up to ``--machine-steps`` rules: a failure is
  shrunk to a minimal trace of readable steps.

Exit status: 0 when both agree with the model, 1 on a divergence (or a crash
of the implementation), 2 on a usage error (bad ``--impl``/``--adapter``, a
class without the pool API, an output file that cannot be written), reported
as one line without a traceback.

``--json FILE`` writes this document (schema ``kvpool.conform/1``)::

    {
      "schema": "kvpool.conform/1",
      "implementation": "pkg.module:Class",   # the adapter's name
      "ok": true,                             # every phase agreed
      "exit_code": 0,                         # 0 agree, 1 divergence
      "settings": {"steps": 1000, "runs": 4, "examples": 200, "machine_steps": 25,
                   "seed": 0, "misuse": true, "reference": "0.31"},
      "phases": [
        {"name": "campaign",                  # then "machine"
         "ok": false,
         "seconds": 0.42,
         "executed": 4000,                    # campaign: lockstep calls; machine:
                                              # state machines run (examples, shrinks)
         "failure": null | {
            "kind": "divergence" | "crash",   # crash: the pool raised outside a call
            "message": "free_blocks: model raised ...",   # first line
            "details": "full message, with the last lockstep calls",
            "trace": ["step 3: get_new_blocks(1) -> [1]", ...],
                                              # campaign: last lockstep calls;
                                              # machine: the shrunk Hypothesis steps
            "seed": 2,                        # the campaign run's seed (machine: --seed)
            "steps": [...]                    # the last calls with a picture of the pool
                                              # each: TraceStep of kvpool/VERIFY_SCHEMA.md
         }}
      ]
    }

``--junit FILE`` writes JUnit XML: one ``testsuite`` named ``kvpool.conform``
with one ``testcase`` per phase (``campaign``, ``machine``), a ``failure``
element carrying the trace when the phase diverged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from .adapter import (
    Adapter,
    UsageError,
    UsageParser,
    adapter_factory,
    adapter_for_class,
    import_spec,
    missing_api,
)
from .campaign import run_one
from .lockstep import Divergence
from .machine import MachineFailure, machine_for

SCHEMA = "kvpool.conform/1"
ADAPTER_ATTRS = ("name", "supports_misuse", "construct", "observe", "errors_match")


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="kvpool conform",
        description="Run the lockstep campaign and the Hypothesis state machine against a\n"
                    "block pool implementation. Exit 0 if it agrees with the model, 1 on a\n"
                    "divergence (the minimal trace is printed), 2 on a usage error.",
        epilog="examples:\n  kvpool conform --impl kvpool.impl:BlockPool\n"
               "  kvpool conform --impl vllm.v1.core.block_pool:BlockPool --no-misuse "
               "--json out.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--impl", metavar="MODULE:CLASS",
                        help="a pool class with the reference (vLLM BlockPool) API; "
                             "kvpool.impl's pool and its subclasses must refuse misuse with "
                             "the model's typed errors, other classes run without misuse")
    target.add_argument("--adapter", metavar="MODULE:FACTORY",
                        help="a callable returning a kvpool.oracle.adapter.Adapter")
    parser.add_argument("--steps", type=int, default=1000, help="calls per campaign run (1000)")
    parser.add_argument("--runs", type=int, default=4, help="campaign runs (4)")
    parser.add_argument("--examples", type=int, default=200, help="state-machine examples (200)")
    parser.add_argument("--machine-steps", type=int, default=25,
                        help="rules per state-machine example (25)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both phases (0)")
    parser.add_argument("--reference", default="0.31",
                        help="vLLM version whose behaviour the model reproduces (0.31)")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML, one testcase per phase")
    parser.add_argument("--no-misuse", action="store_true",
                        help="leave out deliberately wrong calls (always off for pools that do "
                             "not refuse misuse, like vLLM's)")
    return parser


# ---------------------------------------------------------------- loading


def load_adapter(impl: str | None, adapter: str | None) -> Adapter:
    """The adapter named on the command line, checked enough to fail early and clearly."""
    if impl is not None:
        pool_class = import_spec("--impl", impl)
        missing = missing_api(pool_class)
        if not callable(pool_class) or missing:
            raise UsageError(f"--impl {impl!r} is not a block pool class: it lacks "
                             f"{', '.join(missing) or 'a constructor'}")
        loaded: Adapter = adapter_for_class(pool_class)
        flag, spec = "--impl", impl
    else:
        assert adapter is not None
        factory = import_spec("--adapter", adapter)
        if not callable(factory):
            raise UsageError(f"--adapter {adapter!r} is not callable")
        try:
            loaded = factory()
        except Exception as exc:
            raise UsageError(f"--adapter {adapter!r} failed: {exc!r}") from None
        lacking = [a for a in ADAPTER_ATTRS if not hasattr(loaded, a)]
        if lacking:
            raise UsageError(f"--adapter {adapter!r} returned no adapter: it lacks "
                             f"{', '.join(lacking)}")
        flag, spec = "--adapter", adapter
    try:
        loaded.construct(4, True, 1, False)
    except Exception as exc:
        raise UsageError(f"{flag} {spec!r}: cannot build a pool: {exc!r}") from None
    return loaded


def _check_writable(flag: str, path: str | None) -> None:
    """Fail before the run, not after it, when an output file cannot be written."""
    if path is None:
        return
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path!r}: cannot write: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)


# ----------------------------------------------------------------- phases


@dataclass
class Failure:
    """Why a phase failed: a divergence from the model, or a crash."""

    kind: str
    message: str
    details: str
    trace: list[str]
    seed: int | None
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The last calls with a picture of the pool each (``kvpool/VERIFY_SCHEMA.md``)."""


@dataclass
class PhaseResult:
    name: str
    ok: bool
    seconds: float
    executed: int
    failure: Failure | None = None


@dataclass
class Options:
    steps: int = 1000
    runs: int = 4
    examples: int = 200
    machine_steps: int = 25
    seed: int = 0
    misuse: bool = True
    reference: str = "0.31"


def _failure(exc: BaseException, trace: list[str] | None, seed: int | None) -> Failure:
    text = str(exc)
    kind = "divergence" if isinstance(exc, Divergence) else "crash"
    if kind == "crash":
        text = f"{type(exc).__name__}: {text}"
    lines = text.splitlines() or [type(exc).__name__]
    if trace is None:  # the lockstep's own "last steps" lines
        trace = [ln.strip() for ln in lines if ln.strip().startswith("step ")]
    return Failure(kind, lines[0], text, trace, seed, list(getattr(exc, "steps", [])))


def run_campaign_phase(adapter: Adapter, opts: Options) -> PhaseResult:
    """Seeded random workloads; stops at the first diverging run."""
    started = time.perf_counter()
    calls = 0
    factory = adapter_factory(adapter)
    misuse = opts.misuse and adapter.supports_misuse
    for run in range(opts.runs):
        seed = opts.seed + run
        try:
            pair = run_one(factory, seed, opts.steps, misuse=misuse,
                           errors_match=adapter.errors_match, reference=opts.reference)
        except Exception as exc:
            return PhaseResult("campaign", False, time.perf_counter() - started, calls,
                               _failure(exc, None, seed))
        calls += pair.steps
    return PhaseResult("campaign", True, time.perf_counter() - started, calls)


def run_machine_phase(adapter: Adapter, opts: Options) -> PhaseResult:
    """The state machine under Hypothesis; a failure comes back shrunk."""
    started = time.perf_counter()
    examples = [0]
    base = machine_for(adapter, misuse=opts.misuse, reference=opts.reference)

    class Counted(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            examples[0] += 1

    Counted.__name__ = base.__name__
    hypothesis_seed(opts.seed)(Counted)
    config = settings(
        max_examples=opts.examples, stateful_step_count=opts.machine_steps, deadline=None,
        database=None, report_multiple_bugs=False, print_blob=False,
        # no "explain" phase: it re-runs the failure many times to annotate arguments
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck))
    try:
        run_state_machine_as_test(Counted, settings=config)
    except Exception as exc:
        shrunk = MachineFailure.from_exception(exc)
        return PhaseResult("machine", False, time.perf_counter() - started, examples[0],
                           _failure(exc, shrunk.steps, opts.seed))
    return PhaseResult("machine", True, time.perf_counter() - started, examples[0])


def conform(adapter: Adapter, opts: Options, out: TextIO) -> list[PhaseResult]:
    """Run both phases, printing a line each and the details of any failure."""
    misuse = opts.misuse and adapter.supports_misuse
    print(f"kvpool conform: {adapter.name} against the model (vLLM {opts.reference} "
          f"behaviour, misuse {'on' if misuse else 'off'}, seed {opts.seed})", file=out)
    results = []
    for phase in (run_campaign_phase, run_machine_phase):
        result = phase(adapter, opts)
        results.append(result)
        what = "calls" if result.name == "campaign" else "examples"
        status = "ok" if result.ok else f"DIVERGED ({result.failure.kind})"  # type: ignore[union-attr]
        print(f"{result.name}: {status}, {result.executed} {what} in {result.seconds:.1f}s",
              file=out)
        if result.failure is not None:
            _print_failure(result, out)
    agree = all(r.ok for r in results)
    print("agrees with the model" if agree else "DIVERGES from the model", file=out)
    return results


def _print_failure(result: PhaseResult, out: TextIO) -> None:
    failure = result.failure
    assert failure is not None
    if result.name == "machine":
        print(f"  minimal trace ({len(failure.trace)} steps, shrunk by Hypothesis):", file=out)
        for step in failure.trace:
            print(f"    {step}", file=out)
        print("  lockstep says:", file=out)
    else:
        print(f"  run with seed {failure.seed}:", file=out)
    for line in failure.details.splitlines():
        print(f"    {line}", file=out)


# ---------------------------------------------------------------- outputs


def result_document(adapter: Adapter, opts: Options, results: list[PhaseResult]) -> dict[str, Any]:
    """The JSON document described in the module docstring."""
    ok = all(r.ok for r in results)
    return {
        "schema": SCHEMA,
        "implementation": adapter.name,
        "ok": ok,
        "exit_code": 0 if ok else 1,
        "settings": {**asdict(opts), "misuse": opts.misuse and adapter.supports_misuse},
        "phases": [
            {"name": r.name, "ok": r.ok, "seconds": round(r.seconds, 3), "executed": r.executed,
             "failure": None if r.failure is None else asdict(r.failure)}
            for r in results
        ],
    }


def junit_xml(adapter: Adapter, results: list[PhaseResult]) -> bytes:
    """One testsuite, one testcase per phase, a failure element with the trace."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites, "testsuite", name="kvpool.conform", tests=str(len(results)),
        failures=str(sum(not r.ok for r in results)), errors="0",
        time=f"{sum(r.seconds for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"kvpool.conform.{adapter.name}",
                             name=r.name, time=f"{r.seconds:.3f}")
        if r.failure is not None:
            failure = ET.SubElement(case, "failure", message=r.failure.message,
                                    type=r.failure.kind)
            failure.text = "\n".join([*r.failure.trace, "", r.failure.details])
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True))


# ------------------------------------------------------------------- main


@dataclass
class _Args:
    impl: str | None
    adapter: str | None
    json: str | None
    junit: str | None
    opts: Options = field(default_factory=Options)


def _parse(argv: Sequence[str] | None) -> _Args:
    ns = _parser().parse_args(argv)
    for flag in ("steps", "runs", "examples", "machine_steps"):
        if getattr(ns, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")
    from kvpool.model import REFERENCES

    if ns.reference not in REFERENCES:
        raise UsageError(f"--reference {ns.reference!r}: choose from {', '.join(REFERENCES)}")
    opts = Options(steps=ns.steps, runs=ns.runs, examples=ns.examples,
                   machine_steps=ns.machine_steps, seed=ns.seed, misuse=not ns.no_misuse,
                   reference=ns.reference)
    return _Args(ns.impl, ns.adapter, ns.json, ns.junit, opts)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``kvpool conform`` command; returns the exit status (0, 1 or 2)."""
    out = out or sys.stdout
    try:
        args = _parse(argv)
        _check_writable("--json", args.json)
        _check_writable("--junit", args.junit)
        adapter = load_adapter(args.impl, args.adapter)
    except UsageError as exc:
        print(f"kvpool conform: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    results = conform(adapter, args.opts, out)
    try:
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(result_document(adapter, args.opts, results), fh, indent=2)
                fh.write("\n")
        if args.junit:
            with open(args.junit, "wb") as fb:
                fb.write(junit_xml(adapter, results))
    except OSError as exc:
        print(f"kvpool conform: error: cannot write results: {exc}", file=sys.stderr)
        return 2
    return 0 if all(r.ok for r in results) else 1


__all__ = ["SCHEMA", "Options", "PhaseResult", "UsageError", "conform", "junit_xml",
           "load_adapter", "main", "result_document", "run_campaign_phase", "run_machine_phase"]


if __name__ == "__main__":
    raise SystemExit(main())
