"""The ``kvpool`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvpool import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description=(
            "A verified reference implementation of vLLM's KV-cache block pool.\n"
            "kvpool.impl is the pool, kvpool.model its executable specification."
        ),
        epilog="example:\n  kvpool check --steps 20000 --seed 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvpool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "check":
        if args.steps <= 0 or args.runs <= 0:
            parser.error("--steps and --runs must be positive")
        from kvpool.impl import BlockPool
        from kvpool.oracle.campaign import run_campaign

        return run_campaign(BlockPool, steps=args.steps, runs=args.runs, seed=args.seed,
                            out=sys.stdout)
    parser.error(f"unknown command {args.command}")
    return 2
