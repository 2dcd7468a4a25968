"""``kvpool corpus add TRACE...``: grow the legal corpus from traces (:mod:`kvpool.corpus`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvpool.oracle.trace.schema import TraceError

from .usage import command_parser, fail


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "kvpool corpus", "Grow the legal corpus (bmc/legal-corpus) from traces in the "
        "trace format: each legal trace that takes a branch, or a pair of branches in one call, of the "
        "model's guards, contracts and updates that the corpus does not is added, cut after its last "
        "call that does.",
        "example:\n  kvpool corpus add run1.jsonl run2.jsonl --into oracle/generate/corpus/grown")
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add the traces that reach something new")
    add.add_argument("traces", nargs="+", type=Path)
    add.add_argument("--into", type=Path, required=True, help="the corpus folder to write to")
    add.add_argument("--dry-run", action="store_true", help="say what would be added, write nothing")
    ns = p.parse_args(argv)
    missing = [str(t) for t in ns.traces if not t.is_file()]
    if missing:
        return fail(f"kvpool corpus: no such trace: {', '.join(missing)}")
    from kvpool.corpus import grow  # lazy: the model, the oracle and the branch tracer

    try:
        out = grow(ns.traces, ns.into, dry_run=ns.dry_run)
    except TraceError as exc:
        return fail(f"kvpool corpus: {exc}")
    print(f"the corpus reached {out.corpus:,} branches and pairs of branches")
    for g in out.traces:
        if g.refused:
            print(f"REFUSED {g.path}: {g.refused}")
        elif g.kept:
            print(f"added   {g.path}: {g.new:,} new, first {g.kept:,} of {g.calls:,} calls"
                  + (f" -> {g.written}" if g.written else " (dry run)"))
        else:
            print(f"skipped {g.path}: {g.calls:,} calls, nothing new")
    return 1 if any(g.refused for g in out.traces) else 0


__all__ = ["main"]
