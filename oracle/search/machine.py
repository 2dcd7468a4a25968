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

Realistic inputs: prompts take prefixes of two fixed documents, requests
are served and finished between steps, finished conversations go on with a
follow-up turn and live ones are sampled again (parallel sampling), so
lookups hit (idle blocks and blocks in use); one or two KV-cache groups
whose block size is a multiple of ``hash_block_size``; LoRA, cache-salt, session and multimodal extra keys
(several items, short or adjacent, several in one chunk); partial-block
entries at every chunk boundary (and, under vLLM 0.33, at a block's end),
their promotion when the block fills, their re-registration with
``replace_existing_hashes`` by a block's sole owner; block masks;
``cache_full_blocks`` asked for fewer blocks than are cached;
sliding-window placeholders (the null block) in block tables and as the
block of a partial entry; copy-on-write hash moves, of unhashed blocks too;
one block listed several times in one ``touch``, ``free_blocks`` or
``unpin_blocks``; unpinned blocks with named reuse watchers; evictions;
resets with and without blocks in use; events on or off; blocks of a second
pool of the same implementation (ids overlapping the first's), freed through
the first pool alone or mixed with its own blocks, as vLLM's ``free_blocks``
allows: each pool takes back its own.  Every call keeps to the model's caller
contracts, so a correct pool never diverges.  Misuse rules (only when the
adapter refuses misuse) make wrong calls the model refuses, one per refusal,
and compare error types, among them double frees of a second pool's blocks
through the first and the first pool's other operations on them (refused
like any block not of the pool: the model sees an id outside the pool, as
:class:`Lockstep`'s ``foreign`` block).

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
        """One step of the campaign's workload, by name, its dice seeded by ``dice``.

        Every kind of campaign step exists here (admit, decode, finish,
        slide, move, share, offload, other_pool, misuse, ...), on requests
        and blocks of its own beside the other rules' (the calls go to the
        same pools), so a bug the campaign finds the machine finds too, and
        shrinks to the steps it needs.
        """
        if kind == "misuse" and not self.MISUSE:
            return
        self.work.rng = random.Random(dice)
        getattr(self.work, kind)()

    @rule(ops=st.lists(st.sampled_from(sorted({op for op, _s in SCENARIOS})), min_size=1, max_size=3,
                       unique=True),
          leave_out=st.lists(st.sampled_from(sorted(FEATURE_NAMES)), max_size=3, unique=True))
    def directed(self, ops: list[str], leave_out: list[str]) -> None:
        """Calls of ``ops`` with many features at once, each on fresh pools (:mod:`.directed`).

        For each operation, one call per largest set of its features that can
        meet, less ``leave_out``: a failure shrinks to the operation and the
        features it needs.
        """
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
        """Compare the observations and check the model's invariants.

        Every lockstep call already checks after itself and state changes
        only through calls, so this checks only when no call has been
        checked yet (the fresh pool); the rest would repeat the same work.
        """
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
    """A state machine class driving ``adapter``'s pool against the model.

    ``misuse`` defaults to what the adapter supports and is never turned on
    for an adapter that does not refuse misuse.  ``reference`` names the vLLM
    version whose behaviour the model reproduces.  ``lacks``: what the pool
    lacks (:mod:`..generate.capabilities`), never made.
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
