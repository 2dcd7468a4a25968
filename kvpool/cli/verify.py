"""``kvpool verify``'s command line: the profile, the budget, the targets, the outputs.

Everything that can be checked before the run is (a budget that is not
positive, an unknown ``--reference``, an unreadable trace, an output that
cannot be written, an implementation that cannot be loaded), so that a
mistake costs a line on stderr, not a minute of proofs.  The run itself is
:mod:`kvpool.verify`'s.

Exit status: 0 when every case passed, 1 when any failed (a counterexample,
an ``unknown`` proof, a divergence), 2 on a usage error, reported in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from kvpool.verify import (
    PHASES,
    PROFILES,
    Settings,
    Shard,
    ShardError,
    Target,
    make_progress,
    run,
    summary,
    write_outputs,
)

from .usage import UsageError, check_writable, command_parser, example_db_option, fail, load_adapter

BUDGET_OPTIONS = (("bmc-depth", int, "BMC depth, for every pool"),
                  ("bmc-seconds", float, "BMC time per run (a safety net: a run it cuts fails)"),
                  ("agreement-depth", int, "agreement depth, for every pool"),
                  ("agreement-seconds", float, "agreement time per pool (a cut pool fails)"),
                  ("refinement-depth", int, "refinement depth, for every pool"),
                  ("refinement-seconds", float, "time per refinement run (a cut run fails)"),
                  ("steps", int, "calls per lockstep/campaign run"),
                  ("runs", int, "lockstep/campaign runs"),
                  ("examples", int, "state-machine examples per implementation"),
                  ("machine-steps", int, "rules per state-machine example"),
                  ("timeout-ms", int, "z3 timeout per proof"))
"""The options that override one field of the profile's budget: flag, type, help."""


def parser() -> argparse.ArgumentParser:
    """The ``kvpool verify`` parser (tests/test_recipes.py reads the CI recipes with it)."""
    p = command_parser(
        "kvpool verify",
        "Run the z3 proofs, their encoding against the model, the seeded bugs, bounded\n"
        "model checking, the lockstep campaign and the bounded refinement of kvpool.impl,\n"
        "and the conformance of every implementation given, under a profile or an explicit\n"
        "budget. Exit 0 if everything passed, 1 on a found violation, 2 on a usage error.",
        "examples:\n"
        "  kvpool verify\n"
        "  kvpool verify --profile dev --junit verify.xml --json verify.json --report out/\n"
        "  kvpool verify --impl mypkg.pool:BlockPool --skip proofs --skip seeded-bugs\n"
        "  kvpool verify --trace run.jsonl --events kv-events.jsonl\n"
        "  kvpool verify --profile deep --shard 3/32 --json shard-3.json   # then kvpool merge", raises=True)
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci",
                   help="budget preset: ci (default, minutes), dev, deep, pool")
    p.add_argument("--impl", action="append", default=[], metavar="MODULE:CLASS",
                   help="a pool class with the reference API to check for conformance (repeatable)")
    p.add_argument("--adapter", action="append", default=[], metavar="MODULE:FACTORY",
                   help="a callable returning a kvpool.oracle.core.adapter.Adapter (repeatable)")
    p.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="a recorded JSONL trace to replay on the model (repeatable)")
    p.add_argument("--events", action="append", default=[], metavar="FILE",
                   help="a KV-event stream (or trace) to check as a router would (repeatable)")
    p.add_argument("--vllm-errors", action="store_true",
                   help="traces: accept ValueError where the model raises NotEnoughFreeBlocksError")
    p.add_argument("--reference", default="0.31", metavar="VERSION",
                   help="vLLM behaviour the model reproduces: 0.31 (default) or 0.33")
    p.add_argument("--no-misuse", action="store_true", help="conformance: leave out deliberately wrong calls")
    p.add_argument("--skip", action="append", default=[], choices=PHASES, help="leave a phase out")
    p.add_argument("--shard", metavar="I/N",
                   help="run shard I of N (1 <= I <= N) of the work; kvpool merge joins the shards' --json")
    budget = p.add_argument_group("budget (overrides the profile)")
    for name, kind, what in (*BUDGET_OPTIONS, ("seed", int, "first random seed")):
        budget.add_argument(f"--{name}", type=kind, help=what, metavar="N" if kind is int else "S")
    out = p.add_argument_group("outputs")
    out.add_argument("--json", metavar="FILE", help="write the result document (kvpool/VERIFY_SCHEMA.md)")
    out.add_argument("--junit", metavar="FILE", help="write JUnit XML, one testcase per check")
    out.add_argument("--report", metavar="DIR", help="write report.md and report.html for reviewers")
    out.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    return p


