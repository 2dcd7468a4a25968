"""How much of the specification each conformance phase reaches: branch coverage of the model's actions.

A phase that never reaches a branch of the model's operations (their
updates, :mod:`kvpool.model.pool`; their refusals, :mod:`kvpool.model.guards`;
their contracts, :mod:`kvpool.model.contracts`) never compares the pool
with the model there: a pool may be wrong on that branch and pass.  So
``kvpool conform --coverage`` runs each phase alone under coverage.py
(``branch=True``, only those files measured) and reports, per phase, how
many of their branches it took and which it missed, as file:line -> line
with the source lines.

The results are plain data (:class:`PhaseCoverage`); :mod:`kvpool.cli.conform`
prints them and writes them into its JSON.  coverage.py is imported only when
a measurement runs: it is a test extra, not a dependency of kvpool.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from kvpool.model import OPERATIONS, REFERENCES
from kvpool.model import contracts as model_contracts
from kvpool.model import guards as model_guards
from kvpool.model import pool as model_pool

from ..core.adapter import adapter_factory
from ..generate.features import PairCoverage, closed, pair_coverage

if TYPE_CHECKING:
    from ..core.adapter import Adapter
    from .conform import Options, PhaseResult

T = TypeVar("T")
REFERENCE_FLAGS: tuple[str, ...] = tuple(sorted({flag for flags in REFERENCES.values() for flag in flags}))
"""The model's flags a ``--reference`` sets (a branch on one is another release's behaviour)."""

MEASURED: tuple[str, ...] = tuple(os.path.realpath(str(m.__file__))
                                  for m in (model_pool, model_guards, model_contracts))
"""The files measured: the operations' updates, guards and contracts."""


@dataclass(frozen=True, order=True)
class Branch:
    """One way out of a line with several: from ``line`` on to line ``to`` (0: out of the function)."""

    file: str
    """The measured file's name (``pool.py``, ``guards.py``, ``contracts.py``)."""
    line: int
    to: int
    source: str
    """The text of ``line``, stripped: which decision it is."""
    into: str
    """The text of line ``to``, stripped (empty for leaving the function): where it goes."""
    caller: bool = False
    """The branch is in a caller action (``kvpool.model.CALLER_ACTIONS``): no pool call takes it."""
    lacked: bool = False
    """The branch is in an operation the pool declares it lacks: no call of it is made."""

    @property
    def why(self) -> str:
        """Why a phase may miss it; ``reachable without misuse`` (a legal call takes it) is a gap."""
        if self.caller:
            return "caller action"
        if self.lacked:
            return "the pool lacks it"
        if self.contract:
            return "caller contract"
        if self.refusal:
            return "needs misuse"
        if any(f"s.{flag}" in self.source for flag in REFERENCE_FLAGS):
            return "another --reference"
        return "reachable without misuse"

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
        return f"{self.file}:{self.line} -> {self.to or 'exit'}: {self.source}  =>  {then}"


class _Percent:
    """``covered`` of ``total`` branches, as a percentage (100 of none)."""

    covered: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.total if self.total else 100.0


@dataclass(frozen=True)
class SourceCoverage(_Percent):
    """The branches of the pool under test's own source that one phase reached."""

    covered: int
    total: int
    files: tuple[tuple[str, int, int], ...]
    """Each measured file: its path, branches taken, branches in all."""


@dataclass(frozen=True)
class PhaseCoverage(_Percent):
    """The branches of the model's actions that one phase reached."""

    phase: str
    misuse: bool
    """Whether the phase made deliberately wrong calls (most refusals need them)."""
    covered: int
    total: int
    missed: tuple[Branch, ...]
    pairs: PairCoverage | None = None
    """The legal pairs of call features the phase made meet in one call (:mod:`.features`)."""
    pool: SourceCoverage | None = None
    """The branches of the pool's own source the phase took (None: its source is unknown)."""

    @property
    def gaps(self) -> tuple[Branch, ...]:
        """The missed branches a legal call takes: reachable without misuse."""
        return tuple(b for b in self.missed if b.why == "reachable without misuse")

    def to_json(self) -> dict[str, Any]:
        """The measurement as conform's ``--json`` holds it (missed branches as objects)."""
        out = asdict(self)
        out["missed"] = [{**asdict(b), "refusal": b.refusal, "contract": b.contract, "why": b.why}
                         for b in self.missed]
        out["pairs"] = None if self.pairs is None else self.pairs.to_json()
        return out


def measure(run: Callable[[], T], phase: str, misuse: bool, sources: Sequence[str] = (),
            lacks: frozenset[str] = frozenset()) -> tuple[T, PhaseCoverage]:
    """Run ``run()`` alone under branch coverage of the model's actions; its result and the coverage.

    ``sources`` (the pool's own files) are measured too, into ``pool``; the branches of the
    operations in ``lacks`` are missed because the pool lacks them, not as gaps.
    Raises ``ImportError`` when coverage.py is not installed.
    """
    import coverage  # a test extra: imported only when asked for

    files = [*MEASURED, *(f for f in sources if f not in MEASURED)]
    cov = coverage.Coverage(branch=True, include=files, data_file=None, config_file=False)
    cov.set_option("run:disable_warnings", ["no-data-collected"])  # a phase that died at once
    cov.start()
    try:
        result = run()
    finally:
        cov.stop()
    return result, _read(cov, phase, misuse, files[len(MEASURED):], lacks)


