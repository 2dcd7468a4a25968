"""``kvpool check-events``: a KV-event stream read as a router rebuilding the prefix index reads it.

The checks and their rules are :mod:`kvpool.oracle.events.check`'s; this is
its command line: the file, the block sizes, and the report as text or JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kvpool.oracle.events.capture import is_capture
from kvpool.oracle.events.check import EventsReport, load_events, read_stream
from kvpool.oracle.events.routers import RouterReport, profile_factory
from kvpool.oracle.trace import TraceError

from .usage import command_parser, fail


def block_sizes_arg(text: str) -> dict[int, int]:
    """``0=16,1=32`` -> {0: 16, 1: 32} (argparse type)."""
    try:
        pairs = [item.split("=") for item in text.split(",") if item]
        out = {int(g): int(n) for g, n in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GROUP=SIZE[,GROUP=SIZE...], got {text!r}") from None
    if any(n <= 0 for n in out.values()):
        raise argparse.ArgumentTypeError("block sizes must be positive")
    return out


def router_name(text: str) -> str:
    """A ``--router`` value, checked now (argparse type): a usage error, not a traceback."""
    try:
        return profile_factory(text)[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json(report: EventsReport, routers: list[RouterReport]) -> str:
    extra = {"routers": [r.to_json() for r in routers]} if routers else {}
    return json.dumps({**report.to_json(), **extra})


def check_events_main(argv: Sequence[str] | None = None) -> int:
    """``kvpool check-events``: 0 no violation, 1 violations (or warnings with ``--strict``, or
    inputs a ``--router`` profile does not index as meant), 2 usage or unreadable file."""
    parser = command_parser(
        "kvpool check-events",
        "Read a KV-event stream (JSONL, one event per line; a kvpool trace; or a wire capture "
        "written by kvpool watch --record) as a router rebuilding the prefix index would, and "
        "report each event that breaks it, with its line (or record).",
        "examples:\n  kvpool check-events kv-events.jsonl --block-sizes 0=16\n"
        "  kvpool check-events run.jsonl --json --strict\n"
        "  kvpool check-events kv-events.jsonl --router dynamo --router llm-d:2025\n"
        "routers (docs/routers.md): set, refcount, dynamo, llm-d:2025, llm-d:2026[,option=value]")
    parser.add_argument("file")
    parser.add_argument("--block-sizes", type=block_sizes_arg, default=None, metavar="G=N[,G=N]",
                        help="full block size per KV-cache group, to tell partial entries apart "
                             "(a trace header's block_sizes is used when present)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--limit", type=int, default=50, help="violations to print (default 50)")
    parser.add_argument("--strict", action="store_true",
                        help="fail (exit 1) on warnings too: events that break no rule but leave a "
                             "router guessing (re-announced hits, removed parents, empty stores, ...)")
    parser.add_argument("--router", type=router_name, action="append", default=[], metavar="NAME",
                        help="also read the stream as this router does and report what it does not "
                             "index as meant (repeatable); on a trace, `kvpool check-trace --router` "
                             "compares its answers with the pool")
    args = parser.parse_args(argv)
    if is_capture(args.file):
        return _check_capture(args)
    try:
        stream = load_events(args.file)
        report, routers = read_stream(stream, args.file, args.block_sizes,
                                      [profile_factory(name) for name in args.router], facts=True)
    except TraceError as exc:
        return fail(f"kvpool check-events: {exc}")
    if args.json:
        print(_json(report, routers))
    else:
        print(report.format(args.limit))
        for r in routers:
            print(r.format(args.limit))
    failed = not report.ok or (args.strict and report.warnings) or any(not r.ok for r in routers)
    return 1 if failed else 0


COVERAGE = ("gap", "joined", "undecodable", "late")
"""Transport findings that cost the check what it could see: ``--strict`` fails on them."""


def _check_capture(args: Any) -> int:
    """A wire capture, replayed through the watcher's sequencing and checking."""
    # a capture needs the extra kvpool[live]; JSON lines and traces do not
    try:
        from kvpool.oracle.events.fleet import replay_capture

        fleet = replay_capture(args.file, block_sizes=args.block_sizes,
                               profiles=[profile_factory(name) for name in args.router])
    except ModuleNotFoundError as exc:
        return fail(f"kvpool check-events: a wire capture needs {exc.name}: pip install 'kvpool[live]'")
    except TraceError as exc:
        return fail(f"kvpool check-events: {exc}")
    kinds = [r.finding.kind for r in fleet.reports]
    failed = "violation" in kinds or "reaction" in kinds or (args.strict and any(
        k == "warning" or k in COVERAGE for k in kinds))
    engines: list[dict[str, Any]] = [
        {"engine": e.name, "batches": e.counts.batches, "events": e.counts.events,
         "findings": [r.to_json() for r in fleet.reports if r.engine == e.name]}
        for e in fleet.engines.values()]
    if args.json:
        print(json.dumps({"file": args.file, "ok": "violation" not in kinds, "engines": engines,
                          "summary": fleet.summary()}))
        return 1 if failed else 0
    print(f"{args.file}: {fleet.summary().removeprefix('kvpool watch: ')}")
    for engine in engines:
        print(f"{args.file} [{engine['engine']}]: {engine['batches']} batch(es), {engine['events']} "
              f"event(s), {len(engine['findings'])} finding(s)")
        for f in engine["findings"][:args.limit]:
            where = f"record {f['record']}" + (f" seq {f['seq']}" if f["seq"] is not None else "") + (
                f" event {f['event']}" if f["event"] is not None else "")
            who = f" {f['profile']} {f['reaction']}" if "profile" in f else ""
            print(f"{args.file}:{f['record']}: {where}: {f['kind']}{who} [{f['rule']}] {f['message']}")
        if len(engine["findings"]) > args.limit:
            print(f"... and {len(engine['findings']) - args.limit} more")
    return 1 if failed else 0


__all__ = ["block_sizes_arg", "check_events_main", "router_name"]

