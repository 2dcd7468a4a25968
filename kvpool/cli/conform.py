"""``kvpool conform``: check any block pool implementation against the model.

Two phases run against the implementation (:mod:`kvpool.oracle.search.conform`), each
compared call by call with the model:

* ``campaign`` -- seeded random workloads (:func:`kvpool.oracle.search.campaign.run_one`),
  ``--runs`` runs of ``--steps`` calls each: long and fast; a divergence is shrunk by
  delta debugging over the run's calls (:mod:`kvpool.oracle.search.shrink`);
* ``machine`` -- the Hypothesis state machine (:mod:`kvpool.oracle.search.machine`),
  ``--examples`` examples of up to ``--machine-steps`` rules: a failure is
  shrunk to a minimal trace of readable steps.

Exit status: 0 when both agree with the model, 1 on a divergence (or a crash
of an implementation in this process), 2 on a usage error (bad
``--impl``/``--adapter``, a class without the pool API, an output file that
cannot be written), reported as one line without a traceback, 3 when only a
caller contract was broken, 4 when a pool process failed (crashed, hung,
broke the protocol, did not end cleanly) and no divergence was found, 5 on an
error of kvpool itself (with its traceback: a bug to report).

``--lacks NAMES`` (and what the pool declares: a class's ``kvpool_lacks``, a
process's header answer) names operations, call features and pool shapes the
pool does not have: no call with any of them is made, and the first lines
say what was not checked.

``--json FILE`` writes this document (schema ``kvpool.conform/1``)::

    {
      "schema": "kvpool.conform/1",
      "implementation": "pkg.module:Class",   # the adapter's name
      "ok": true,                             # every phase agreed
      "exit_code": 0,                         # 0 agree, 1 divergence, 3 caller broke a contract,
                                              # 4 a pool process failed
      "shard": [1, 2] | null,                 # --shard I/N; null: the whole run (or merged)
      "merged": null | [[1, 2], [2, 2]],      # kvpool merge: the shards joined
      "settings": {"steps": 1000, "runs": 4, "examples": 200, "machine_steps": 25,
                   "seed": 0, "misuse": true, "reference": "0.31", "shard": [1, 1],
                   "database": null | "redis://HOST:PORT/N" | "DIR",  # KVPOOL_EXAMPLE_DB
                   "blocks": null | 65536, "long_lived": false,  # the campaign's pools
                   "lacks": ["mask", ...]},   # what the pool lacks (declared), never made
      "phases": [
        {"name": "campaign",                  # then "machine"
         "ok": false,
         "seconds": 0.42,
         "executed": 4000,                    # campaign: lockstep calls; machine:
                                              # state machines run (examples, shrinks)
         "replayed": false,                   # the failure came from replaying the
                                              # example database, before generating
         "failure": null | {
            "kind": "divergence" | "crash" | "process" | "contract",
                                              # crash: the pool raised outside a call;
                                              # process: a pool process failed (its verdict)
            "message": "free_blocks: model raised ...",   # first line
            "details": "full message, with the last lockstep calls",
            "trace": ["step 3: get_new_blocks(1) -> [1]", ...],
                                              # campaign: the shrunk calls (else the last ones);
                                              # machine: the shrunk Hypothesis steps
            "seed": 2,                        # the campaign run's seed (machine: --seed)
            "shrunk_from": 1790 | null,       # campaign: the run's calls before delta debugging
                                              # cut them to "trace" (null: not shrunk)
            "shrink_note": "",                # why a campaign failure was not shrunk
            "requests": ["r3: tokens [...], lora 'lora1'", ...],  # those a shrunk trace names
            "steps": [...]                    # the last calls with a picture of the pool
                                              # each: TraceStep of kvpool/VERIFY_SCHEMA.md
         }}
      ],
      "coverage": [                           # only with --coverage: one per phase
        {"phase": "campaign", "misuse": true,  # the phase alone, under coverage.py
         "covered": 114, "total": 116,        # branches of the model's operations taken
         "missed": [{"line": 221, "to": 222, "source": "if b == NULL and ...:",
                     "into": "continue", "refusal": false,
                     "why": "needs misuse" | "caller contract" | "caller action"
                            | "the pool lacks it" | "another --reference"
                            | "reachable without misuse"}, ...],
         "pairs": {"met": 197, "legal": 197, "missed": ["mask+second_pool", ...]},
                                              # features met in one call (oracle/generate/features.py)
         "pool": {"covered": 269, "total": 410,  # the pool's own source's branches
                  "files": [["/.../pool.py", 120, 150], ...]}}
      ]
    }

``--coverage`` runs each phase alone under coverage.py and reports the
branches of the model's operations (``model/pool.py``, ``guards.py``, ``contracts.py``) it reached and those
it missed (line -> line, with both source lines): a branch no phase reaches
is one on which no pool is compared with the model.

``--phase campaign|machine`` runs one phase, ``--fail-fast`` stops at the first that
diverges, ``--no-shrink`` keeps a campaign failure as it happened.  A pool other than
kvpool's may refuse for lack of blocks with any ``ValueError`` (``--strict-messages``:
vLLM's exact message).  The loggers of the pool's module are silenced unless
``--verbose``; Hypothesis' files go to the cache folder the output names
(``$KVPOOL_CACHE``, else ``$XDG_CACHE_HOME/kvpool``, else ``~/.cache/kvpool``).
``docs/implementing.md`` is a pool author's first hour.

``--shard I/N`` runs shard ``I`` of ``N``: the campaign's runs ``r`` with
``r mod N == I - 1`` and its share of the state machine's examples under its
own seed; ``kvpool merge`` joins the shards' documents (``docs/scale.md``).
``KVPOOL_EXAMPLE_DB`` (a directory or ``redis://HOST:PORT/N``) is Hypothesis'
example database: failures saved there are replayed first.

``--junit FILE`` writes JUnit XML: one ``testsuite`` named ``kvpool.conform``
with one ``testcase`` per phase (``campaign``, ``machine``), a ``failure``
element carrying the trace when the phase diverged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields, replace
from pathlib import Path
from traceback import format_exception, print_exc
from typing import Any, TextIO

from kvpool.model import REFERENCES
from kvpool.oracle.core.adapter import Adapter, lacking, misuse_setting
from kvpool.oracle.drive.adapter import DriveAdapter
from kvpool.oracle.generate.capabilities import Capabilities, declared_lacks, parse_lacks
from kvpool.oracle.generate.long_lived import LONG_LIVED_RUNS, LONG_LIVED_STEPS
from kvpool.oracle.search.conform import (
    Failure,
    Options,
    PhaseResult,
    observation_level,
    run_campaign_phase,
    run_machine_phase,
)
from kvpool.oracle.search.coverage import PhaseCoverage, measure_phase
from kvpool.oracle.search.database import describe, use_cache_dir
from kvpool.pictures import pictured_steps
from kvpool.shard import Shard, ShardError

from . import drive
from .usage import (
    UsageError,
    add_scale_options,
    check_scale,
    check_writable,
    command_parser,
    example_db_option,
    fail,
    load_adapter,
)

SCHEMA = "kvpool.conform/1"
Phase = Callable[[Adapter, Options], PhaseResult]


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "kvpool conform",
        "Run the lockstep campaign and the Hypothesis state machine against a\n"
        "block pool implementation. Exit 0 if it agrees with the model, 1 on a\n"
        "divergence (the minimal trace is printed), 2 on a usage error, 3 when\n"
        "only a caller contract was broken, 4 when a pool process failed (and\n"
        "nothing diverged), 5 on an error of kvpool itself.",
        "examples:\n  kvpool conform --impl kvpool.impl:BlockPool\n"
        "  kvpool conform --impl vllm.v1.core.block_pool:BlockPool --no-misuse --json out.json", raises=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--impl", metavar="MODULE:CLASS",
                        help="a pool class with the reference (vLLM BlockPool) API; "
                             "kvpool.impl's pool and its subclasses must refuse misuse with "
                             "the model's typed errors, other classes run without misuse")
    target.add_argument("--adapter", metavar="MODULE:FACTORY",
                        help="a callable returning a kvpool.oracle.core.adapter.Adapter")
    target.add_argument("--exec", metavar='"CMD ARGS"',
                        help="a pool in another process (any language), spoken to over its stdin and "
                             "stdout in the drive protocol (oracle/DRIVE_PROTOCOL.md)")
    parser.add_argument("--traceback", action="store_true",
                        help="on a failure, show where in the pool its own exception was raised")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"workload steps per campaign run (1000; {LONG_LIVED_STEPS} with --long-lived)")
    parser.add_argument("--runs", type=int, default=None,
                        help=f"campaign runs (4; {LONG_LIVED_RUNS} with --long-lived)")
    add_scale_options(parser)
    parser.add_argument("--examples", type=int, default=200, help="state-machine examples (200)")
    parser.add_argument("--machine-steps", type=int, default=25, help="rules per state-machine example (25)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both phases (0)")
    parser.add_argument("--reference", default="0.31",
                        help="vLLM version whose behaviour the model reproduces (0.31)")
    parser.add_argument("--shard", metavar="I/N",
                        help="run shard I of N (1 <= I <= N); kvpool merge joins the shards' --json")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML, one testcase per phase")
    parser.add_argument("--no-misuse", action="store_true",
                        help="leave out deliberately wrong calls (always off for pools that do not refuse "
                             "misuse, like vLLM's)")
    parser.add_argument("--coverage", action="store_true",
                        help="measure the branches of the model's operations (model/pool.py, guards.py, "
                             "contracts.py) each phase reaches alone, and list those it misses (needs "
                             "coverage.py)")
    parser.add_argument("--phase", choices=("campaign", "machine"),
                        help="run one phase only (both by default)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first phase that diverges")
    parser.add_argument("--strict-messages", action="store_true",
                        help="a pool other than kvpool's must refuse for lack of blocks with vLLM's exact "
                             "ValueError message (by default any ValueError counts)")
    parser.add_argument("--verbose", action="store_true",
                        help="let the pool's own log lines through (its module's loggers are silenced)")
    parser.add_argument("--lacks", metavar="NAMES", default="",
                        help="what the pool lacks, besides what it declares (operations, features and "
                             "shapes, as --coverage names them; commas or spaces): no call with any is "
                             "made; the first lines say what is not checked")
    drive.add_options(parser)
    return parser


def conform(adapter: Adapter, opts: Options, out: TextIO,
            traceback: bool = False,
            coverage: list[PhaseCoverage] | None = None,
            phases: Sequence[Phase] = (run_campaign_phase, run_machine_phase),
            fail_fast: bool = False, verbose: bool = False) -> list[PhaseResult]:
    """Run the phases, printing a line each and the details of any failure.

    With a ``coverage`` list, each phase runs under coverage.py and its measurement is appended;
    ``phases``: the phase functions (``--exec`` wraps each, :mod:`.drive`).
    """
    _misuse, why = misuse_setting(adapter, opts.misuse)
    index, count = opts.shard
    print(f"kvpool conform: {adapter.name} against the model (vLLM {opts.reference} "
          f"behaviour, seed {opts.seed}{'' if count == 1 else f', shard {index + 1}/{count}'})",
          file=out)
    print(f"  hypothesis files: {use_cache_dir()}; example database: "
          f"{'none (KVPOOL_EXAMPLE_DB names one)' if opts.database is None else describe(opts.database)}",
          file=out)
    print(f"  {why}", file=out)
    for line in Capabilities.of(opts.lacks).not_checked():
        print(f"  {line}", file=out)
    pool_class = getattr(adapter, "pool_class", None)
    if pool_class is not None and (lacks := lacking(pool_class)):
        print(f"  not called (the pool lacks them, as it may): {', '.join(lacks)}", file=out)
    with quiet(pool_loggers(adapter) if not verbose else []) as silenced:
        if silenced:
            print(f"  the pool's log lines are silenced ({', '.join(silenced)}; --verbose shows them)",
                  file=out)
        level = observation_level(adapter, opts.reference)
        skipped = [name for name, how in level["checks"].items() if how.startswith("skipped")]
        print(f"  observed {level['level']}" + (f"; skipped: {', '.join(skipped)}" if skipped else ""),
              file=out)
        results = []
        for phase in phases:
            if coverage is None:
                result = phase(adapter, opts)
            else:
                result, measured = measure_phase(phase, adapter, opts)
                coverage.append(measured)
            results.append(result)
            what = "workload calls" if result.name == "campaign" else "examples"
            status = "ok" if result.ok else _status(result.failure)
            if result.replayed:
                status += ", replayed from the example database"
            lines = getattr(adapter, "protocol_lines", None)
            sent = f" ({lines():,} protocol lines so far)" if callable(lines) else ""
            print(f"{result.name}: {status}, {result.executed:,} {what} in {result.seconds:.1f}s{sent}",
                  file=out)
            if coverage is not None:
                _print_coverage(coverage[-1], out)
            if result.failure is not None:
                _print_failure(result, out, traceback)
                if fail_fast:
                    print("  --fail-fast: the other phases are not run", file=out)
                    break
        code = exit_code(results)
        print("agrees with the model" if code == 0 else "DIVERGES from the model" if code == 1
              else "FAILED: " + {3: "the calls broke a caller contract", 4: "the pool process failed"}.get(
                  code, "see above"), file=out)
        return results


def _status(failure: Failure | None) -> str:
    kind = failure.kind if failure is not None else "?"
    return {"process": "FAILED (the pool process failed)",
            "contract": "STOPPED (the calls broke a caller contract)"}.get(kind, f"DIVERGED ({kind})")


def pool_loggers(adapter: Adapter) -> list[str]:
    """The loggers of the pool's module and of its top package (where its log lines go)."""
    cls = getattr(adapter, "pool_class", None)
    if cls is None:
        try:
            cls = type(adapter.construct(2, True, 1, False))
        except Exception:  # the run reports what a pool that cannot be built does
            return []
    module = str(getattr(cls, "__module__", "") or "")
    return list(dict.fromkeys(n for n in (module.split(".")[0], module) if n and n != "builtins"))


