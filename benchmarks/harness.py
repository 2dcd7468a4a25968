"""What the benchmarks share: kvpool from the checkout when not installed, their command line,
resident memory and the target verdicts.

A benchmark imports it after putting its own folder on ``sys.path`` (``python -P`` leaves it off).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

if importlib.util.find_spec("kvpool") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parser(doc: str | None, **options: Any) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with an option ``--name`` per keyword:
    its value the default (and type), or (default, help); a default of False makes a flag."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    for name, value in options.items():
        default, help = value if isinstance(value, tuple) else (value, None)
        flag = "--" + name.replace("_", "-")
        if default is False:
            ap.add_argument(flag, action="store_true", help=help)
        else:
            ap.add_argument(flag, type=type(default), default=default, help=help)
    return ap


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory of process ``pid``, in MiB (Linux; 0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096 / 2**20
    except OSError:
        return 0.0


def met(ok: bool) -> str:
    """How a target line ends."""
    return "met" if ok else "NOT met"
