"""What a pool has: the operations, features and shapes it declares it lacks, and the calls that fit.

Engines implement the part of vLLM's pool they serve: one KV-cache group,
blocks as large as a hash chunk, no partial entries, no reuse watchers.  A
pool says what it lacks (a class attribute ``kvpool_lacks``, ``--lacks``, or
``"lacks"`` in a process's header answer, ``oracle/DRIVE_PROTOCOL.md``) by the
names of :data:`~.features.DECLARABLE`: operations, the call features
``kvpool conform --coverage`` prints, and the pool shapes of
:data:`~.features.SHAPES`.  The names are closed over what they imply
(:func:`~.features.closed`: no big blocks, no partial entries, no promotion).

Then no call with a lacked operation or feature is ever made: the
generators draw only pools and calls the pool has (:meth:`Capabilities.fit`,
and requests without the extra keys it lacks), and the lockstep refuses to make any
call that has one anyway (:func:`lacked_in`), ending the run or example
there (:class:`Unmakeable`) rather than making it or going on with a caller
whose books no longer match the pools.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvpool.model import OPERATIONS

from .features import DECLARABLE, FEATURES, SHAPES, call_features, closed

try:
    from hypothesis.errors import UnsatisfiedAssumption
except ImportError:  # the shadow runs without Hypothesis, and no example is there to drop
    UnsatisfiedAssumption = Exception  # type: ignore[misc, assignment]

C = TypeVar("C")

EXTRAS = ("lora", "salt", "session", "mm")
"""The extra keys a request may carry, by the feature that names each."""


class _Skipped:
    """What :meth:`~kvpool.oracle.core.lockstep.Lockstep.maybe` returns for a call it did not make."""

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED = _Skipped()
"""A call left out because the pool lacks something it has."""


class Unmakeable(UnsatisfiedAssumption):
    """A generator asked for a call the pool lacks: the run (or the state machine's example) ends
    before it.  An unsatisfied assumption to Hypothesis, which then drops the example."""

    def __init__(self, op: str, lacked: str) -> None:
        super().__init__(f"{op}: the pool lacks {lacked}")
        self.op, self.lacked = op, lacked


@dataclass(frozen=True)
class Capabilities:
    """A pool's declared lacks, closed over what they imply (empty: the whole of vLLM's pool)."""

    declared: frozenset[str] = frozenset()
    lacks: frozenset[str] = frozenset()

    @classmethod
    def of(cls, names: Iterable[str]) -> Capabilities:
        """From declared names; raises ``ValueError`` for a name that is not declarable."""
        declared = frozenset(names)
        return cls(declared, closed(declared))

    def has(self, name: str) -> bool:
        return name not in self.lacks

    def fit(self, cfg: C) -> C:
        """A run's shape (a ``RunConfig``) as the pool has it: one group, blocks of one hash chunk,
        events, metrics or caching off, as it lacks them."""
        if not self.lacks:
            return cfg
        sizes: dict[int, int] = dict(getattr(cfg, "block_sizes"))  # noqa: B009
        hbs: int = getattr(cfg, "hash_block_size")  # noqa: B009
        if "several_groups" in self.lacks:
            sizes = {0: sizes[min(sizes)]}
        if "big_block" in self.lacks:
            sizes = {g: hbs for g in sizes}
        changes: dict[str, Any] = {"block_sizes": sizes}
        changes.update({flag: False for flag in ("events", "metrics") if flag in self.lacks})
        if "caching_off" in self.lacks:
            changes["caching"] = True
        if all(e in self.lacks for e in EXTRAS):
            changes["extra_keys"] = False
        return replace(cfg, **changes)  # type: ignore[type-var]

    def not_checked(self) -> list[str]:
        """What a check of this pool leaves out, readably, for the first lines of a verdict: a
        heading, then the operations never called and the features never made, indented."""
        if not self.lacks:
            return []
        ops = sorted(n for n in self.lacks if n in OPERATIONS)
        features = sorted(n for n in self.lacks if n in FEATURES or n in SHAPES)
        implied = self.lacks - self.declared
        lines = ["not checked, as the pool lacks them"
                 + (f" (* implied by what it declares: {', '.join(sorted(self.declared))})" if implied
                    else "") + ":"]
        lines += [f"  {what}: " + ", ".join(f"{n}*" if n in implied else n for n in names)
                  for what, names in (("operations never called", ops), ("features never made", features))
                  if names]
        return lines


def declared_lacks(*sources: Any) -> Capabilities:
    """The lacks declared by pools, classes and adapters (``kvpool_lacks`` or ``lacks``), joined."""
    names: set[str] = set()
    for source in sources:
        for attr in ("kvpool_lacks", "lacks"):
            found = getattr(source, attr, None)
            if isinstance(found, Capabilities):
                names |= found.declared
            elif isinstance(found, (list, tuple, set, frozenset)):
                names |= {str(n) for n in found}
    return Capabilities.of(names)


def parse_lacks(text: str | None) -> frozenset[str]:
    """``--lacks a,b c``: names split at commas and spaces, each checked; ``ValueError`` names a
    bad one and the declarable ones."""
    names = frozenset(n for n in (text or "").replace(",", " ").split() if n)
    closed(names)
    return names


def lacked_in(lacks: frozenset[str], model: Any, op: str, bound: Sequence[Any], *, second: bool,
              metrics: bool) -> str | None:
    """The first thing the pool lacks that this call has (None: the pool has all of it): its
    operation, or a feature of its shape on the model's state before it."""
    if op in lacks:
        return op
    shape = call_features(model, op, bound, second=second, metrics=metrics)
    if op == "get_new_blocks" and bound and isinstance(bound[0], int) and bound[0] > len(model.free):
        shape.add("out_of_blocks")
    if "misuse" in lacks:
        shape |= {"misuse"} if _refused(model, op, bound) else set()
    gone = sorted(shape & lacks)
    return gone[0] if gone else None


def _refused(model: Any, op: str, bound: Sequence[Any]) -> bool:
    """Whether the model refuses the call for anything but a lack of blocks: a misuse."""
    try:
        OPERATIONS[op].guard(model, *bound)
    except Exception as exc:
        return getattr(getattr(exc, "kind", None), "name", "") != "NOT_ENOUGH_FREE_BLOCKS"
    return False


__all__ = ["DECLARABLE", "EXTRAS", "SKIPPED", "Capabilities", "Unmakeable", "declared_lacks", "lacked_in",
           "parse_lacks"]
