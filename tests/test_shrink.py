"""A campaign divergence is shrunk: delta debugging over the run's calls on fresh pools.

The planted bug (the seeded ``PartialKeptAfterPromotion``: a promotion to a
full block keeps the block's partial keys) diverges after about a hundred
calls of seed 0's campaign run; the report gives a handful.
"""

from __future__ import annotations

import io

from kvpool.bugs.pools import PartialKeptAfterPromotion
from kvpool.cli import conform
from kvpool.impl import BlockPool
from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.core.lockstep import Divergence, Lockstep
from kvpool.oracle.search.campaign import run_one
from kvpool.oracle.search.conform import Options, run_campaign_phase
from kvpool.oracle.search.shrink import CallLog, ddmin, replay, shrink_log


def test_ddmin_finds_the_smallest_failing_subset() -> None:
    calls = [{"op": "x", "n": n} for n in range(40)]

    def differs(kept: list[dict[str, object]]) -> list[dict[str, object]] | None:
        return kept if {3, 17, 31} <= {c["n"] for c in kept} else None

    assert [c["n"] for c in ddmin(calls, differs)] == [3, 17, 31]


def _failing_log() -> tuple[Divergence, CallLog]:
    adapter = kvpool_adapter(PartialKeptAfterPromotion)
    try:
        run_one(adapter.factory(), 0, 1000, keep_log=True)
    except Divergence as exc:
        assert isinstance(exc.log, CallLog)
        return exc, exc.log
    raise AssertionError("the planted bug went unseen")


def test_the_shrunk_calls_still_diverge_the_same_way_and_are_fine_on_a_correct_pool() -> None:
    exc, log = _failing_log()
    shrunk = shrink_log(log)
    assert shrunk.divergence is not None and shrunk.before == len(log.entries) > 50
    assert 1 <= shrunk.after == len(shrunk.lines) <= 10 < shrunk.before
    assert set(shrunk.divergence.parts) == set(exc.parts) or shrunk.divergence.parts
    assert all("…" in line or "b'" not in line for line in shrunk.lines)  # short hashes only
    # the same calls on kvpool's own pool: no divergence (the witness is the bug's, not the calls')
    shape = log.fresh()
    m = shape.model

    def correct() -> Lockstep:
        return Lockstep.fresh(kvpool_adapter(BlockPool).factory(), m.num_blocks, m.caching,
                              m.hash_block_size, m.events_on, metrics=shape.metrics is not None)

    assert replay(CallLog(correct, None, True, log.entries), shrunk_entries(log)).divergence is None


def shrunk_entries(log: CallLog) -> list[dict[str, object]]:
    """The calls a shrink keeps, as entries of the log (replayed by :func:`replay`)."""
    kept: list[list[dict[str, object]]] = []
    shrink_log(log, on_kept=kept.append)
    return kept[-1]


def test_the_campaign_phase_reports_the_shrunk_trace_with_both_lengths() -> None:
    result = run_campaign_phase(kvpool_adapter(PartialKeptAfterPromotion), Options(runs=1))
    failure = result.failure
    assert failure is not None and failure.shrunk_from is not None
    assert result.executed == failure.shrunk_from > len(failure.trace) > 0
    out = io.StringIO()
    status = conform.main(["--impl", "kvpool.bugs.pools:PartialKeptAfterPromotion", "--runs", "1",
                           "--examples", "1"], out=out)
    text = out.getvalue()
    assert status == 1
    assert f"{failure.shrunk_from:,} workload calls, shrunk to {len(failure.trace)}" in text, text
    assert "campaign: DIVERGED (divergence), 0 calls" not in text
    assert "request r" in text and "lockstep says (on the shrunk calls):" in text


def test_no_shrink_keeps_the_run_as_it_was() -> None:
    result = run_campaign_phase(kvpool_adapter(PartialKeptAfterPromotion), Options(runs=1, shrink=False))
    assert result.failure is not None and result.failure.shrunk_from is None
    assert result.executed > 0
