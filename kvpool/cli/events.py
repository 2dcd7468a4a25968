"""``kvpool check-events``: a KV-event stream read as a router rebuilding the prefix index reads it.

The checks and their rules are :mod:`kvpool.oracle.events_check`'s; this is
its command line: the file, the block sizes, and the report as text or JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kvpool.oracle.events_check import check_events
from kvpool.oracle.trace import TraceError


def _sizes(text: str) -> dict[int, int]:
    """``0=16,1=32`` -> {0: 16, 1: 32} (argparse type)."""
    try:
        pairs = [item.split("=") for item in text.split(",") if item]
        out = {int(g): int(n) for g, n in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GROUP=SIZE[,GROUP=SIZE...], got {text!r}") from None
    if any(n <= 0 for n in out.values()):
        raise argparse.ArgumentTypeError("block sizes must be positive")
    return out


def check_events_main(argv: Sequence[str] | None = None) -> int:
    """``kvpool check-events``: 0 no violation, 1 violations, 2 usage or unreadable file."""
    parser = argparse.ArgumentParser(
        prog="kvpool check-events",
        description="Read a KV-event stream (JSONL, one event per line, or a kvpool trace) "
                    "as a router rebuilding the prefix index would, and report each event "
                    "that breaks it, with its line.",
        epilog="examples:\n  kvpool check-events kv-events.jsonl --block-sizes 0=16\n"
               "  kvpool check-events run.jsonl --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--block-sizes", type=_sizes, default=None, metavar="G=N[,G=N]",
                        help="full block size per KV-cache group, to tell partial entries apart "
                             "(a trace header's block_sizes is used when present)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--limit", type=int, default=50, help="violations to print (default 50)")
    args = parser.parse_args(argv)
    try:
        report = check_events(args.file, args.block_sizes)
    except TraceError as exc:
        print(f"kvpool check-events: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "file": report.path, "events": report.events, "ok": report.ok,
            "reannounced": report.reannounced, "left_stored": report.left_stored,
            "unverified_parents": report.unverified_parents, "empty_stores": report.empty_stores,
            "token_mismatches": report.token_mismatches, "snapshots": report.snapshots,
            "phantoms": report.phantoms,
            "violations": [{"rule": v.rule, "line": v.position.line, "event": v.position.index,
                            "message": v.message} for v in report.violations]}))
    else:
        print(report.format(args.limit))
    return 0 if report.ok else 1


__all__ = ["check_events_main"]

