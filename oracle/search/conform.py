"""Check any block pool implementation against the model: the two conformance phases.

Two phases run against the implementation, each compared call by call with
the model through :class:`~kvpool.oracle.core.lockstep.Lockstep`:

* ``campaign`` -- seeded random workloads (:func:`kvpool.oracle.search.campaign.run_one`),
  ``runs`` runs of ``steps`` calls each: long and fast; a divergence is shrunk by delta
  debugging over the run's calls (:mod:`.shrink`); each run then makes the feature pairs
  of its share it missed (:mod:`.directed`);
* ``machine`` -- the Hypothesis state machine (:mod:`kvpool.oracle.search.machine`),
  ``examples`` examples of up to ``machine_steps`` rules: a failure is
  shrunk to a minimal trace of readable steps.

``Options.shard`` (``(index from 0, count)``) runs one shard's part of both:
the campaign's runs ``r`` with ``r % count == index``, and the state
machine's share of the examples under its own seed
(``seed + index * MACHINE_SEED_STRIDE``).  ``Options.database`` names
Hypothesis' example database (:mod:`.database`): a failure saved there by
one shard is replayed by the others before they generate anything.

The results are plain data; ``kvpool conform`` (:mod:`kvpool.cli.conform`)
prints them and writes them as JSON and JUnit.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import unittest
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from ..core.adapter import (
    Adapter,
    ClassAdapter,
    LoadError,
    Mispredicted,
    adapter_factory,
    adapter_for_class,
    load_object,
    missing_api,
)
from ..core.lockstep import CallerBrokeContract, Divergence, Lockstep
from ..generate.features import FeatureLog
from .campaign import run_one
from .database import describe, example_database
from .machine import MachineFailure, machine_for
from .shrink import shrink_log

ADAPTER_ATTRS = ("name", "supports_misuse", "construct", "errors_match")
MACHINE_SEED_STRIDE = 1_000_003
"""Shard ``i`` (from 0) of the state machine draws with Hypothesis seed ``seed + i * stride``."""


# ---------------------------------------------------------------- loading


def load_adapter(impl: str | None, adapter: str | None, strict_messages: bool = True,
                 lacks: frozenset[str] = frozenset()) -> Adapter:
    """The adapter for a pool class (``impl``) or from a factory (``adapter``), as ``module:name``.

    ``strict_messages``: see :func:`~.adapter.adapter_for_class`.  A bad spec, a class without the
    pool API, a factory that returns no adapter or a pool that cannot be built raise
    :class:`~kvpool.oracle.core.adapter.LoadError`, whose message starts with the spec.
    """
    if impl is not None:
        pool_class = load_object(impl)
        missing = missing_api(pool_class, lacks)
        if not callable(pool_class) or missing:
            raise LoadError(f"{impl!r} is not a block pool class: it lacks "
                            f"{', '.join(missing) or 'a constructor'}"
                            + (" (declare what it lacks with kvpool_lacks or --lacks)" if missing else ""))
        loaded: Adapter = adapter_for_class(pool_class, strict_messages)
        if lacks and isinstance(loaded, ClassAdapter):
            loaded = dataclasses.replace(loaded, lacks=lacks)
        spec = impl
    elif adapter is None:
        raise LoadError("name a pool class (--impl) or an adapter (--adapter)")
    else:
        factory = load_object(adapter)
        if not callable(factory):
            raise LoadError(f"{adapter!r} is not callable")
        try:
            loaded = factory()
        except Exception as exc:
            raise LoadError(f"{adapter!r} failed: {exc!r}") from None
        lacking = [a for a in ADAPTER_ATTRS if not hasattr(loaded, a)]
        if lacking:
            raise LoadError(f"{adapter!r} returned no adapter: it lacks {', '.join(lacking)}")
        spec = adapter
    try:
        loaded.construct(4, True, 1, False)
    except Exception as exc:
        raise LoadError(f"{spec!r}: cannot build a pool: {exc!r}") from None
    return loaded


# ----------------------------------------------------------------- phases


@dataclass
class Failure:
    """Why a phase failed: a divergence from the model, a caller contract broken (``contract``:
    the workload's fault, not the pool's), or a crash."""

    kind: str
    message: str
    details: str
    trace: list[str]
    seed: int | None
    divergence: Divergence | None = field(default=None, repr=False, compare=False)
    """The lockstep's divergence, for a picture of each last call (``kvpool.pictures``)."""
    cause: BaseException | None = field(default=None, repr=False, compare=False)
    """The pool's own exception, when it raised where the model did not (or crashed)."""
    shrunk_from: int | None = None
    """The campaign: how many calls the failing run made before its calls were shrunk to ``trace``
    (None: not shrunk)."""
    shrink_note: str = ""
    """Why the campaign's failure was not shrunk, if it was not."""
    requests: list[str] = field(default_factory=list)
    """The requests a shrunk trace names, with what each reads."""