@contextlib.contextmanager
def quiet(names: Sequence[str]) -> Iterator[list[str]]:
    """The loggers ``names`` (and their children) silenced for the duration; their levels restored."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield list(names)
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _print_coverage(measured: PhaseCoverage, out: TextIO) -> None:
    lacked = sum(b.lacked for b in measured.missed)
    print(f"  model branches reached: {measured.covered}/{measured.total} "
          f"({measured.percent:.1f}%), {len(measured.missed)} missed, {len(measured.gaps)} of them "
          f"reachable without misuse" + (f", {lacked} in operations the pool lacks" if lacked else "")
          + (":" if measured.missed else ""), file=out)
    for branch in measured.missed:
        print(f"    [{branch.why}] {branch}", file=out)
    pool = measured.pool
    if pool is not None:
        names = ", ".join(os.path.basename(f) for f, _c, _t in pool.files)
        print(f"  the pool's own branches reached: {pool.covered}/{pool.total} ({pool.percent:.1f}%) "
              f"in {names}", file=out)
    pairs = measured.pairs
    if pairs is not None:
        print(f"  feature pairs met in one call: {pairs.met}/{pairs.legal} legal"
              f"{', missed: ' if pairs.missed else ''}{', '.join('+'.join(p) for p in pairs.missed)}",
              file=out)


def _indented(lines: Iterable[str], out: TextIO) -> None:
    for line in lines:
        print(f"    {line}", file=out)


def _print_failure(result: PhaseResult, out: TextIO, traceback: bool) -> None:
    failure = result.failure
    if failure is None:
        return
    if failure.kind == "process":  # the process's verdict (with its stderr), once
        _indented(failure.details.splitlines(), out)
        return
    if result.name == "machine":
        print(f"  minimal trace ({len(failure.trace)} steps, shrunk by Hypothesis):", file=out)
        _indented(failure.trace, out)
        print("  lockstep says:", file=out)
    elif failure.shrunk_from is not None:
        print(f"  run with seed {failure.seed}: {failure.shrunk_from:,} workload calls, shrunk to "
              f"{len(failure.trace)} (delta debugging, each cut replayed on fresh pools):", file=out)
        _indented([f"request {request}" for request in failure.requests], out)
        _indented([f"{number}. {step}" for number, step in enumerate(failure.trace, start=1)], out)
        print("  lockstep says (on the shrunk calls):", file=out)
    else:
        note = f" ({failure.shrink_note})" if failure.shrink_note else ""
        print(f"  run with seed {failure.seed}{note}:", file=out)
    _indented(failure.details.splitlines(), out)
    if failure.cause is not None and getattr(failure.cause, "verdict", None) is None:
        if traceback:
            print("  the pool's own exception:", file=out)
            _indented("".join(format_exception(failure.cause)).rstrip().splitlines(), out)
        else:
            print(f"  the pool raised {type(failure.cause).__name__}; --traceback shows where", file=out)


# ---------------------------------------------------------------- outputs


def result_document(adapter: Adapter, opts: Options, results: list[PhaseResult],
                    coverage: list[PhaseCoverage] | None = None) -> dict[str, Any]:
    """The JSON document described in the module docstring."""
    index, count = opts.shard
    misuse, why = misuse_setting(adapter, opts.misuse)
    doc = {
        "schema": SCHEMA, "implementation": adapter.name, "ok": all(r.ok for r in results),
        "exit_code": exit_code(results), "shard": None if count == 1 else [index + 1, count], "merged": None,
        "settings": {**opts.settings_json(), "misuse": misuse}, "misuse": why,
        "observation": observation_level(adapter, opts.reference),
        "phases": [{"name": r.name, "ok": r.ok, "seconds": round(r.seconds, 3), "executed": r.executed,
                    "replayed": r.replayed, "failure": None if r.failure is None else failure_json(r.failure)}
                   for r in results],
    }
    if coverage is not None:
        doc["coverage"] = [c.to_json() for c in coverage]
    return doc


def failure_json(f: Failure) -> dict[str, Any]:
    """A phase's failure as the document holds it, with a picture of each last call."""
    out: dict[str, Any] = {x.name: getattr(f, x.name) for x in fields(f)
                           if x.name not in ("divergence", "cause")}
    out["steps"] = pictured_steps(f.divergence) if f.divergence is not None else []
    return out


