"""How much of the specification each conformance phase reaches: branch coverage of the model's actions.

A phase that never reaches a branch of :mod:`kvpool.model.actions` never
compares the pool with the model there: a pool may be wrong on that branch
and pass.  So ``kvpool conform --coverage`` runs each phase alone under
coverage.py (``branch=True``, only ``model/actions.py`` measured) and
reports, per phase, how many of the module's branches it took and which it
missed, as line -> line with the source lines.

The results are plain data (:class:`PhaseCoverage`); :mod:`kvpool.cli.conform`
prints them and writes them into its JSON.  coverage.py is imported only when
a measurement runs: it is a test extra, not a dependency of kvpool.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from kvpool.model import actions

if TYPE_CHECKING:
    from .adapter import Adapter
    from .conform import Options, PhaseResult

T = TypeVar("T")

ACTIONS_PATH = os.path.realpath(actions.__file__)
"""The one file measured: the specification's transitions."""


@dataclass(frozen=True, order=True)
class Branch:
    """One way out of a line with several: from ``line`` on to line ``to`` (0: out of the function)."""

    line: int
    to: int
    source: str
    """The text of ``line``, stripped: which decision it is."""
    into: str
    """The text of line ``to``, stripped (empty for leaving the function): where it goes."""
    caller: bool = False
    """The branch is in a caller action (``kvpool.model.CALLER_ACTIONS``): no pool call takes it."""

    @property
    def refusal(self) -> bool:
        """Whether the branch leads into a refusal: only a wrong call (or running dry) takes it."""
        return self.into.startswith("raise Refusal")

    @property
    def contract(self) -> bool:
        """Whether the branch leads into a broken caller contract: the run then ends, the
        caller at fault, so a phase whose calls keep the contracts never takes it."""
        return self.into.startswith("raise ContractBroken")

    def __str__(self) -> str:
        kind = re.search(r"RefusalKind\.(\w+)", self.into) if self.refusal else None
        then = f"refused ({kind.group(1)})" if kind else self.into or "return"
        return f"{self.line} -> {self.to or 'exit'}: {self.source}  =>  {then}"


@dataclass(frozen=True)
class PhaseCoverage:
    """The branches of the model's actions that one phase reached."""

    phase: str
    misuse: bool
    """Whether the phase made deliberately wrong calls (most refusals need them)."""
    covered: int
    total: int
    missed: tuple[Branch, ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.total if self.total else 100.0

    def to_json(self) -> dict[str, Any]:
        """The measurement as conform's ``--json`` holds it (missed branches as objects)."""
        out = asdict(self)
        out["missed"] = [{**asdict(b), "refusal": b.refusal, "contract": b.contract}
                         for b in self.missed]
        return out


def measure(run: Callable[[], T], phase: str, misuse: bool) -> tuple[T, PhaseCoverage]:
    """Run ``run()`` alone under branch coverage of the model's actions; its result and the coverage.

    Raises ``ImportError`` when coverage.py is not installed.
    """
    import coverage  # a test extra: imported only when asked for

    cov = coverage.Coverage(branch=True, include=[ACTIONS_PATH], data_file=None, config_file=False)
    cov.set_option("run:disable_warnings", ["no-data-collected"])  # a phase that died at once
    cov.start()
    try:
        result = run()
    finally:
        cov.stop()
    return result, _read(cov, phase, misuse)


def measure_phase(run_phase: Callable[[Adapter, Options], PhaseResult], adapter: Adapter,
                  opts: Options) -> tuple[PhaseResult, PhaseCoverage]:
    """One conformance phase (``run_campaign_phase`` or ``run_machine_phase``) alone, measured."""
    misuse = opts.misuse and adapter.supports_misuse
    result, measured = measure(lambda: run_phase(adapter, opts), "", misuse)
    return result, replace(measured, phase=result.name)


def _read(cov: Any, phase: str, misuse: bool) -> PhaseCoverage:
    """The branch figures of the measured file, through coverage.py's JSON report.

    The JSON report is the public API that names missed branches (``branch_stats``
    only counts them), so it is written to a scratch file and read back.
    """
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "coverage.json")
        cov.json_report(morfs=[ACTIONS_PATH], outfile=path)
        with open(path, encoding="utf-8") as fh:
            (data,) = json.load(fh)["files"].values()
    with open(ACTIONS_PATH, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh.read().splitlines()]
    callers = _caller_lines()
    missed = tuple(sorted(Branch(a, max(b, 0), lines[a - 1], lines[b - 1] if b > 0 else "",
                                 a in callers)
                          for a, b in data["missing_branches"]))
    summary = data["summary"]
    return PhaseCoverage(phase, misuse, summary["covered_branches"], summary["num_branches"], missed)


def _caller_lines() -> set[int]:
    """The lines of the caller actions (the owner's writes), which no pool call runs."""
    out: set[int] = set()
    for fn in actions.CALLER_ACTIONS.values():
        body, first = inspect.getsourcelines(fn)
        out |= set(range(first, first + len(body)))
    return out


__all__ = ["ACTIONS_PATH", "Branch", "PhaseCoverage", "measure", "measure_phase"]