@dataclass
class PhaseResult:
    name: str
    ok: bool
    seconds: float
    executed: int
    failure: Failure | None = None
    operations: dict[str, int] = field(default_factory=dict)
    """Calls made, by operation (the campaign)."""
    refusals: dict[str, int] = field(default_factory=dict)
    """Calls the model refused, by refusal (the campaign)."""
    replayed: bool = False
    """The failure came from replaying the example database, before any example was generated."""
    features: FeatureLog | None = field(default=None, repr=False, compare=False)
    """The shape features the phase's calls had, and the pairs that met (:mod:`.features`)."""


@dataclass
class Options:
    steps: int = 1000
    runs: int = 4
    examples: int = 200
    machine_steps: int = 25
    seed: int = 0
    misuse: bool = True
    reference: str = "0.31"
    shard: tuple[int, int] = (0, 1)
    """This run's part: ``(index from 0, count)``."""
    database: str | None = None
    """Hypothesis' example database (a directory or ``redis://HOST:PORT/N``); ``None``: none."""
    blocks: int | None = None
    """The campaign's pool size (``None``: drawn; the state machine keeps its own shapes)."""
    long_lived: bool = False
    shrink: bool = True
    lacks: frozenset[str] = frozenset()
    """What the pool declares it lacks (:mod:`..generate.capabilities`): never made, not checked."""

    def settings_json(self) -> dict[str, Any]:
        """The options as a result document shows them (the database without its password)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "shrink"}
        return {**out, "shard": [self.shard[0] + 1, self.shard[1]], "lacks": sorted(self.lacks),
                "database": None if self.database is None else describe(self.database)}

    def machine_examples(self) -> int:
        """This shard's share of the state machine's examples."""
        index, count = self.shard
        return self.examples // count + (1 if index < self.examples % count else 0)

    def machine_seed(self) -> int:
        return self.seed + self.shard[0] * MACHINE_SEED_STRIDE


def _failure(exc: BaseException, trace: list[str] | None, seed: int | None) -> Failure:
    text = str(exc)
    process = process_failure(exc)
    kind = ("process" if process is not None or isinstance(exc, NotRepeated)
            else "contract" if isinstance(exc, CallerBrokeContract)
            else "divergence" if isinstance(exc, Divergence) else "crash")
    if kind == "crash":
        text = f"{type(exc).__name__}: {text}"
    lines = text.splitlines() or [type(exc).__name__]
    if trace is None:  # the lockstep's own "last steps" lines
        trace = [ln.strip() for ln in lines if ln.strip().startswith("step ")]
    divergence = exc if isinstance(exc, Divergence) else None
    cause = exc.__cause__ if divergence is not None else exc
    if process is not None:  # the process's verdict (with its stderr), then the calls before it
        verdict = str(process)
        steps = [ln for ln in lines if ln.strip().startswith("step ")]
        text = "\n".join([verdict, *(["last calls:", *steps] if steps else [])])
        return Failure(kind, verdict.splitlines()[0], text, trace, seed, divergence, process)
    return Failure(kind, lines[0], text, trace, seed, divergence, cause)


def process_failure(exc: BaseException | None, depth: int = 0) -> BaseException | None:
    """The failure of a pool process (anything with a ``verdict``) that ``exc`` is or carries: as
    its cause or context, or among a group's exceptions (Hypothesis wraps a failure that came and
    went, a process dying at a count of lines, in ``FlakyFailure``)."""
    if exc is None or depth > 8:
        return None
    if getattr(exc, "verdict", None) is not None:
        return exc
    for inner in (exc.__cause__, exc.__context__, *getattr(exc, "exceptions", ())):
        found = process_failure(inner, depth + 1)
        if found is not None:
            return found
    return None


def _shrunk_failure(exc: BaseException, seed: int, made: int) -> Failure:
    """A campaign run's failure, its calls shrunk when the run kept them (:mod:`.shrink`)."""
    log = getattr(exc, "log", None)
    if (not isinstance(exc, Divergence) or isinstance(exc, CallerBrokeContract) or log is None
            or process_failure(exc) is not None):  # a process's failure is shrunk against it (drive)
        return _failure(exc, None, seed)
    shrunk = shrink_log(log)
    if shrunk.divergence is None or not shrunk.lines:
        return dataclasses.replace(_failure(exc, None, seed), shrink_note=shrunk.note)
    return dataclasses.replace(_failure(shrunk.divergence, shrunk.lines, seed), shrunk_from=made,
                               requests=shrunk.requests)


def observation_level(adapter: Adapter, reference: str = "0.31") -> dict[str, Any]:
    """What the lockstep observes of the adapter's pools: the level and each check, run or skipped."""
    return Lockstep.fresh(adapter_factory(adapter), 4, True, 1, True, reference, metrics=True,
                          observe=getattr(adapter, "observe", None)).level()


