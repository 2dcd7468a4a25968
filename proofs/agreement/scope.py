"""What the agreement checks, on one BMC pool: its finite domain and the z3 terms compiled over it.

The constants say which refusals and contracts have a z3 counterpart, and which
predicates and step properties are compared with the model's of the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import INVARIANTS, LEMMAS, RefusalKind
from kvpool.model.properties import STEP_PROPERTIES
from kvpool.model.request import content
from kvpool.model.state import Key

from .. import bmc
from ..evaluate.compiled import (
    Compiled,
    CompiledQueue,
    Predicate,
    compile_claim,
    compile_predicate,
    compile_queue_step,
    compile_step,
)
from ..evaluate.interp import Carriers
from ..invariants import SYM_INVARIANTS, SYM_LEMMAS, SymInvariant
from ..order import ORDER_PROPERTIES, QSTEPS
from ..step_properties import SYM_STEP_PROPERTIES, SymStepProperty
from ..symbolic import Content, KeySort
from ..transitions import STEPS, StepSpec

STATE_REFUSALS = (RefusalKind.NOT_ENOUGH_FREE_BLOCKS, RefusalKind.NOT_IN_USE,
                  RefusalKind.HASH_CONFLICT, RefusalKind.NULL_BLOCK, RefusalKind.CACHING_DISABLED)
"""Refusals that depend on the state: the z3 precondition must be false there."""
ARGUMENT_REFUSALS = (RefusalKind.INVALID_ARGUMENT, RefusalKind.UNKNOWN_BLOCK)
"""Refusals of the arguments' shape: the encoding has no counterpart (its sorts hold only
well-formed values), so such calls are skipped and counted."""
BATCH_CONTRACTS = ("cached_once_per_call",)
"""Contracts on a whole batch: no per-block step can see them (skipped and counted)."""

COMPARED_PROPERTIES = (*SYM_STEP_PROPERTIES, *(n for n in ORDER_PROPERTIES if n in STEP_PROPERTIES))
"""The step properties compared with the model's of the same name, on every accepted call."""

CHECKED = {**SYM_INVARIANTS, **SYM_LEMMAS}
"""Every z3 state predicate checked against the model's predicate of the same name."""
MODEL_PREDICATES = {**INVARIANTS, **LEMMAS}


# --------------------------------------------------------------------------
# The scope.


def domain_of(cfg: bmc.Bounds) -> Carriers:
    """Every key and content the BMC's requests can name, at the configuration's hash block size."""
    hbs = cfg.hash_block_size
    keys: set[Key] = set()
    contents: set[Any] = set()
    for r in cfg.requests():
        for i, h in enumerate(r.block_hashes):
            keys |= {(h, g) for g in cfg.groups}
            contents.add(content(r, (i + 1) * hbs, hbs))
    return Carriers.of(cfg.blocks, keys, contents)


@dataclass
class Compiledset:
    """The z3 steps, predicates, step properties and queue steps compiled for one domain."""

    domain: Carriers
    steps: dict[str, Compiled]
    predicates: dict[str, Predicate]
    specs: dict[str, StepSpec]
    claims: dict[str, dict[str, Callable[..., bool]]] = field(default_factory=dict)
    """Per step property, per step it speaks of: ``(state, post, *args, pre, removed, stored)``."""
    queue: dict[str, CompiledQueue] = field(default_factory=dict)
    converters: dict[str, tuple[Mapping[Any, int] | None, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.converters = {n: converters_of(self.domain, sp) for n, sp in self.specs.items()}


def compile_all(d: Carriers, steps: Mapping[str, StepSpec] | None = None,
                predicates: Mapping[str, SymInvariant] | None = None,
                properties: Mapping[str, SymStepProperty] | None = None,
                queue: Mapping[str, tuple[Callable[..., Any], Any]] | None = None) -> Compiledset:
    """Compile every step, predicate, step property and queue step; each argument replaces some
    by name (seeded encoding bugs)."""
    specs = {**STEPS, **(steps or {})}
    preds = {**CHECKED, **(predicates or {})}
    props = {**SYM_STEP_PROPERTIES, **(properties or {})}
    qsteps = {**QSTEPS, **(queue or {})}
    claims = {p: {st: compile_claim(d, specs[st], prop.claim, f"{p} of {st}")
                  for st in specs if prop.steps is None or st in prop.steps}
              for p, prop in props.items()}
    return Compiledset(d, {n: compile_step(d, sp) for n, sp in specs.items()},
                       {n: compile_predicate(d, p, n) for n, p in preds.items()}, specs, claims,
                       {n: compile_queue_step(d, n, fn, sorts, ORDER_PROPERTIES)
                        for n, (fn, sorts) in qsteps.items()})


def converters_of(d: Carriers, spec: StepSpec) -> tuple[Mapping[Any, int] | None, ...]:
    """Per argument of ``spec``: the table that turns a model value into the compiled form."""
    return tuple(d.key_id if sort.eq(KeySort) else d.content_id if sort.eq(Content) else None
                 for _n, sort in spec.args)


def concrete_args(conv: tuple[Mapping[Any, int] | None, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Step arguments as the compiled steps take them (keys and contents by index)."""
    return tuple(v if c is None else c[v] for c, v in zip(conv, args, strict=True))
