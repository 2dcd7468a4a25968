"""``kvpool record`` and ``kvpool check-trace``: JSONL traces of pool calls (``oracle/TRACE_FORMAT.md``).

``record`` runs the seeded workload against a pool in lockstep with the model
and writes every call; ``check-trace`` replays a trace, written by kvpool or
by a pool in another language or process, on the model
(:mod:`kvpool.oracle.trace`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvpool.model import REFERENCES
from kvpool.oracle.core.adapter import adapter_for_class, misuse_setting
from kvpool.oracle.events.routers import check_trace_routers, profile_factory
from kvpool.oracle.generate.long_lived import LONG_LIVED_STEPS
from kvpool.oracle.trace import DEFAULT_REFERENCE, TraceError, check_trace, record_adapter

from .events import router_name
from .usage import add_scale_options, check_scale, command_parser, fail, import_or_exit


def record_main(argv: Sequence[str] | None = None) -> int:
    """``kvpool record``: 0 recorded and pool agreed with the model, 1 it diverged, 2 usage."""
    parser = command_parser(
        "kvpool record", "Run the random workload against a pool in lockstep with the model and "
                         "write every call to a JSONL trace (see oracle/TRACE_FORMAT.md).",
        "example:\n  kvpool record --pool vllm.v1.core.block_pool:BlockPool --no-misuse run.jsonl")
    parser.add_argument("out", help="trace file to write")
    parser.add_argument("--pool", default="kvpool.impl:BlockPool", metavar="MODULE:CLASS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help=f"workload steps (default 1000; {LONG_LIVED_STEPS} with --long-lived)")
    add_scale_options(parser)
    parser.add_argument("--no-misuse", action="store_true", help="leave out deliberately wrong calls")
    parser.add_argument("--reference", choices=sorted(REFERENCES), default=DEFAULT_REFERENCE,
                        help="the vLLM version whose behaviour the model reproduces")
    parser.add_argument("--no-observe", action="store_true",
                        help="leave the observation out of each line (smaller traces)")
    args = parser.parse_args(argv)
    check_scale(parser, args, 1000)
    if args.steps <= 0:
        parser.error("--steps must be positive")
    adapter = adapter_for_class(import_or_exit(parser, "--pool", args.pool))
    misuse, why = misuse_setting(adapter, not args.no_misuse)
    print(f"kvpool record: {adapter.name}; {why}")
    try:
        rec = record_adapter(adapter, args.seed, args.steps, observe=not args.no_observe,
                             reference=args.reference, misuse=misuse, path=args.out,
                             blocks=args.blocks, long_lived=args.long_lived)
    except OSError as exc:
        return fail(f"kvpool record: cannot write {args.out}: {exc.strerror or exc}")
    print(f"{args.out}: {rec.calls} calls recorded")
    if rec.divergence:
        print(f"the pool diverged from the model at the last call:\n{rec.divergence}")
        return 1
    return 0


def check_trace_main(argv: Sequence[str] | None = None) -> int:
    """``kvpool check-trace``: 0 agrees, 1 diverges, 2 usage or unreadable file, 3 the trace's
    caller broke a contract of the pool (a verdict about the caller, not the pool), 4 the trace
    agrees but a ``--router`` profile's index differs from what the pool serves."""
    parser = command_parser(
        "kvpool check-trace", "Replay a JSONL trace on the model and report the first call whose "
                              "result, error class, events, watcher firings or observation differ.",
        "examples:\n  kvpool check-trace run.jsonl --vllm-errors\n"
        "  kvpool check-trace run.jsonl --router dynamo --router llm-d:2025\n"
        "routers (docs/routers.md): set, refcount, dynamo, llm-d:2025, llm-d:2026[,option=value]\n"
        "exit codes: 0 agrees, 1 differs from the model, 2 unreadable, 3 the caller broke a "
        "contract, 4 a router's index differs from the pool")
    parser.add_argument("trace", help="trace file (oracle/TRACE_FORMAT.md)")
    parser.add_argument("--vllm-errors", action="store_true",
                        help="accept ValueError where the model raises NotEnoughFreeBlocksError")
    parser.add_argument("--router", type=router_name, action="append", default=[], metavar="NAME",
                        help="also feed the events to this router profile and, after every call, "
                             "compare its prefix answers with what the pool serves (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the router reports as JSON")
    parser.add_argument("--limit", type=int, default=50, help="router findings to print (default 50)")
    args = parser.parse_args(argv)
    try:
        if args.router:
            report, routers = check_trace_routers(args.trace, [profile_factory(r) for r in args.router],
                                                  vllm_errors=args.vllm_errors)
        else:
            report, routers = check_trace(args.trace, vllm_errors=args.vllm_errors), []
    except TraceError as exc:
        return fail(f"kvpool check-trace: {exc}")
    if args.json and routers:
        print(json.dumps({"file": report.path, "ok": report.ok, "check": report.format(),
                          "routers": [r.to_json() for r in routers]}))
    else:
        print(report.format())
        for r in routers:
            print(r.format(args.limit))
    if not report.ok:
        return 3 if report.contract is not None else 1
    return 4 if any(not r.ok for r in routers) else 0


__all__ = ["check_trace_main", "record_main"]
