"""What a deployment sets for its shadows (the environment), and what the shadows of a process found.

Standard library only: the plugin reads these in every vLLM process.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV_DIR = "KVPOOL_SHADOW_DIR"
"""Where a diverging pool's trace is written (default: the temporary directory's ``kvpool-shadow``)."""
ENV_STRICT = "KVPOOL_SHADOW_STRICT"
"""``1``: a divergence raises :class:`ShadowDivergence` from the call instead of being logged
(the checking then runs on the engine's thread: :data:`ENV_CHECK` ``inline``)."""
ENV_KEEP = "KVPOOL_SHADOW_KEEP"
"""``1``: keep every pool's trace when the pool goes, not only a diverging one's (to build corpora)."""
ENV_FULL_EVERY = "KVPOOL_SHADOW_FULL_EVERY"
"""Compare the whole pool every this many calls (default: the pool's number of blocks)."""
ENV_REFERENCE = "KVPOOL_SHADOW_REFERENCE"
"""The vLLM behaviour the model reproduces (default ``0.31``)."""
ENV_CHECK = "KVPOOL_SHADOW_CHECK"
"""Where the model runs: ``process`` (the default: a checker process beside the engine, the call
path only records) or ``inline`` (on the engine's thread, right after each call)."""
CHECK_MODES = ("process", "inline")
FIRST_LINE = 400
"""The logged difference is cut to this many characters."""

logger = logging.getLogger("kvpool.shadow")


class ShadowDivergence(AssertionError):
    """A shadowed pool diverged from the model (raised only with :data:`ENV_STRICT`)."""

    def __init__(self, text: str, path: Path | None) -> None:
        super().__init__(text)
        self.path = path


class Unmodelled(Exception):
    """A call the shadow cannot put to the model (the pool then goes unshadowed, said in one line)."""


@dataclass
class Totals:
    """What the shadows of this process did (written as JSON at exit when :data:`ENV_DIR` is set)."""

    pools: int = 0
    calls: int = 0
    divergences: int = 0
    contracts: int = 0
    stopped: int = 0
    """Pools whose shadow stopped for a reason of its own (a call it cannot model, a failure)."""
    traces: list[str] = field(default_factory=list)
    """Every trace written: a diverging pool's, or every pool's with :data:`ENV_KEEP`."""
    findings: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"pid": os.getpid(), **asdict(self)}

    def add(self, other: dict[str, Any]) -> None:
        """Add another process's totals (a checker process's) to these."""
        for name in ("pools", "calls", "divergences", "contracts", "stopped"):
            setattr(self, name, getattr(self, name) + int(other.get(name, 0)))
        self.traces += list(other.get("traces", ()))
        self.findings += list(other.get("findings", ()))


TOTALS = Totals()


def flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than off."""
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


def check_mode(strict: bool) -> str:
    """Where the model runs (:data:`ENV_CHECK`); strict checking raises from the call, so inline."""
    chosen = os.environ.get(ENV_CHECK, "").strip() or "process"
    if chosen not in CHECK_MODES:
        logger.warning("kvpool shadow: %s=%r is not one of %s; checking inline", ENV_CHECK, chosen,
                       ", ".join(CHECK_MODES))
        chosen = "inline"
    return "inline" if strict else chosen


def shadow_dir() -> Path:
    """Where traces go: :data:`ENV_DIR`, or ``kvpool-shadow`` in the temporary directory."""
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / "kvpool-shadow")


def full_every_default(num_blocks: int) -> int:
    """Calls between whole-pool checks: :data:`ENV_FULL_EVERY`, else the pool's size (an engine's
    pool lives long: one block's worth of whole checking a call)."""
    raw = os.environ.get(ENV_FULL_EVERY, "").strip()
    return max(1, int(raw)) if raw.isdigit() else max(1, num_blocks)


__all__ = ["CHECK_MODES", "ENV_CHECK", "ENV_DIR", "ENV_FULL_EVERY", "ENV_KEEP", "ENV_REFERENCE",
           "ENV_STRICT", "FIRST_LINE", "TOTALS", "ShadowDivergence", "Totals", "Unmodelled", "check_mode",
           "flag", "full_every_default", "logger", "shadow_dir"]
