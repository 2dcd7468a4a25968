"""The ``kvpool`` command line: one parser whose subcommands live in this package.

Each subcommand in :data:`DELEGATED` parses its own arguments in its own
module; ``check`` is a subparser of this parser (:mod:`.check`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence
from typing import Any

from kvpool import __version__

from . import check
from .usage import command_parser, fail

# Subcommands whose module parses its own arguments: name -> (module, function, help).
DELEGATED: dict[str, tuple[str, str, str]] = {
    "verify": ("kvpool.cli.verify", "main",
               "everything at once for CI: proofs, seeded bugs, BMC, lockstep, conformance; "
               "JUnit/JSON results and a reviewer's report"),
    "merge": ("kvpool.cli.merge", "main",
              "join the --json results of kvpool verify/conform --shard I/N into one result and report"),
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
    "corpus": ("kvpool.cli.corpus", "main",
               "grow the legal corpus from traces that reach branches of the model it does not"),
    "claims": ("kvpool.cli.claims", "main",
               "every property of the model and what establishes it (z3, BMC, lockstep, bugs)"),
    "check-events": ("kvpool.cli.events", "check_events_main",
                     "check a KV-event stream (JSONL, a trace, or a wire capture) as a router reads it"),
    "watch": ("kvpool.cli.watch", "main",
              "subscribe to vLLM engines' KV events (ZMQ) and check each stream as it comes"),
    "replay": ("kvpool.cli.replay", "main",
               "replay a request trace (Mooncake's or plain) through an engine loop, every pool call "
               "checked against the model: hit rates, evictions, preemptions, router error"),
    "serve-pool": ("kvpool.oracle.drive.serve", "main",
                   "kvpool's pool (or any Python pool) over stdin/stdout in the drive protocol"),
}


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "kvpool",
        "A verified reference implementation of vLLM's KV-cache block pool.\n"
        "kvpool.impl is the pool, kvpool.model its executable specification.",
        "examples:\n  kvpool verify --junit verify.xml --report out/\n"
        "  kvpool conform --impl my_engine.block_pool:BlockPool\n"
        "  kvpool check --steps 20000 --seed 1")
    parser.add_argument("--version", action="version", version=f"kvpool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, _function, summary) in DELEGATED.items():
        sub.add_parser(name, help=summary, add_help=False)
    check.add_parser(sub)
    return parser


VERIFIER_DEPENDENCIES = ("z3", "hypothesis", "crosshair", "rich")
"""Third-party packages of the verifier (the extra ``kvpool[verify]``); the pool and the model need none."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _dispatch(args_list)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `kvpool ... | head`: the reader has gone; end quietly, as a filter does
        if not _stdout_gone():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush goes nowhere
        return 0
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in VERIFIER_DEPENDENCIES:
            raise
        return fail(f"kvpool: this command needs {exc.name}, one of the verifier's dependencies: "
                    "pip install 'kvpool[verify]'")


def _stdout_gone() -> bool:
    """Whether the broken pipe is standard output's (its reader closed it), not one a command opened."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _dispatch(args_list: list[str]) -> int:
    if args_list and args_list[0] in DELEGATED:
        module_name, function, _summary = DELEGATED[args_list[0]]
        run: Any = getattr(importlib.import_module(module_name), function)
        return int(run(args_list[1:]))
    parser = _parser()
    args = parser.parse_args(args_list)
    if args.command is None:  # a command is required: show what there is, as a usage error
        parser.print_help(sys.stderr)
        return 2
    if args.command == "check":
        return check.run(args, parser)
    parser.error(f"unknown command {args.command}")
