"""Mistakes on the command line: one line on stderr, exit status 2, before any work.

The library below the command line raises its own errors (the oracle's
:class:`~kvpool.oracle.core.adapter.LoadError` for a ``module:name`` that names no
usable pool); this module turns them into :class:`UsageError`, with the flag
that was given in front, so that every subcommand reports them the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from kvpool.oracle.core.adapter import LoadError, load_object
from kvpool.oracle.generate.long_lived import LONG_LIVED_RUNS, LONG_LIVED_STEPS

if TYPE_CHECKING:
    from kvpool.oracle.core.adapter import Adapter

__all__ = ["UsageError", "UsageParser", "check_writable", "command_parser", "example_db_option", "fail",
           "import_or_exit", "load_adapter", "write_json"]


class UsageError(Exception):
    """A mistake on the command line: reported in one line, exit status 2."""


def fail(message: str) -> int:
    """A mistake, or an input that cannot be read, said in one line on stderr: the exit status 2."""
    print(message, file=sys.stderr)
    return 2


class UsageParser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def command_parser(prog: str, description: str, epilog: str, raises: bool = False) -> argparse.ArgumentParser:
    """A subcommand's parser, its description and examples (the epilog) printed as written; ``raises``:
    a :class:`UsageParser`."""
    return (UsageParser if raises else argparse.ArgumentParser)(
        prog=prog, description=description, epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)


def write_json(path: str, doc: Any) -> None:
    """``--json FILE``: the document, indented."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)


def import_or_exit(parser: argparse.ArgumentParser, flag: str, spec: str) -> Any:
    """Import ``module:name`` given as ``flag``; a bad spec exits 2 with one line (the parser's)."""
    try:
        return load_object(spec)
    except LoadError as exc:
        parser.error(f"{flag} {exc}")


def load_adapter(impl: str | None, adapter: str | None, strict_messages: bool = True,
                 lacks: frozenset[str] = frozenset()) -> Adapter:
    """The adapter named by ``--impl`` or ``--adapter``; a bad one raises :class:`UsageError`."""
    from kvpool.oracle.search.conform import load_adapter as load  # hypothesis: only when asked

    try:
        return load(impl, adapter, strict_messages, lacks)
    except LoadError as exc:
        raise UsageError(f"{'--impl' if impl is not None else '--adapter'} {exc}") from None


def check_writable(flag: str, path: str | None) -> None:
    """Fail before the run, not after it, when an output file cannot be written."""
    if path is None:
        return
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path!r}: cannot write: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)


def example_db_option() -> str | None:
    """``KVPOOL_EXAMPLE_DB``, checked before the run: a directory that can be created or a
    ``redis://`` server that answers; anything else raises :class:`UsageError`."""
    # lazy: Hypothesis' database only when a command needs one
    from kvpool.oracle.search.database import ENV, ExampleDatabaseError, example_database, from_env

    spec = from_env()
    if spec is None:
        return None
    try:
        example_database(spec, check=True)
    except ExampleDatabaseError as exc:
        raise UsageError(f"{ENV} {exc}") from None
    return spec


def add_scale_options(parser: argparse.ArgumentParser) -> None:
    """``--blocks`` and ``--long-lived``: the pool's size and life (``check``, ``conform``, ``record``)."""
    parser.add_argument("--blocks", type=int, default=None, metavar="N",
                        help="the pool's size, null block included (default: the drawn shapes, "
                             "2 to 24 blocks; a long-lived run: 256, 1024 or 64 by seed)")
    parser.add_argument("--long-lived", action="store_true",
                        help="one pool per run under heavy churn: many hits on idle cached blocks "
                             "between allocations, long-running requests, repeated eviction and "
                             "re-caching of the same blocks, bursts that drain the free queue")


def check_scale(parser: argparse.ArgumentParser, ns: argparse.Namespace, steps: int,
                runs: int | None = None) -> None:
    """``--steps`` (and ``--runs``) left out made the long-lived run's or these; a ``--blocks`` out of
    range reported by ``parser``."""
    from kvpool.oracle.trace.schema import MAX_NUM_BLOCKS  # a trace's limit: record writes them

    if ns.steps is None:
        ns.steps = LONG_LIVED_STEPS if ns.long_lived else steps
    if runs is not None and ns.runs is None:
        ns.runs = LONG_LIVED_RUNS if ns.long_lived else runs
    if ns.blocks is not None and not 2 <= ns.blocks <= MAX_NUM_BLOCKS:
        parser.error(f"--blocks must be between 2 and {MAX_NUM_BLOCKS}, got {ns.blocks}")
