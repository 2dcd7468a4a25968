"""The ``refinement`` phase: every call sequence of small pools, kvpool.impl beside the model.

One case per pool configuration of the budget (``refinement_pools``): every
sequence of up to the configuration's depth of calls from a fresh pool,
breadth first, run on kvpool.impl and the model side by side
(:mod:`kvpool.oracle.search.refinement`), compared after every call.  The calls
are the bounded model checker's (:func:`kvpool.proofs.bmc.calls`: every
contract-respecting call over small domains, the owner's writes included),
the queries, and deliberate misuse; states are deduplicated by the model's
state up to renaming blocks, groups and watchers (:func:`kvpool.proofs.bmc.orbit_key`).

The oracle may not import the proofs (they are independent layers); this
module, above both, joins the BMC's domain and symmetry to the oracle's
search.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

from kvpool.shard import Shard

from .budget import Budget
from .phases import Case, Phase, cut_failure, divergence_failure, failure, in_order
from .progress import Progress

if TYPE_CHECKING:
    from kvpool.model.state import PoolState
    from kvpool.oracle.search.refinement import CallDomain, Refinement, Shape


def bmc_domain(shape: Shape, symmetry: bool = True
               ) -> tuple[CallDomain, list[Any], Callable[[PoolState], Hashable]]:
    """The BMC's calls (over the refinement's requests) and its state key.

    With ``symmetry`` the key is the BMC's, up to renaming blocks, groups and
    watchers: sound for a pool that treats them alike, as the model does, and
    about half the states; without, the model's exact variables
    (:func:`kvpool.oracle.search.refinement.exact_key`), so a pool that treats group 1
    or block 2 differently is explored in every state it can be in.
    """
    # lazy: the oracle, the BMC and the pool load when the phase runs
    from kvpool.oracle.search.refinement import exact_key, requests_for
    from kvpool.proofs import bmc

    cfg = bmc.Bounds(blocks=shape.blocks, hash_block_size=shape.hash_block_size,
                     events_on=shape.events)
    requests = requests_for(shape.hash_block_size)

    def calls(s: PoolState) -> Any:
        # the BMC's calls read a request's token ids and pass it on: any request will do
        return bmc.calls(s, cfg, cast(Any, requests))

    key: Callable[[PoolState], Hashable] = bmc.state_key(cfg) if symmetry else exact_key
    return calls, list(requests), key


def refine(factory: Callable[..., Any], shape: Shape, depth: int, seconds: float = 600.0,
           symmetry: bool = True) -> Refinement:
    """Explore ``factory``'s pools of ``shape`` to ``depth`` over the BMC's domain plus misuse."""
    # lazy: the oracle, the BMC and the pool load when the phase runs
    from kvpool.oracle.search.refinement import explore

    calls, requests, key = bmc_domain(shape, symmetry)
    return explore(factory, shape, depth, calls, requests, key=key, seconds=seconds)


def figures(out: Refinement) -> dict[str, Any]:
    """One exploration as the JSON document shows it."""
    s = out.shape
    return {"name": s.name, "blocks": s.blocks, "hash_block_size": s.hash_block_size,
            "caching": s.caching, "events": s.events, "metrics": s.metrics,
            "depth_target": out.depth_target, "depth": out.depth, "complete": out.complete,
            "ok": out.ok, "states": out.states, "sequences": out.transitions,
            "contract_breaches": sum(out.breaches.values()),
            "breaches": dict(sorted(out.breaches.items())),
            "operations": dict(sorted(out.operations.items())),
            "misuse": dict(sorted(out.misuse.items())),
            "refusals": dict(sorted(out.refusals.items())),
            "copies": dict(sorted(out.copies.items())), "seconds": round(out.seconds, 3),
            "cpu_seconds": round(out.cpu_seconds, 3)}


def refinement_failure(out: Refinement) -> dict[str, Any]:
    """A divergence as a Failure: the lockstep's message and pictures, and the whole sequence."""
    # lazy: the oracle, the BMC and the pool load when the phase runs
    from kvpool.oracle.search.refinement import show_call

    exc = out.divergence
    assert exc is not None
    made = divergence_failure(exc)
    calls = [f"{i}. {show_call(c)}" for i, c in enumerate(out.sequence, start=1)]
    head = f"after {len(out.sequence)} call(s) from a fresh pool"
    if not out.reproduced:
        head += " (NOT reproduced by a replay from a fresh pool: the copy of the pool differs)"
    made["details"] = "\n".join([head + ":", *calls, "", made["details"]])
    return made


