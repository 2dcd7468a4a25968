"""``--exec "CMD ARGS"`` for ``kvpool conform`` and ``kvpool check``: a pool in any language.

The command is split as a POSIX shell splits it and run as the pool, spoken
to over its stdin and stdout in the drive protocol
(``oracle/DRIVE_PROTOCOL.md``, :mod:`kvpool.oracle.drive`).  The phases run as
for a Python pool; each failure is printed as a short trace and written as a
trace file (``--trace-dir``, default the current directory) that
``kvpool check-trace`` replays.  Every process is ended before the command
returns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvpool.oracle.drive.adapter import DEFAULT_TIMEOUT, DriveAdapter
from kvpool.oracle.drive.process import ProcessFailure, ProcessHung

from .usage import UsageError, fail

if TYPE_CHECKING:  # the failure module loads Hypothesis: only once a run needs it
    from kvpool.oracle.drive.failure import DriveRun

PRINTED = 30
"""Most lines of a failure's trace printed (the file has them all)."""


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options that go with ``--exec`` (the flag itself joins each command's target group)."""
    group = parser.add_argument_group("with --exec (a pool in another process)")
    group.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help=f"seconds the process may take over one answer ({DEFAULT_TIMEOUT:g})")
    group.add_argument("--trace-dir", default=".", metavar="DIR",
                       help="where a failure's trace is written, kvpool-drive-PHASE.jsonl (., made if "
                            "missing)")
    group.add_argument("--no-shrink", action="store_true",
                       help="keep a failure as it happened: no delta debugging of a campaign run's "
                            "calls (any pool), no shrinking of a trace against the process")
    group.add_argument("--vllm-errors", action="store_true",
                       help="accept ValueError where the model refuses for lack of blocks")


def exec_adapter(command: str, ns: argparse.Namespace, reference: str, misuse: bool) -> DriveAdapter:
    """The adapter for ``--exec``, checked by making one pool; a command that cannot start, or
    bad options, raise :class:`UsageError` (a process that answers wrongly is a failure, later)."""
    if ns.timeout <= 0:
        raise UsageError("--timeout must be positive")
    trace_dir = Path(ns.trace_dir)
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--trace-dir {ns.trace_dir!r}: cannot make it: {exc.strerror or exc}") from None
    if not trace_dir.is_dir() or not os.access(trace_dir, os.W_OK):
        raise UsageError(f"--trace-dir {ns.trace_dir!r}: not a writable directory")
    try:
        adapter = DriveAdapter.from_command(command, timeout=ns.timeout, reference=reference,
                                            misuse=misuse, vllm_errors=ns.vllm_errors)
    except ValueError as exc:
        raise UsageError(f"--exec {command!r}: {exc}") from None
    try:
        adapter.lacks  # noqa: B018 - a first pool, made to ask what the process lacks
    except (ProcessFailure, ProcessHung) as exc:
        adapter.close()
        if exc.verdict.kind == "start":
            raise UsageError(f"--exec {command!r}: {exc.verdict.what}") from None
        raise NoPool(exc.verdict.format()) from None
    return adapter


class NoPool(Exception):
    """The process could not make a first pool (wrong version, refusal, garbage, a hang, a crash):
    no phase can run; the verdict is reported and the command exits 4."""


def report(run: DriveRun, out: TextIO, meta: dict[str, Any]) -> None:
    """Write each failed phase's trace and print it short, with what check-trace says of it."""
    # lazy: a subcommand loads the oracle (Hypothesis) only when it runs
    from kvpool.oracle.drive.failure import short_line

    for name, (path, shrunk) in run.traces(meta).items():
        how = shrunk.note or (f"shrunk from {shrunk.before:,} trace lines against the process, "
                              f"{shrunk.replays} replays" if shrunk.before != len(shrunk.lines)
                              else "as it happened")
        count = len(shrunk.lines)
        print(f"{name}: the pool's calls as a trace: {path} ({count} trace line{'s' * (count != 1)}; {how})",
              file=out)
        pool = {k: v for k, v in shrunk.pool.items() if k != "metrics_collector"}
        print(f"  the pool: {json.dumps(pool, separators=(', ', ': '))}", file=out)
        shown = shrunk.lines[-PRINTED:]
        if len(shrunk.lines) > PRINTED:
            print(f"    ... {len(shrunk.lines) - PRINTED} trace lines before these", file=out)
        first = len(shrunk.lines) - len(shown) + 1
        differs = shrunk.report.divergence
        for number, line in enumerate(shown, start=first):
            model = differs.diffs if differs is not None and differs.step == number else None
            print(f"  {short_line(number, line, model)}", file=out)
        print(f"  kvpool check-trace {shlex.quote(str(path))}"
              f"{' --vllm-errors' if run.adapter.vllm_errors else ''}:", file=out)
        for text in shrunk.report.format().splitlines():
            print(f"    {text}", file=out)


