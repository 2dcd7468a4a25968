"""The legal corpus grown from any trace: kept where it reaches what the corpus does not.

A caller contract too strong refuses calls a correct caller makes, and only legal call
sequences show it (:mod:`kvpool.oracle.generate.legal`: ``bmc/legal-corpus`` replays each
on the model, every contract must accept each whole).  The corpus grows from traces in the
trace format, whoever recorded them: ``kvpool record``, the shadow under vLLM's own tests,
``kvpool replay --trace`` of production request traces.  A trace is added only if it is
legal (the model accepts it whole and agrees with every recorded result) and takes a branch
of a guard or a contract (where a call is accepted or refused), or a pair of them in one call,
that no trace of the corpus takes (:mod:`kvpool.proofs.bmc.branches`); it is kept up to its
last call that takes something new, so an hour of traffic costs the corpus only the calls that
teach it something.
A trace the model refuses is not added: it is reported, as a contract too strong or a
caller that broke one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.model import REFERENCES, initial_state
from kvpool.oracle.core.lockstep import Watcher
from kvpool.oracle.generate.legal import legal_traces
from kvpool.oracle.trace import check_trace
from kvpool.oracle.trace.check import model_call
from kvpool.oracle.trace.read import TraceStep, iter_trace
from kvpool.proofs.bmc.branches import Branch, Tracer, pairs_of

DECIDING = ("guards.py", "contracts.py")
"""Where the model decides whether a call is accepted: what a legal trace can teach the corpus."""
Reached = set[tuple[str, Branch] | tuple[str, Branch, Branch]]
"""Branches (per operation) and pairs of branches (per call) reached."""


def reached(path: str | Path, tracer: Tracer | None = None) -> Iterator[tuple[int, Reached]]:
    """What each call of a trace reaches on the model, call by call, with its line (read as it
    comes: a trace may be longer than memory)."""
    tracer = tracer or Tracer()
    h, steps = iter_trace(path)
    state = initial_state(h.num_blocks, h.enable_caching, h.hash_block_size, h.enable_kv_cache_events,
                          h.medium, **REFERENCES[h.reference])
    watchers: dict[str, Watcher] = {}
    log: list[tuple[str, int]] = []
    box = [state]
    for step in steps:

        def call(step: TraceStep = step) -> None:
            box[0] = model_call(box[0], step, watchers, log)[0]

        taken = frozenset(b for b in tracer.taking(call) if b[0] in DECIDING)
        box[0].events = []
        yield step.line, {(step.op, b) for b in taken} | pairs_of(step.op, taken)


@dataclass
class Grown:
    """What one trace gave the corpus."""

    path: str
    calls: int
    kept: int = 0
    """Calls kept (a prefix of the trace); 0: not added."""
    lines: int = 0
    """The file's lines kept (the header's included)."""
    new: int = 0
    """Branches and pairs of branches no trace of the corpus reached before."""
    refused: str = ""
    """Why the model does not accept the trace whole (then it is not added)."""
    written: str = ""


@dataclass
class Growth:
    corpus: int
    """Branches and pairs the corpus reached before."""
    traces: list[Grown] = field(default_factory=list)


def grow(paths: Sequence[str | Path], into: Path, corpus: Sequence[Path] | None = None,
         dry_run: bool = False) -> Growth:
    """Add each legal trace of ``paths`` that reaches something new to the folder ``into``, cut
    after its last call that does (the corpus so far: ``corpus``, by default the shipped one)."""
    tracer = Tracer()
    known: Reached = set()
    for p in legal_traces() if corpus is None else corpus:
        for _line, r in reached(p, tracer):
            known |= r
    out = Growth(len(known))
    for path in paths:
        report = check_trace(path)
        if not report.ok:
            out.traces.append(Grown(str(path), report.steps, refused=report.format().splitlines()[0]))
            continue
        grown = Grown(str(path), 0)
        for line, r in reached(path, tracer):
            grown.calls += 1
            fresh = r - known
            if fresh:
                grown.new += len(fresh)
                grown.kept, grown.lines = grown.calls, line
                known |= fresh
        if grown.kept and not dry_run:
            grown.written = str(_write_prefix(Path(path), grown.lines, grown.kept, grown.calls, into))
        out.traces.append(grown)
    return out


def _write_prefix(path: Path, lines: int, calls: int, of: int, into: Path) -> Path:
    """The trace's first ``lines`` lines (its header and first ``calls`` calls) under ``into``, named
    after the trace; the header says what it is a prefix of."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / path.name
    with path.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for number, text in enumerate(src, start=1):
            if number > lines:
                break
            if number == 1:
                header = json.loads(text)
                header.setdefault("meta", {})["legal_prefix_of"] = {"trace": path.name, "calls": calls,
                                                                   "of": of}
                text = json.dumps(header, separators=(",", ":")) + "\n"
            dst.write(text if text.endswith("\n") else text + "\n")
    return target


__all__ = ["Grown", "Growth", "grow", "reached"]
