"""Blocks of two pools in one call: a run's second pool, and a free through the first listing both.

An engine with several pools frees a table through one of them, and vLLM's
``free_blocks`` hands each block back to the pool it came from.
:class:`~kvpool.oracle.core.lockstep.Lockstep` compares one pool with one
model, so the call that mixes two pools is built and checked here; the
workload (``other_pool``, ``misuse``), the state machine and the shrinker's
replay make it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kvpool.model import OPERATIONS, Refusal

from ..core.abstraction import refusal_name
from ..core.lockstep import CallRecord, Lockstep
from .features import call_features
from .runs import RunConfig

SECOND_POOL_BLOCKS = 64
"""The second pool's size at most: blocks of another pool need not be as many as this pool's."""


def second_pool(pool_factory: Callable[..., Any], cfg: RunConfig, reference: str,
                errors_match: Callable[[Exception, Exception | None], bool]) -> Callable[[], Lockstep]:
    """How a run builds its second pool: the same class and shape, with its own model."""
    return functools.partial(Lockstep.fresh, pool_factory, min(cfg.num_blocks, SECOND_POOL_BLOCKS),
                             cfg.caching, cfg.hash_block_size, cfg.events, reference, metrics=cfg.metrics,
                             errors_match=errors_match, which=1)


def free_across(first: Lockstep, second: Lockstep, listed: list[tuple[Lockstep, int]]) -> None:
    """One ``free_blocks`` on the first pool listing blocks of both pools, in ``listed`` order.

    vLLM's ``free_blocks`` hands a block of another pool back to that pool.
    :class:`Lockstep` names blocks by id within one pool, so this call is
    checked here: the first model frees the first pool's ids, the second
    model the second's (each in listed order); a refusal by either model (a
    double free) must be the pool's refusal with neither pool changed.
    Then each pool is compared with its model as after any call (the footprint; the whole
    pool when due).
    """
    free = OPERATIONS["free_blocks"]
    mine, theirs = [b for p, b in listed if p is first], [b for p, b in listed if p is second]
    shape = None if first.features is None else call_features(
        first.model, "free_blocks", (mine,), second=True, metrics=first.metrics is not None)
    footprints = [(pair, free.footprint(pair.model, ids)) for pair, ids in ((first, mine), (second, theirs))]
    noted = [(pair, fp, pair._note(fp)) for pair, fp in footprints]
    m_error: Exception | None = None
    try:  # both guards first: a refusal by either changes neither model
        free.prepare(first.model, (mine,))
        free.prepare(second.model, (theirs,))
    except Refusal as exc:
        m_error = exc
    p_error: Exception | None = None
    try:
        first.pool.free_blocks([p.pool.blocks[b] for p, b in listed])
    except Exception as exc:
        if getattr(exc, "verdict", None) is not None:  # a pool process that failed: its verdict
            raise
        p_error = exc
    if first.log is not None:
        first.log.add_across([(0 if p is first else 1, b) for p, b in listed])
    names = [str(b) if p is first else f"second:{b}" for p, b in listed]
    for pair in (first, second):  # either may be the one found to differ: both traces show the call
        pair.steps += 1
        pair.trace.append(CallRecord("free_blocks", (names,), refusal_name(m_error) if m_error else "None"))
    if (m_error is None) != (p_error is None) or (
            m_error is not None and not first.errors_match(m_error, p_error)):
        raise first._diverged("free_blocks", f"model raised {m_error!r}, pool raised {p_error!r}",
                              ["refusal"])
    if m_error is None:
        free.next(first.model, mine)
        free.next(second.model, theirs)
        if shape is not None and first.features is not None:
            first.features.add(shape)
    for pair, fp, before in noted:  # as after any call: the footprint, the whole pool when due
        if pair.steps - pair.last_full >= (pair.full_every or 1):
            pair.check()
        else:
            pair._check_footprint("free_blocks", fp, before)
