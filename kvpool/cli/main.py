"""The ``kvpool`` command line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from kvpool import __version__

# Subcommands whose module parses its own arguments: name -> (module, function, help).
DELEGATED: dict[str, tuple[str, str, str]] = {
    "verify": ("kvpool.verify", "main",
               "everything at once for CI: proofs, seeded bugs, BMC, lockstep, conformance; "
               "JUnit/JSON results and a reviewer's report"),
    "prove": ("kvpool.cli.prove", "main",
              "prove with z3 that every operation preserves every invariant, for any pool size"),
    "bmc": ("kvpool.cli.bmc", "main",
            "bounded model checking: every call sequence of small pools, up to a depth"),
    "conform": ("kvpool.cli.conform", "main",
                "check any block-pool implementation against the model, step by step"),
    "record": ("kvpool.cli.trace", "record_main",
               "record a JSONL trace of a pool running the workload"),
    "check-trace": ("kvpool.cli.trace", "check_trace_main",
                    "replay a recorded trace on the model; report the first divergent line"),
    "check-events": ("kvpool.cli.events", "check_events_main",
                     "check a KV-event stream as a router rebuilding the index reads it"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description=(
            "A verified reference implementation of vLLM's KV-cache block pool.\n"
            "kvpool.impl is the pool, kvpool.model its executable specification."
        ),
        epilog="examples:\n  kvpool verify --junit verify.xml --report out/\n"
               "  kvpool conform --impl my_engine.block_pool:BlockPool\n"
               "  kvpool check --steps 20000 --seed 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvpool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, _function, summary) in DELEGATED.items():
        sub.add_parser(name, help=summary, add_help=False)
    check = sub.add_parser(
        "check",
        help="run kvpool.impl and the model in lockstep on a random workload",
        description=(
            "Drive kvpool.impl and kvpool.model with the same random workload, compare\n"
            "every result, error and observation after each step, and check every model\n"
            "invariant. Exits 0 when all agree, 1 on the first divergence."
        ),
        epilog="example:\n  kvpool check --steps 20000 --seed 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--steps", type=int, default=5000, help="operations per run (default 5000)")
    check.add_argument("--runs", type=int, default=4, help="independent runs (default 4)")
    check.add_argument("--seed", type=int, default=0, help="first random seed (default 0)")
    check.add_argument(
        "--pool", default="kvpool.impl:BlockPool", metavar="MODULE:CLASS",
        help="the pool class to check (default kvpool.impl:BlockPool), e.g. "
             "vllm.v1.core.block_pool:BlockPool")
    check.add_argument(
        "--reference", choices=["0.31", "0.33"], default="0.31",
        help="the vLLM version whose behaviour the model reproduces (default 0.31)")
    check.add_argument(
        "--no-misuse", action="store_true",
        help="leave out deliberately wrong calls (for pools that do not refuse them, like vLLM's)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in DELEGATED:
        module_name, function, _summary = DELEGATED[args_list[0]]
        run: Any = getattr(importlib.import_module(module_name), function)
        return int(run(args_list[1:]))
    parser = _parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "check":
        if args.steps <= 0 or args.runs <= 0:
            parser.error("--steps and --runs must be positive")
        from kvpool.impl import BlockPool
        from kvpool.oracle.abstraction import same_refusal, vllm_refusal
        from kvpool.oracle.campaign import run_campaign

        from .usage import import_or_exit

        pool_class = import_or_exit(parser, "--pool", args.pool)
        ours = isinstance(pool_class, type) and issubclass(pool_class, BlockPool)
        return run_campaign(pool_class, steps=args.steps, runs=args.runs, seed=args.seed,
                            out=sys.stdout, misuse=not args.no_misuse,
                            errors_match=same_refusal if ours else vllm_refusal,
                            reference=args.reference)
    parser.error(f"unknown command {args.command}")
    return 2
