"""A Hypothesis state machine that drives the model and any pool in lockstep.

Every call goes through a :class:`~kvpool.oracle.core.lockstep.Lockstep`,
which compares results, error types, the whole observation, pending events
and watcher firings, and checks every model invariant after each call; the
``@invariant`` runs the same check on the fresh pool (later states only arise
through calls, each checked as it happens).

:func:`machine_for` builds a ``RuleBasedStateMachine`` for one
:class:`~kvpool.oracle.core.adapter.Adapter`.  :class:`PoolMachine` joins the
rule sets of :mod:`.machine_requests` (serving requests),
:mod:`.machine_blocks` (blocks held outside requests, a second pool's) and
:mod:`.machine_misuse` (wrong calls), each over :mod:`.machine_state` (what
the machine holds) and drawing from :mod:`.machine_draws`; this module adds
the rules on the whole pool, the campaign's steps and directed calls as
rules, a call of each operation no rule calls from its arguments' kinds
(:mod:`..generate.defaults`), the invariant, and :class:`MachineFailure`, which
reads a shrunk failure.

Why dedicated rules rather than the random :class:`Workload`: Hypothesis can
only shrink and print what it draws as rule arguments.  A rule that draws a
seed and lets ``Workload`` roll dice prints ``admit(seed=83412)``, which says
nothing; here each rule names its inputs (which document a prompt reads,
how long it is, its LoRA/salt/image, whether to look up the cache, to cache a
partial block, which block mask), so the shrunk failure reads as a
scenario.  The bookkeeping that does not involve choices is reused from
``Workload`` (its documents, block hasher, lookup, hash resolution, growing a
block table, releasing a request) and from ``Running`` / ``RunConfig``.

The inputs are realistic (prompts share prefixes of two fixed documents, so
lookups hit; each rule module's docstring says what its rules cover).  Every
call but the misuse rules' keeps to the model's caller contracts, so a correct
pool never diverges; misuse rules run only when the adapter refuses misuse.

Use it from pytest as ``TestMyPool = machine_for(my_adapter).TestCase``, or
through ``kvpool conform`` (:mod:`kvpool.oracle.search.conform`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from ..core.adapter import Adapter, adapter_factory
from ..generate.defaults import chooser, unwritten
from ..generate.defaults import default_call as make_default_call
from ..generate.directed import SCENARIOS, Directed, scenarios
from ..generate.features import FEATURES as FEATURE_NAMES
from ..generate.features import closed
from ..generate.workload import Workload
from .machine_blocks import BlockRules
from .machine_draws import Prompt, prompts
from .machine_misuse import MisuseRules
from .machine_requests import RequestRules


class PoolMachine(RequestRules, BlockRules, MisuseRules):
    """The rules joined; :func:`machine_for` binds an adapter in a subclass."""

    @rule(kind=st.sampled_from([name for name, _weight in Workload.STEPS]), dice=st.integers(0, 2**16))
    def workload_step(self, kind: str, dice: int) -> None:
        """One step of the campaign's workload, by name, its dice seeded by ``dice``: a bug the
        campaign finds the machine finds too, and shrinks to the steps it needs."""
        if kind == "misuse" and not self.MISUSE:
            return
        self.work.rng = random.Random(dice)
        getattr(self.work, kind)()

    @rule(ops=st.lists(st.sampled_from(sorted({op for op, _s in SCENARIOS})), min_size=1, max_size=3,
                       unique=True),
          leave_out=st.lists(st.sampled_from(sorted(FEATURE_NAMES)), max_size=3, unique=True))
    def directed(self, ops: list[str], leave_out: list[str]) -> None:
        """Calls of ``ops`` with many features at once (less ``leave_out``), each on fresh pools
        (:mod:`.directed`): a failure shrinks to the operation and the features it needs."""
        scratch = getattr(self.ADAPTER, "scratch", None)  # a process-backed pool: its own processes
        maker = Directed(adapter_factory(scratch() if scratch else self.ADAPTER), self.REFERENCE,
                         self.ADAPTER.errors_match,
                         getattr(self.ADAPTER, "observe", None), lacks=self.LACKS)
        for op, wanted in scenarios(self.LACKS) if self.LACKS else SCENARIOS:
            if op in ops:
                maker.make(op, wanted - frozenset(leave_out), self.FEATURES)

    @precondition(lambda self: self._any_cached())
    @rule(picks=st.lists(st.integers(0, 15), max_size=3), also_uncached=st.booleans())
    def evict(self, picks: list[int], also_uncached: bool) -> None:
        """Drop cached blocks from the index (picked among the cached ones)."""
        cached = self._cached_blocks()
        ids = [cached[i % len(cached)] for i in picks]
        if also_uncached:
            ids += [b for b in range(self.cfg.num_blocks) if b not in cached][:1]
        if (len(ids) == 1 and self.lock.supports("_maybe_evict_cached_block")
                and self.lock.can("_maybe_evict_cached_block", ids[0])):
            self.lock.call("_maybe_evict_cached_block", ids[0])  # vLLM's checkpointed-state manager
        else:
            self.lock.maybe("evict_blocks", ids)

    @precondition(lambda self: self._any_cached() or (self.pair is not None and self.pair.model.watchers))
    @rule(drain=st.booleans())
    def reset(self, drain: bool) -> None:
        """Reset the prefix cache; refused (False) while blocks are in use."""
        if drain:
            for run in list(self.live.values()):
                self._drop(run)
            for table in self.held:
                if table.live:
                    table.live = False
                    self.lock.maybe("free_blocks", table.ids)
        self.lock.maybe("reset_prefix_cache")

    @rule(block=st.integers(0, 15))
    def queries(self, block: int) -> None:
        """The read-only operations, and taking the pending events."""
        self.lock.maybe("take_events")
        self.lock.maybe("get_usage")
        self.lock.call("get_num_free_blocks")
        self.lock.call("is_block_writable", block % self.cfg.num_blocks)

    def _cached_blocks(self) -> list[int]:
        return [b for b, p in enumerate(self.lock.model.primary) if p is not None]

    def _any_cached(self) -> bool:
        return self.pair is not None and any(p is not None for p in self.pair.model.primary)

    @invariant()
    def pool_agrees_with_model(self) -> None:
        """Compare the fresh pool with the model (every call checks after itself)."""
        if self.pair is not None and self.pair.steps == 0:
            self.pair.check()


def _default_rule(ops: list[str]) -> Any:
    """The rule that calls ``ops``, the operations no other rule calls, from their arguments' kinds."""

    @rule(op=st.sampled_from(ops), prompt=prompts, picks=st.lists(st.integers(0, 255), max_size=12))
    def default_call(self: PoolMachine, op: str, prompt: Prompt, picks: list[int]) -> None:
        """A call of ``op`` on blocks of its own, each argument picked among its kind's values
        (:mod:`..generate.defaults`)."""
        if self.lock.supports(op):
            make_default_call(self.lock, op, chooser(picks), self._request(prompt),
                              list(self.cfg.block_sizes), self.MISUSE)

    return default_call