def verdicts(adapter: DriveAdapter, out: TextIO) -> bool:
    """End every process and say how each ended, once per distinct way (the phases' failures were
    printed with them).  True when one broke the protocol at the end (it wrote more, or did not
    exit at the end of its stdin, or exited with an error): a failure of the process too."""
    ended = adapter.close()
    seen = Counter((verdict.kind, verdict.what) for verdict in ended)
    for verdict in ended:
        count = seen.pop((verdict.kind, verdict.what), 0)
        if count:
            copies = f" ({count} copies of the process)" if count > 1 else ""
            print(f"at the end{copies}: {verdict.format()}", file=out)
    return bool(ended)


def meta_of(command: Sequence[str], tool: str, seed: int) -> dict[str, Any]:
    return {"tool": tool, "command": shlex.join(command), "seed": seed}


def check_exec(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``kvpool check --exec``: the seeded campaign against the process, as for a Python pool,
    with every option ``check`` has (``--blocks``, ``--long-lived``, ``--lacks``, ...)."""
    # lazy: a subcommand loads the oracle (Hypothesis) only when it runs
    from kvpool.oracle.core.adapter import misuse_setting
    from kvpool.oracle.drive.failure import DriveRun
    from kvpool.oracle.generate.capabilities import Capabilities
    from kvpool.oracle.search.conform import Options, run_campaign_phase

    out = out or sys.stdout
    try:
        adapter = exec_adapter(ns.exec, ns, ns.reference, not ns.no_misuse)
    except UsageError as exc:
        return fail(f"kvpool check: error: {exc}")
    except NoPool as exc:
        print(f"kvpool check: {exc}", file=out)
        return 4
    _misuse, why = misuse_setting(adapter, not ns.no_misuse)
    print(f"kvpool check: {adapter.name}; {why}", file=out)
    lacks = frozenset(ns.lacks) | adapter.lacks
    for line in Capabilities.of(lacks).not_checked():
        print(f"  {line}", file=out)
    run = DriveRun(adapter, Path(ns.trace_dir), shrink=not ns.no_shrink)
    phase = run.phase(run_campaign_phase)
    results: list[Any] = []
    try:
        for number in range(ns.runs):
            seed = ns.seed + number
            opts = Options(steps=ns.steps, runs=1, seed=seed, misuse=not ns.no_misuse,
                           reference=ns.reference, blocks=ns.blocks, long_lived=ns.long_lived,
                           shrink=not ns.no_shrink, lacks=lacks)
            result = phase(adapter, opts)
            results.append(result)
            if result.ok:
                print(f"run {number + 1}/{ns.runs} seed {seed}: ok ({result.executed:,} workload calls)",
                      file=out)
                continue
            failure = result.failure
            what = "FAILED (the pool process failed)" if failure and failure.kind == "process" else "DIVERGED"
            details = failure.details if failure else ""
            print(f"run {number + 1}/{ns.runs} seed {seed}: {what}\n{details}", file=out)
            break  # this run's trace is the one written
        agreed = sum(r.ok for r in results)
        calls = sum(r.executed for r in results)
        print(f"{agreed}/{ns.runs} runs agree; {calls:,} workload calls, {adapter.protocol_lines():,} "
              "protocol lines" + ("" if agreed == len(results) else "; stopped at the first failure"),
              file=out)
        report(run, out, meta_of(adapter.command, "kvpool check --exec", ns.seed))
    except (ProcessFailure, ProcessHung) as exc:  # a pool the report made failed: its verdict
        print(exc.verdict.format(), file=out)
        results.append(None)
    finally:
        badly = verdicts(adapter, out)
    kinds = {r.failure.kind if r is not None and r.failure is not None else "process"
             for r in results if r is None or not r.ok}
    if kinds - {"process"}:
        return 1
    return 4 if kinds or badly else 0


__all__ = ["NoPool", "add_options", "check_exec", "exec_adapter", "meta_of", "report", "verdicts"]