# ------------------------------------------------------------------- main


def _parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Options]:
    parser = _parser()
    ns = parser.parse_args(argv)
    check_scale(parser, ns, Options.steps, Options.runs)
    for flag in ("steps", "runs", "examples", "machine_steps"):
        if getattr(ns, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")
    if ns.reference not in REFERENCES:
        raise UsageError(f"--reference {ns.reference!r}: choose from {', '.join(REFERENCES)}")
    try:
        lacks = parse_lacks(ns.lacks)
    except ValueError as exc:
        raise UsageError(f"--lacks {exc}") from None
    if ns.coverage and importlib.util.find_spec("coverage") is None:
        raise UsageError("--coverage needs coverage.py: pip install coverage (or kvpool[test])")
    try:
        shard = Shard() if ns.shard is None else Shard.parse(ns.shard)
    except ShardError as exc:
        raise UsageError(f"--shard {exc}") from None
    if ns.coverage and not shard.whole:
        raise UsageError("--coverage measures a whole run: leave out --shard")
    return ns, Options(steps=ns.steps, runs=ns.runs, examples=ns.examples, machine_steps=ns.machine_steps,
                       seed=ns.seed, misuse=not ns.no_misuse, reference=ns.reference, shard=shard.part,
                       database=example_db_option(), blocks=ns.blocks, long_lived=ns.long_lived,
                       shrink=not ns.no_shrink, lacks=lacks)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``kvpool conform`` command; returns the exit status (:func:`exit_code`, or 2 on usage)."""
    out = out or sys.stdout
    try:
        ns, opts = _parse(argv)
        check_writable("--json", ns.json)
        check_writable("--junit", ns.junit)
        driven = None
        if ns.exec is not None:
            driven = drive.exec_adapter(ns.exec, ns, opts.reference, opts.misuse)
            opts = replace(opts, lacks=opts.lacks | driven.lacks)
        else:
            adapter = load_adapter(ns.impl, ns.adapter, strict_messages=ns.strict_messages, lacks=opts.lacks)
            opts = replace(opts, lacks=opts.lacks | declared_lacks(
                adapter, getattr(adapter, "pool_class", None)).declared)
    except UsageError as exc:
        return fail(f"kvpool conform: error: {exc}")
    except drive.NoPool as exc:
        print(f"kvpool conform: {exc}", file=out)
        return 4
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        if driven is not None:
            return _conform_exec(driven, ns, opts, out)
        coverage: list[PhaseCoverage] | None = [] if ns.coverage else None
        results = conform(adapter, opts, out, ns.traceback, coverage,
                          _chosen(ns, (run_campaign_phase, run_machine_phase)),
                          fail_fast=ns.fail_fast, verbose=ns.verbose)
        return _outputs(adapter, ns, opts, results, coverage)
    except Exception:  # a bug of kvpool's own, not the pool's: not a divergence's exit status
        print("kvpool conform: internal error (a bug in kvpool, not a finding about the pool); "
              "please report it with this traceback:", file=sys.stderr)
        print_exc()
        return 5


def _chosen(ns: argparse.Namespace, phases: Sequence[Phase]) -> list[Phase]:
    """The phases ``--phase`` names (both when it is not given), in order."""
    return [p for name, p in zip(("campaign", "machine"), phases, strict=True) if ns.phase in (None, name)]


def _conform_exec(adapter: DriveAdapter, ns: argparse.Namespace, opts: Options, out: TextIO) -> int:
    """``--exec``: the phases against the process, each failure kept as a trace (:mod:`.drive`)."""
    # lazy: the drive protocol only for --exec
    from kvpool.oracle.drive.failure import DriveRun
    from kvpool.oracle.drive.process import ProcessFailure, ProcessHung

    run = DriveRun(adapter, Path(ns.trace_dir), shrink=not ns.no_shrink)
    coverage: list[PhaseCoverage] | None = [] if ns.coverage else None
    results: list[PhaseResult] = []
    status = 4
    try:
        results = conform(adapter, opts, out, ns.traceback, coverage,
                          phases=_chosen(ns, [run.phase(run_campaign_phase), run.phase(run_machine_phase)]),
                          fail_fast=ns.fail_fast, verbose=True)
        drive.report(run, out, drive.meta_of(adapter.command, "kvpool conform --exec", opts.seed))
        status = _outputs(adapter, ns, opts, results, coverage)
    except (ProcessFailure, ProcessHung) as exc:  # between the phases (a probe, a shrink's pool)
        print(exc.verdict.format(), file=out)
    finally:
        badly = drive.verdicts(adapter, out)
    return 4 if badly and status == 0 else status


def _outputs(adapter: Adapter, ns: argparse.Namespace, opts: Options, results: list[PhaseResult],
             coverage: list[PhaseCoverage] | None) -> int:
    """Write ``--json``/``--junit`` (the JUnit XML made from the document, as ``kvpool merge`` makes
    it of the shards' documents); the exit status."""
    if not (ns.json or ns.junit):
        return exit_code(results)
    # lazy: kvpool.verify (the proofs' tables) only when an output is written
    from kvpool.verify import write_outputs
    from kvpool.verify.merge import conform_junit

    try:
        write_outputs(result_document(adapter, opts, results, coverage), json_path=ns.json, junit=ns.junit,
                      junit_of=conform_junit)
    except OSError as exc:
        return fail(f"kvpool conform: error: cannot write results: {exc}")
    return exit_code(results)


def exit_code(results: list[PhaseResult]) -> int:
    """0 every phase agreed, 1 a divergence or crash, 4 a pool process failed (and nothing
    diverged), 3 only a caller contract broken.

    A broken contract is the calls' fault, not the pool's: the model says nothing
    about what a pool does then (``kvpool.model.contracts``).
    """
    kinds = {r.failure.kind if r.failure is not None else "crash" for r in results if not r.ok}
    if not kinds:
        return 0
    if kinds & {"divergence", "crash"}:
        return 1
    return 4 if "process" in kinds else 3


__all__ = ["SCHEMA", "conform", "failure_json", "main", "result_document"]


if __name__ == "__main__":
    raise SystemExit(main())
