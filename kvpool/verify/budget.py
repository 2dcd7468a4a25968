"""How much ``kvpool verify`` explores: the budget of each phase, and the named profiles."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "kvpool.verify/1"
PHASES = ("proofs", "agreement", "seeded-bugs", "bmc", "lockstep", "refinement", "conformance", "traces")


@dataclass(frozen=True)
class Budget:
    """How much each phase explores; a profile is a named budget."""

    bmc_depth: int = 2
    bmc_seconds: float = 600.0
    """Time per BMC run, a safety net: a run it cuts fails ("not verified to depth N").  The
    verdict is the depth; the budgets are wall clock, so each is set far above what a loaded
    2-core machine needs (docs/verification.md#profiles)."""
    bmc_pools: tuple[tuple[int, ...], ...] = ((4, 1), (4, 2), (3, 2, 3))
    """BMC runs as (blocks including the null block, hash_block_size[, depth]): a pool without its
    own depth goes to ``bmc_depth``; ``--bmc-depth`` sets every pool's.  A smaller pool one call
    deeper catches what needs three calls (a wrong order of two freed cached blocks) at a tenth
    of the cost of the larger pool at that depth."""
    bmc_split_depth: int = 2
    """A sharded BMC explores every level up to this depth (at most ``bmc_depth - 1``) on every
    shard, then each shard its part of that level's states."""
    bmc_references: tuple[tuple[int, int, int, str], ...] = ((3, 2, 2, "0.33"),)
    """Pools the BMC also explores with another vLLM version's settings (blocks, hash_block_size,
    depth, version: :data:`kvpool.model.state.REFERENCES`); the z3 encoding knows 0.31's only."""
    agreement_depth: int = 2
    """The encoding against the model: every state the BMC keeps to this depth, every call above it."""
    agreement_pools: tuple[tuple[int, ...], ...] = ((4, 1), (4, 2), (3, 2, 3))
    """As ``bmc_pools``: (blocks, hash_block_size[, depth]), ``agreement_depth`` by default."""
    agreement_events_off: tuple[tuple[int, int, int], ...] = ((3, 2, 2),)
    """Pools the agreement also checks with events off (blocks, hash_block_size, depth): the z3
    steps then leave the announcements alone, and the model must too."""
    agreement_perturb: int = 4
    """One in this many perturbations of each state is checked (rotating); 1: all of them."""
    agreement_seconds: float = 900.0
    """Time per pool of the agreement phase, a safety net as ``bmc_seconds`` (a cut pool fails)."""
    agreement_samples: int = 12
    """(state, step) and (state, invariant) pairs on which the compiled terms are checked against z3."""
    refinement_pools: tuple[tuple[int, int, bool, bool, int], ...] = (
        (4, 2, True, True, 2), (4, 1, True, True, 2), (4, 1, False, True, 2), (4, 2, True, False, 1))
    """Refinement runs as (blocks, hash_block_size, caching, events, depth).  It compares the pool
    with the model, not the specification with itself: ci keeps depth 2 (3 blocks at depth 3 costs
    43 s of CPU against 9 s), dev explores depth 3."""
    refinement_depth: int | None = None
    """A depth for every refinement run instead of each one's own (``--refinement-depth``)."""
    refinement_seconds: float = 900.0
    """Time per refinement run, a safety net as ``bmc_seconds``: a run out of time reports the
    depth it completed, and fails."""
    refinement_symmetry: bool = True
    """Deduplicate refinement states up to renaming blocks, groups and watchers (the BMC's key);
    off: by the model's exact state, for pools that may treat some block or group apart."""
    steps: int = 2000
    runs: int = 4
    examples: int = 50
    machine_steps: int = 25
    seed: int = 0
    timeout_ms: int = 30_000
    skip: tuple[str, ...] = ()
    """Phases the profile leaves out (``pool``: everything but the pool under test)."""


def pool_depths(pools: tuple[tuple[int, ...], ...], depth: int) -> list[tuple[int, int, int]]:
    """Each pool as (blocks, hash_block_size, depth): its own depth, or ``depth``."""
    return [(p[0], p[1], p[2] if len(p) > 2 else depth) for p in pools]


def deepest(pools: tuple[tuple[int, ...], ...], depth: int) -> int:
    """The largest depth any of ``pools`` is explored to."""
    return max((d for _b, _h, d in pool_depths(pools, depth)), default=depth)


PROFILES: dict[str, Budget] = {
    "ci": Budget(),
    "dev": Budget(bmc_depth=3, bmc_seconds=1800.0, bmc_pools=((4, 1), (4, 2)), agreement_depth=3,
                  agreement_pools=((4, 1), (4, 2)), agreement_perturb=8,
                  agreement_seconds=3600.0, agreement_samples=96, steps=10_000, runs=8, examples=200,
                  refinement_pools=((4, 2, True, True, 3), (4, 1, True, True, 2), (4, 1, False, True, 3),
                                    (4, 2, True, False, 2)),
                  refinement_seconds=3600.0),
    "deep": Budget(bmc_depth=4, bmc_seconds=3600.0, bmc_pools=((4, 1), (4, 2), (5, 1), (3, 1)),
                   agreement_depth=3, agreement_perturb=1, agreement_seconds=3600.0,
                   agreement_samples=400,
                   steps=50_000, runs=16, examples=1000, machine_steps=50,
                   refinement_pools=((4, 1, True, True, 3), (4, 2, True, True, 3), (4, 1, False, True, 4),
                                     (4, 1, True, False, 3), (4, 2, True, False, 3)),
                   refinement_seconds=7200.0, refinement_symmetry=False),
    "pool": Budget(steps=5000, runs=8, examples=200,
                   skip=("proofs", "agreement", "seeded-bugs", "bmc", "lockstep", "refinement")),
}
"""ci: about four minutes on 2 cores (docs/verification.md measures each phase; its time budgets
are safety nets that hold on a loaded machine too); dev: depth 3 on 4-block pools; deep: an
hour-scale campaign (on one runner its 5-block BMC is cut before depth 4, and fails: shard it,
docs/scale.md);
pool: only the pool under test (``--impl``/``--adapter``) and the traces given, for its author."""


__all__ = ["PHASES", "PROFILES", "SCHEMA", "Budget", "deepest", "pool_depths"]
