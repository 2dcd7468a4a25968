"""``kvpool check``: kvpool.impl (or any pool class) and the model in lockstep on a random workload.

Unlike the other subcommands, ``check`` is a subparser of the ``kvpool``
parser itself (it was the first command): its mistakes are reported by that
parser, with the ``kvpool [-h] [--version] COMMAND ...`` usage line, so
:mod:`.main` builds it with :func:`add_parser` and runs it with :func:`run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpool.oracle.generate.long_lived import LONG_LIVED_RUNS, LONG_LIVED_STEPS

from .usage import add_scale_options, check_scale, import_or_exit

HELP = "run kvpool.impl and the model in lockstep on a random workload"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``check`` subparser, added to ``sub`` (the ``kvpool`` parser's subparsers)."""
    check: argparse.ArgumentParser = sub.add_parser(
        "check", help=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Drive kvpool.impl and kvpool.model with the same random workload, compare\n"
                    "every result, error and observation after each step, and check every model\n"
                    "invariant. Exits 0 when all agree, 1 on the first divergence.",
        epilog="examples:\n  kvpool check --steps 20000 --seed 1\n  kvpool check --long-lived --blocks 65536")
    check.add_argument("--steps", type=int, default=None,
                       help=f"workload steps per run (default 5000; {LONG_LIVED_STEPS} with --long-lived)")
    check.add_argument("--runs", type=int, default=None,
                       help=f"independent runs, one pool each (default 4; {LONG_LIVED_RUNS} with "
                            "--long-lived)")
    add_scale_options(check)
    check.add_argument("--seed", type=int, default=0, help="first random seed (default 0)")
    target = check.add_mutually_exclusive_group()
    target.add_argument(
        "--pool", default="kvpool.impl:BlockPool", metavar="MODULE:CLASS",
        help="the pool class to check (default kvpool.impl:BlockPool), e.g. "
             "vllm.v1.core.block_pool:BlockPool")
    target.add_argument(
        "--exec", metavar='"CMD ARGS"',
        help="a pool in another process (any language), over its stdin and stdout in the drive "
             "protocol (oracle/DRIVE_PROTOCOL.md)")
    check.add_argument("--reference", choices=["0.31", "0.33"], default="0.31",
                       help="the vLLM version whose behaviour the model reproduces (default 0.31)")
    check.add_argument("--no-misuse", action="store_true",
                       help="leave out deliberately wrong calls (for pools that do not refuse them, "
                            "like vLLM's)")
    check.add_argument("--lacks", metavar="NAMES", type=_lacks, default=frozenset(),
                       help="what the pool lacks, besides what it declares (operations, features, shapes; "
                            "commas or spaces): no call with any is made")
    from . import drive  # the options of --exec

    drive.add_options(check)
    return check


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the campaign the parsed ``args`` ask for; ``parser`` reports a usage error (exit 2)."""
    check_scale(parser, args, 5000, 4)
    if args.steps <= 0 or args.runs <= 0:
        parser.error("--steps and --runs must be positive")
    if args.exec is not None:
        from .drive import check_exec  # lazy: the drive protocol only for --exec

        return check_exec(args)
    # lazy: a subcommand loads the oracle (Hypothesis) only when it runs
    from kvpool.oracle.core.adapter import adapter_for_class, misuse_setting
    from kvpool.oracle.search.campaign import run_campaign

    pool_class = import_or_exit(parser, "--pool", args.pool)
    adapter = adapter_for_class(pool_class)
    misuse, why = misuse_setting(adapter, not args.no_misuse)
    print(f"kvpool check: {adapter.name}; {why}")
    lacks = frozenset(args.lacks) | frozenset(getattr(pool_class, "kvpool_lacks", ()) or ())
    return run_campaign(adapter.factory(), steps=args.steps, runs=args.runs, seed=args.seed,
                        out=sys.stdout, misuse=misuse, errors_match=adapter.errors_match,
                        reference=args.reference, blocks=args.blocks, long_lived=args.long_lived,
                        lacks=lacks)


def _lacks(text: str) -> frozenset[str]:
    """``--lacks``, checked (argparse reports a bad name as a usage error)."""
    # lazy: the oracle loads Hypothesis, only when a command runs
    from kvpool.oracle.generate.capabilities import parse_lacks

    try:
        return parse_lacks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["HELP", "add_parser", "run"]