def settings_from(argv: Sequence[str] | None) -> Settings:
    """Parse and check everything that can be checked before the run; raise UsageError."""
    # lazy: the oracle only to check --traces/--events files before the run
    from kvpool.model import REFERENCES

    ns = parser().parse_args(argv)
    budget = PROFILES[ns.profile]
    names = [flag.replace("-", "_") for flag, _kind, _what in BUDGET_OPTIONS] + ["seed"]
    custom = {name: value for name in names if (value := getattr(ns, name)) is not None}
    for name, value in custom.items():
        if name != "seed" and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    for depth, pools in (("bmc_depth", "bmc_pools"), ("agreement_depth", "agreement_pools")):
        if depth in custom:  # an explicit depth is every pool's, the profile's own depths dropped
            custom[pools] = tuple(p[:2] for p in getattr(budget, pools))
    profile = ns.profile if not custom else f"{ns.profile}+custom"
    if ns.reference not in REFERENCES:
        raise UsageError(f"--reference {ns.reference!r}: choose from {', '.join(REFERENCES)}")
    for flag, path in [("--trace", p) for p in ns.trace] + [("--events", p) for p in ns.events]:
        _check_readable(flag, path)
    for flag, path in (("--json", ns.json), ("--junit", ns.junit)):
        if path and os.path.dirname(path):
            _check_directory(flag, os.path.dirname(path))
        check_writable(flag, path)
    if ns.report:
        _check_directory("--report", ns.report)
    targets = [Target(spec, load_adapter(spec, None)) for spec in ns.impl]
    targets += [Target(spec, load_adapter(None, spec)) for spec in ns.adapter]
    if budget.skip and not (targets or ns.trace or ns.events):
        raise UsageError(f"--profile {ns.profile} checks the pool you give: "
                         "add --impl MODULE:CLASS, --adapter MODULE:FACTORY, --trace or --events")
    try:
        shard = Shard() if ns.shard is None else Shard.parse(ns.shard)
    except ShardError as exc:
        raise UsageError(f"--shard {exc}") from None
    return Settings(profile, replace(budget, **custom), targets, ns.trace, ns.events,
                    ns.vllm_errors, ns.reference, not ns.no_misuse, set(ns.skip) | set(budget.skip),
                    ns.json, ns.junit, ns.report, ns.plain, shard, example_db_option() if targets else None)


def _check_readable(flag: str, path: str) -> None:
    """A trace or event file must exist and be JSON lines before an expensive run starts."""
    # lazy: the oracle only to check --traces/--events files before the run
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



def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``kvpool verify`` command; returns 0, 1 or 2."""
    out = out or sys.stdout
    try:
        cfg = settings_from(argv)
    except UsageError as exc:
        return fail(f"kvpool verify: error: {exc}")
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    progress = make_progress(out, True if cfg.plain else None)
    try:
        doc = run(cfg, progress)
    finally:
        progress.close()
    try:
        written = write_outputs(doc, json_path=cfg.json, junit=cfg.junit, report=cfg.report)
    except OSError as exc:
        return fail(f"kvpool verify: error: cannot write results: {exc}")
    print(summary(doc, written), file=out)
    return int(doc["exit_code"])


__all__ = ["main", "parser", "settings_from"]