def pool_sources(adapter: Adapter) -> list[str]:
    """The pool's own source files: those of its class and its bases, and the loaded modules of
    the package of the class that defines its operations (a pool split over files)."""
    cls = getattr(adapter, "pool_class", None)
    if not isinstance(cls, type):
        return []
    files = [_source_file(c) for c in cls.__mro__ if c is not object]
    base = next((c for c in reversed(cls.__mro__) if "get_new_blocks" in vars(c)), cls)
    home = _source_file(base)
    package = base.__module__.rpartition(".")[0]
    if package and home:
        files += [str(m.__file__) for name, m in list(sys.modules.items())
                  if name.startswith(package + ".") and str(getattr(m, "__file__", "")).endswith(".py")
                  and os.path.dirname(str(m.__file__)) == os.path.dirname(home)]
    return sorted({os.path.realpath(f) for f in files if f and f.endswith(".py")})


def _source_file(cls: type) -> str | None:
    """Where ``cls`` is defined; None for a class of no file (built in, or of a module loaded by
    path and not registered in ``sys.modules``)."""
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


def measure_phase(run_phase: Callable[[Adapter, Options], PhaseResult], adapter: Adapter,
                  opts: Options) -> tuple[PhaseResult, PhaseCoverage]:
    """One conformance phase (``run_campaign_phase`` or ``run_machine_phase``) alone, measured."""
    misuse = opts.misuse and adapter.supports_misuse
    result, measured = measure(lambda: run_phase(adapter, opts), "", misuse, pool_sources(adapter),
                               closed(opts.lacks))
    pairs = None
    if result.features is not None:
        pool = adapter_factory(adapter)(4, True, 1)
        ops = [op for op in OPERATIONS if callable(getattr(pool, op, None))]
        pairs = pair_coverage(result.features, result.name, misuse, ops, opts.lacks)
    return result, replace(measured, phase=result.name, pairs=pairs)


def _read(cov: Any, phase: str, misuse: bool, sources: Sequence[str] = (),
          lacks: frozenset[str] = frozenset()) -> PhaseCoverage:
    """The branch figures of the measured files, through coverage.py's JSON report.

    The JSON report is the public API that names missed branches (``branch_stats``
    only counts them), so it is written to a scratch file and read back.
    """
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "coverage.json")
        cov.json_report(morfs=[*MEASURED, *sources], outfile=path, ignore_errors=True)
        with open(path, encoding="utf-8") as fh:
            files = json.load(fh)["files"]
    pool = None
    if sources:
        mine = [(name, d["summary"]["covered_branches"], d["summary"]["num_branches"])
                for name, d in sorted(files.items()) if os.path.realpath(name) in set(sources)]
        pool = SourceCoverage(sum(c for _n, c, _t in mine), sum(t for _n, _c, t in mine), tuple(mine))
    callers = _lines_of(lambda name, op: op.role == "caller")
    lacked = (_lines_of(lambda name, op: name in lacks) - _lines_of(lambda name, op: name not in lacks)
              if lacks else set())  # a function another operation shares is not the lacked one's
    missed: list[Branch] = []
    covered = total = 0
    for measured in MEASURED:
        data = next((d for name, d in files.items() if os.path.realpath(name) == measured), None)
        if data is None:
            continue
        with open(measured, encoding="utf-8") as fh:
            lines = [line.strip() for line in fh.read().splitlines()]
        name = os.path.basename(measured)
        missed += [Branch(name, a, max(b, 0), lines[a - 1], lines[b - 1] if b > 0 else "",
                          (measured, a) in callers, (measured, a) in lacked)
                   for a, b in data["missing_branches"]]
        covered += data["summary"]["covered_branches"]
        total += data["summary"]["num_branches"]
    return PhaseCoverage(phase, misuse, covered, total, tuple(sorted(missed)), pool=pool)


def _lines_of(which: Callable[[str, Any], bool]) -> set[tuple[str, int]]:
    """The lines of the operations ``which`` picks (by name and declaration): the caller's own
    (the owner's writes), which no pool call runs, or those a pool lacks, which none is sent."""
    out: set[tuple[str, int]] = set()
    for name, op in OPERATIONS.items():
        if not which(name, op):
            continue
        for fn in (op.guard, op.requires, op.next):
            body, first = inspect.getsourcelines(fn)
            out |= {(os.path.realpath(inspect.getfile(fn)), n) for n in range(first, first + len(body))}
    return out


__all__ = ["MEASURED", "Branch", "PhaseCoverage", "SourceCoverage", "measure", "measure_phase",
           "pool_sources"]