_Pool = tuple[int, int, bool, bool, int]
_Outcome = tuple[Case, "dict[str, Any] | None", "dict[str, int]", str]


def _one_pool(factory: Callable[..., Any] | None, pool: _Pool, budget: Budget) -> _Outcome:
    """One pool's exploration as its case, its figures, its operations and a progress note (plain
    data, so that a worker process can send it back); ``factory`` None: kvpool's own pool."""
    # lazy: the oracle, the BMC and the pool load when the phase runs
    from kvpool.oracle.search.refinement import Shape

    if factory is None:
        from kvpool.impl import BlockPool  # lazy: kvpool's own pool, only as the default target

        factory = BlockPool
    shape = Shape(*pool[:4])
    depth = pool[4] if budget.refinement_depth is None else budget.refinement_depth
    try:
        out = refine(factory, shape, depth, budget.refinement_seconds, budget.refinement_symmetry)
    except Exception as exc:  # a crash of the search itself
        return (Case(f"refinement/{shape.slug}", f"refinement {shape.name}", False, 0.0,
                     failure("crash", f"{type(exc).__name__}: {exc}")), None, {}, f"{shape.name}: CRASHED")
    fail = (refinement_failure(out) if not out.ok else None if out.complete else
            cut_failure(f"refinement {shape.name}", budget.refinement_seconds, depth, out.depth,
                        "--refinement-seconds"))
    note = (f"{shape.name}: depth {out.depth}/{depth}"
            f"{'' if out.complete or not out.ok else ' (out of time)'}, {out.states:,} "
            f"states, {out.transitions:,} sequences, {out.cpu_seconds:.1f}s CPU"
            + ("" if out.ok else ": DIVERGED"))
    return (Case(f"refinement/{shape.slug}", f"refinement {shape.name}", fail is None, out.seconds, fail),
            figures(out), dict(out.operations), note)


def run_refinement(budget: Budget, progress: Progress, factory: Callable[..., Any] | None = None,
                   name: str = "kvpool.impl:BlockPool", shard: Shard | None = None) -> Phase:
    """kvpool.impl (or ``factory``'s pools) against the model on every call sequence of small
    pools, up to each one's depth.  A shard takes the pools ``j`` with ``j mod N == I - 1``.
    kvpool's own pool is explored in parallel processes, one per core (another factory may not
    cross to a process); the cases keep the budget's order."""
    phase = Phase("refinement")
    shard = shard or Shard()
    mine = [p for j, p in enumerate(budget.refinement_pools) if shard.takes(j)]
    progress.start("refinement", len(mine))
    runs = []
    operations: Counter[str] = Counter()
    start = time.perf_counter()

    workers = min(len(mine), os.cpu_count() or 1) if factory is None else 1
    # the deepest, then the largest pool first: it bounds the wall time
    first = sorted(range(len(mine)), key=lambda j: (-mine[j][4], -mine[j][0], mine[j][1]))
    for case, run, ops, note in in_order(_one_pool, [(factory, pool, budget) for pool in mine], workers,
                                         first):
        phase.cases.append(case)
        if run is not None:
            runs.append(run)
        operations.update(ops)
        progress.advance(note)
    return phase.finish(start, {"implementation": name, "symmetry": budget.refinement_symmetry, "runs": runs,
                                "sequences": sum(r["sequences"] for r in runs),
                                "states": sum(r["states"] for r in runs),
                                "operations": dict(sorted(operations.items()))})


__all__ = ["bmc_domain", "figures", "refine", "refinement_failure", "run_refinement"]