def machine_for(adapter: Adapter, *, misuse: bool | None = None,
                reference: str = "0.31", lacks: frozenset[str] = frozenset()) -> type[PoolMachine]:
    """A state machine class driving ``adapter``'s pool against the model, for vLLM ``reference``.

    ``misuse`` is never on for an adapter that does not refuse misuse; ``lacks`` is never made.
    """
    gone = closed(lacks)
    misuse_on = adapter.supports_misuse if misuse is None else misuse and adapter.supports_misuse
    attrs: dict[str, Any] = {"ADAPTER": adapter, "MISUSE": misuse_on and "misuse" not in gone,
                             "REFERENCE": reference, "LACKS": gone,
                             "__doc__": f"Lockstep state machine for {adapter.name}."}
    if unwritten():  # operations declared since the rules were written (a rule only then: seeds stay)
        attrs["default_call"] = _default_rule(unwritten())
    return type(f"PoolMachine_{_ident(adapter.name)}", (PoolMachine,), attrs)


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.rsplit(":", 1)[-1]) or "pool"


@dataclass
class MachineFailure:
    """A shrunk failure: the Hypothesis steps and the lockstep's message."""

    message: str
    steps: list[str] = field(default_factory=list)

    @classmethod
    def from_exception(cls, exc: BaseException) -> MachineFailure:
        """Read the minimal example Hypothesis attached to the exception as notes."""
        notes = [str(n) for n in getattr(exc, "__notes__", ())]
        steps = [n for n in notes if n.startswith("state.") or " = state." in n]
        noise = {"state.teardown()", "state.pool_agrees_with_model()"}
        steps = [" ".join(s.split()) for s in steps if s not in noise]
        return cls(f"{type(exc).__name__}: {exc}", steps)


__all__ = ["MachineFailure", "PoolMachine", "machine_for"]
