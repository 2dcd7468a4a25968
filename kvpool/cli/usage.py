"""Mistakes on the command line: one line on stderr, exit status 2, before any work."""

from __future__ import annotations

import os

from kvpool.oracle.adapter import UsageError, UsageParser

__all__ = ["UsageError", "UsageParser", "check_writable"]


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
