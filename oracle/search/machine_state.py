"""What the state machine holds between rules, and the helpers every kind of rule shares.

:class:`MachineState` is the base of the rule sets (:mod:`.machine_requests`,
:mod:`.machine_blocks`, :mod:`.machine_misuse`) that :class:`.machine.PoolMachine`
joins: the pool and its model in lockstep, a second pool built on first use,
the requests alive and the tables held, and the bundles through which one
rule hands another what it made.  Hypothesis finds rules by name on the
joined class, so each set can live in its own module.
"""

from __future__ import annotations

import random
from typing import ClassVar

from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize

from kvpool.impl.request import LoRARequest, Request

from ..core.adapter import Adapter, adapter_factory
from ..core.lockstep import Lockstep
from ..generate.capabilities import Capabilities
from ..generate.features import FeatureLog
from ..generate.runs import RunConfig, Running
from ..generate.two_pools import free_across
from ..generate.workload import Workload
from .machine_draws import LORA_IDS, Prompt, Table, configs

runs = Bundle("runs")
"""Requests in flight, each with its block table per KV-cache group."""
finished = Bundle("finished")
"""Finished requests, whose conversation may go on (see ``follow_up``)."""
tables = Bundle("tables")
"""Blocks allocated outside any request."""
others = Bundle("others")
"""Blocks of the second pool, held to be freed through the first."""


class MachineState(RuleBasedStateMachine):
    """The state; :func:`.machine.machine_for` binds an adapter in a subclass of the joined rules."""

    ADAPTER: ClassVar[Adapter]
    MISUSE: ClassVar[bool] = False
    REFERENCE: ClassVar[str] = "0.31"
    FEATURES: ClassVar[FeatureLog | None] = None
    """Where the calls' shape features go, over all examples (:mod:`.features`; None: nowhere)."""
    LACKS: ClassVar[frozenset[str]] = frozenset()
    """What the pool lacks, closed (:mod:`..generate.capabilities`): no call with any of it."""

    cfg: RunConfig
    work: Workload

    def __init__(self) -> None:
        super().__init__()
        self.pair: Lockstep | None = None
        self.other: Lockstep | None = None
        self.live: dict[str, Running] = {}
        self.held: list[Table] = []
        self.counter = 0

    @initialize(cfg=configs())
    def setup(self, cfg: RunConfig) -> None:
        self.cfg = cfg = Capabilities(self.LACKS, self.LACKS).fit(cfg)
        self.pair = self._fresh()
        # Fixed documents and hasher; this Workload's dice are rolled only by ``workload_step``, seeded.
        self.work = Workload(random.Random(0), cfg, self.pair, misuse_on=self.MISUSE, second=self._second)

    @property
    def lock(self) -> Lockstep:
        assert self.pair is not None, "setup runs first"
        return self.pair

    def _fresh(self) -> Lockstep:
        """A pool of the run's shape beside its own model, compared as the adapter allows."""
        cfg = self.cfg
        pair = Lockstep.fresh(adapter_factory(self.ADAPTER), cfg.num_blocks, cfg.caching,
                              cfg.hash_block_size, cfg.events, self.REFERENCE, metrics=cfg.metrics,
                              errors_match=self.ADAPTER.errors_match,
                              observe=getattr(self.ADAPTER, "observe", None), features=self.FEATURES)
        pair.lacks = self.LACKS | (pair.lacks or frozenset())
        return pair

    def _second(self) -> Lockstep:
        """The second pool and its own model, shaped like the first; built on first use."""
        if self.other is None:
            pair = self._fresh()
            pair.which = 1
            pair.check()
            self.other = pair
        return self.other

    def _request(self, prompt: Prompt) -> Request:
        self.counter += 1
        tokens = self.work.documents[prompt.doc][: prompt.length] + list(prompt.tail)
        lacks = self.LACKS
        lora = (LoRARequest(prompt.lora, LORA_IDS[prompt.lora], "/a") if prompt.lora and "lora" not in lacks
                else None)
        return Request(f"r{self.counter}", tokens, block_hasher=self.work.hasher, lora_request=lora,
                       cache_salt=None if "salt" in lacks else prompt.salt,
                       mm_features=[] if "mm" in lacks else prompt.features(len(tokens)),
                       session_id=None if "session" in lacks else prompt.session)

    def _alive(self, run: Running) -> bool:
        return self.live.get(run.request.request_id) is run

    def _drop(self, run: Running) -> None:
        self.live.pop(run.request.request_id, None)
        self.work._release(run, unpin=False)

    def _free_across(self, mine: list[int], theirs: list[int], interleave: bool) -> None:
        """One ``free_blocks`` on the first pool listing blocks of both (:func:`.two_pools.free_across`)."""
        first, second = self.lock, self._second()
        listed = [(first, b) for b in mine] + [(second, b) for b in theirs]
        if interleave:
            listed = listed[1::2] + listed[::2]
        free_across(first, second, listed)
