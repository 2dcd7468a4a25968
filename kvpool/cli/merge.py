"""``kvpool merge``: the JSON results of a run's shards joined into one result, JUnit file and report.

``kvpool merge shard-*.json --json verify.json --junit verify.xml --report out/``
takes the ``--json`` documents of ``kvpool verify --shard I/N`` for every
``I`` (or of ``kvpool conform --shard I/N``) and writes what one unsharded run
would have written (:mod:`kvpool.verify.merge`).  Exit status: the merged
run's (0 passed, 1 a violation, 3 for conform when only a caller contract
broke), 2 when the files are not the shards of one run (a shard missing or
given twice, another profile or budget), unreadable, or an output cannot be
written; reported in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from kvpool.verify import summary, write_outputs
from kvpool.verify.merge import CONFORM_SCHEMA, MergeError, conform_junit, merge

from .usage import UsageError, check_writable, command_parser, fail


def parser() -> argparse.ArgumentParser:
    p = command_parser("kvpool merge",
                       "Join the --json results of kvpool verify --shard I/N (or kvpool conform\n"
                       "--shard I/N), one per shard, into the result of one run.",
                       "example:\n  kvpool merge shard-1.json shard-2.json --json verify.json "
                       "--junit verify.xml --report out/", raises=True)
    p.add_argument("files", nargs="+", metavar="FILE", help="a shard's --json result")
    p.add_argument("--json", metavar="FILE", help="write the merged result document")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML of the merged result")
    p.add_argument("--report", metavar="DIR", help="write report.md and report.html (kvpool verify results)")
    return p


def _read(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON: {exc}") from None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``kvpool merge`` command; returns the merged run's exit status, or 2."""
    out = out or sys.stdout
    try:
        ns = parser().parse_args(argv)
        check_writable("--json", ns.json)
        check_writable("--junit", ns.junit)
        docs = [_read(path) for path in ns.files]
        try:
            doc = merge(docs, ns.files)
        except MergeError as exc:
            raise UsageError(str(exc)) from None
        if ns.report and doc["schema"] == CONFORM_SCHEMA:
            raise UsageError("--report: kvpool conform results have no report; use --json or --junit")
    except UsageError as exc:
        return fail(f"kvpool merge: error: {exc}")
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        if doc["schema"] == CONFORM_SCHEMA:
            written = write_outputs(doc, json_path=ns.json, junit=ns.junit, junit_of=conform_junit)
            verdict = "agrees with the model" if doc["ok"] else "DIVERGES from the model"
            executed = ", ".join(f"{p['name']} {p['executed']}" for p in doc["phases"])
            print(f"kvpool merge: {len(docs)} shards of kvpool conform {doc['implementation']}: "
                  f"{executed}; {verdict} (exit {doc['exit_code']})", file=out)
            for w in written:
                print(f"  wrote {w}", file=out)
        else:
            written = write_outputs(doc, json_path=ns.json, junit=ns.junit, report=ns.report)
            print(summary(doc, written), file=out)
    except OSError as exc:
        return fail(f"kvpool merge: error: cannot write results: {exc}")
    return int(doc["exit_code"])


__all__ = ["main", "parser"]
