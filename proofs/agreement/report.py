"""What an agreement run found: each disagreement, the counts of what it covered, and the run's context."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvpool.model.properties import EVENT_LOG
from kvpool.model.state import PoolState

from .scope import Compiledset


@dataclass
class Disagreement:
    """One place where the encoding and the model differ, with what a reviewer needs to see it."""

    case: str
    """``invariant/<name>`` or ``step/<name>``."""
    state: PoolState
    what: str
    """The perturbation or the call."""
    detail: str
    """Which field (or predicate) differs, z3's value against the model's."""


@dataclass
class Report:
    """What one run covered and every disagreement it found (the first few of each case)."""

    blocks: int
    hash_block_size: int
    depth_target: int
    depth: int = 0
    complete: bool = True
    states: int = 0
    perturbed: int = 0
    unfaithful: int = 0
    transitions: int = 0
    calls: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """Processor time of the run (the machine may be shared: wall time alone would mislead)."""
    skipped: Counter[str] = field(default_factory=Counter)
    invariants: dict[str, list[int]] = field(default_factory=dict)
    """Per checked predicate: [states where it is true, states where it is false] (faithful states)."""
    steps: dict[str, list[int]] = field(default_factory=dict)
    """Per step: [calls where the steps are enabled, calls refused]."""
    properties: dict[str, list[int]] = field(default_factory=dict)
    """Per step property compared: [transitions where the model's holds, where it does not]."""
    queues: int = 0
    """Accepted calls whose queue (as a sequence of places) was compared."""
    events: bool = True
    """The pool emits events (else the event-log properties hold vacuously, both sides)."""
    perturbations: Counter[str] = field(default_factory=Counter)
    disagreements: Counter[str] = field(default_factory=Counter)
    """Per case, how many disagreements were found."""
    examples: dict[str, list[Disagreement]] = field(default_factory=dict)
    """Per case, the first few disagreements."""

    keep: int = 3

    def add(self, d: Disagreement) -> None:
        self.disagreements[d.case] += 1
        kept = self.examples.setdefault(d.case, [])
        if len(kept) < self.keep:
            kept.append(d)

    @property
    def never_false(self) -> list[str]:
        """Predicates no checked state made false: their "both ways" is not shown."""
        return [n for n, (_t, f) in self.invariants.items() if f == 0]

    @property
    def ok(self) -> bool:
        return not self.disagreements and not self.never_false

    @property
    def never_broken(self) -> list[str]:
        """Step properties no compared transition broke: their "both ways" is not shown."""
        return [n for n, (_t, f) in self.properties.items() if f == 0 and (self.events or n not in EVENT_LOG)]


@dataclass
class Run:
    """One run's compiled terms, its report, and the rotation that picks perturbations and alterations."""

    compiled: Compiledset
    report: Report
    perturb: int
    turn: int = 0