def run_campaign_phase(adapter: Adapter, opts: Options) -> PhaseResult:
    """Seeded random workloads; stops at the first diverging run."""
    started = time.perf_counter()
    calls = 0
    factory = adapter_factory(adapter)
    misuse = opts.misuse and adapter.supports_misuse
    operations: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    met = FeatureLog()
    index, count = opts.shard
    for run in range(index, opts.runs, count):
        seed = opts.seed + run
        features = FeatureLog()
        one = functools.partial(run_one, factory, seed, opts.steps, misuse=misuse,
                                errors_match=adapter.errors_match, reference=opts.reference,
                                observe=getattr(adapter, "observe", None), blocks=opts.blocks,
                                long_lived=opts.long_lived, keep_log=opts.shrink,
                                share=(run, opts.runs), lacks=opts.lacks)
        try:
            pair = _made(adapter, one, features)
        except Exception as exc:
            made = exc.first + len(exc.record) if isinstance(exc, Divergence) else 0
            met.update(features)
            return PhaseResult("campaign", False, time.perf_counter() - started, calls + made,
                               _shrunk_failure(exc, seed, made), dict(operations), dict(refusals),
                               features=met)
        calls += pair.steps + pair.directed
        met.update(features)
        operations.update(pair.ops_seen)
        refusals.update(pair.refusals_seen)
    return PhaseResult("campaign", True, time.perf_counter() - started, calls, None,
                       dict(sorted(operations.items())), dict(sorted(refusals.items())), features=met)


class NotRepeated(Exception):
    """A run whose answers, given ahead, differed from the model's passed when made again call by
    call: the pool answered the same calls differently (or the first run's check was wrong)."""


def _made(adapter: Adapter, run: Callable[..., Lockstep], features: FeatureLog) -> Lockstep:
    """``run(features=...)``, its pools answering ahead of their process when the adapter can
    (:meth:`~..drive.adapter.DriveAdapter.ahead`); when an answer differed, the run made again,
    each call waiting for its answer, raises the divergence exactly."""
    ahead = getattr(adapter, "ahead", None)
    if not callable(ahead):
        return run(features=features)
    fast = FeatureLog()
    try:
        with ahead():
            pair = run(features=fast)
    except Mispredicted as exc:
        pair = run(features=features)
        raise NotRepeated(f"answered the run's calls otherwise when they were made again one at a "
                          f"time; the first time, {exc}") from exc
    except Divergence as exc:  # the model's own (an echoed run keeps no calls): made again, kept
        if isinstance(exc, CallerBrokeContract):
            raise
        return run(features=features)
    features.update(fast)
    return pair


def run_machine_phase(adapter: Adapter, opts: Options) -> PhaseResult:
    """The state machine under Hypothesis; a failure comes back shrunk.

    With an example database, its saved failures for this machine are replayed
    first, alone: a failure found then is reported as ``replayed``.
    """
    started = time.perf_counter()
    examples = [0]
    base = machine_for(adapter, misuse=opts.misuse, reference=opts.reference, lacks=opts.lacks)

    class Counted(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            examples[0] += 1

    Counted.__name__ = base.__name__
    Counted.FEATURES = met = FeatureLog()
    # The database key: one per implementation, misuse setting and reference, the same on
    # every shard (Hypothesis hashes the class's source, then this).
    Counted._hypothesis_internal_add_digest = (
        f"{adapter.name}|misuse={opts.misuse}|{opts.reference}"
        + (f"|lacks={','.join(sorted(opts.lacks))}" if opts.lacks else "")).encode()
    hypothesis_seed(opts.machine_seed())(Counted)
    wanted = opts.machine_examples()
    if wanted == 0:
        return PhaseResult("machine", True, 0.0, 0)
    database = None if opts.database is None else example_database(opts.database)
    # no "explain" phase: it re-runs the failure many times to annotate arguments
    rounds = [[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]]
    if database is not None:
        rounds = [[Phase.reuse, Phase.shrink], [Phase.explicit, Phase.generate, Phase.shrink]]
    for number, phases in enumerate(rounds):
        config = settings(
            max_examples=wanted, stateful_step_count=opts.machine_steps, deadline=None,
            database=database, report_multiple_bugs=False, print_blob=False, phases=phases,
            suppress_health_check=list(HealthCheck))
        try:
            run_state_machine_as_test(Counted, settings=config)
        except unittest.SkipTest:  # the database held nothing to replay
            continue
        except Exception as exc:
            shrunk = MachineFailure.from_exception(exc)
            return PhaseResult("machine", False, time.perf_counter() - started, examples[0],
                               _failure(exc, shrunk.steps, opts.machine_seed()),
                               replayed=database is not None and number == 0, features=met)
    return PhaseResult("machine", True, time.perf_counter() - started, examples[0], features=met)


__all__ = ["ADAPTER_ATTRS", "MACHINE_SEED_STRIDE", "Failure", "NotRepeated", "Options", "PhaseResult",
           "load_adapter", "observation_level", "process_failure", "run_campaign_phase", "run_machine_phase"]
