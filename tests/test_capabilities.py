"""Pools that are not all of vLLM's: what a pool declares it lacks is never called, and the rest is.

A pool lacks operations, call features (the names ``--coverage`` prints) and
pool shapes (:data:`~kvpool.oracle.generate.features.SHAPES`), closed over
what each needs.  For any such subset, no call with a lacked operation or
feature is made, and every legal pair of the features the pool has meets in
one call: the directed calls alone (on many subsets), and each phase of
``kvpool conform`` (on a few).  The pools here are kvpool's own, declaring
lacks, and recording the calls made on them; the Rust client's ``--minimal``
mode is in ``tests/test_drive.py``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import conform
from kvpool.impl import BlockPool
from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.generate.capabilities import Capabilities, parse_lacks
from kvpool.oracle.generate.directed import Directed, scenarios
from kvpool.oracle.generate.features import (
    CORE,
    DECLARABLE,
    FEATURES,
    SHAPES,
    FeatureLog,
    closed,
    legal_pairs,
    pair_coverage,
)
from kvpool.oracle.search.conform import Options, run_campaign_phase, run_machine_phase

NAMES = [n for n in DECLARABLE if n != "misuse"]


def lacking(names: frozenset[str], log: list[str] | None = None) -> type[BlockPool]:
    """kvpool's pool declaring ``names`` lacking, each operation call written to ``log``."""
    def recorded(op: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if log is not None:
                log.append(op)
            return getattr(BlockPool, op)(self, *args, **kwargs)
        return call

    attrs: dict[str, Any] = {"kvpool_lacks": tuple(sorted(names))}
    for op in ("get_new_blocks", "free_blocks", "touch", "unpin_blocks", "evict_blocks", "reset_prefix_cache",
               "cache_full_blocks", "cache_partial_block", "move_block_hashes", "emit_cached_block_events",
               "take_events", "_insert_block_hash", "_maybe_evict_cached_block", "get_usage"):
        attrs[op] = recorded(op)
    return type("Lacking", (BlockPool,), attrs)


def test_names_are_checked_and_closed_over_what_they_need() -> None:
    assert set(SHAPES) | set(FEATURES) <= set(DECLARABLE)
    assert not set(CORE) & set(DECLARABLE)
    with pytest.raises(ValueError, match="unknown name"):
        closed({"masks"})
    with pytest.raises(ValueError, match="every pool has these"):
        parse_lacks("get_new_blocks")
    minimal = closed({"several_groups", "big_block", "cache_partial_block", "unpin_blocks", "mask",
                      "_insert_block_hash"})
    assert {"group1", "partial", "promotion", "replace", "watcher", "reuse_fired", "insert",
            "secondary"} <= minimal
    assert closed({"events"}) >= {"take", "emit"} and closed({"watcher"}) >= {"unpin_blocks"}
    assert "secondary" not in closed({"partial"})  # a copied key is a secondary key too
    lines = Capabilities.of({"watcher"}).not_checked()
    assert "unpin_blocks*" in lines[1] and "reuse_fired*" in lines[2] and "declares: watcher" in lines[0]


def test_the_directed_calls_make_every_legal_pair_of_any_subset() -> None:
    """Twelve random subsets (and the empty one): every legal pair among what the pool has meets,
    and no call with anything it lacks is made."""
    rng = random.Random(2)
    for names in [frozenset(), *(frozenset(rng.sample(NAMES, rng.randint(1, 8))) for _ in range(12))]:
        called: list[str] = []
        made = FeatureLog()
        gone = closed(names)
        Directed(lacking(names, called), lacks=gone).cover(legal_pairs(lacks=names), made)
        missed = [p for p in legal_pairs(lacks=names) if p not in made.pairs]
        assert not missed, (sorted(names), missed)
        assert not made.features & gone, (sorted(names), made.features & gone)
        assert not set(called) & gone, (sorted(names), set(called) & gone)
        assert all(op not in gone for op, _s in scenarios(gone))


@pytest.mark.parametrize("names", [
    frozenset({"several_groups", "big_block", "cache_partial_block", "unpin_blocks", "mask",
               "_insert_block_hash"}),  # the Rust client's --minimal
    frozenset({"events", "metrics", "second_pool", "session", "null_block"}),
    frozenset({"mm", "lora", "salt", "move_block_hashes", "evict_blocks", "listed_twice"}),
], ids=["minimal", "no-events", "no-extras"])
def test_each_phase_keeps_to_what_the_pool_has(names: frozenset[str]) -> None:
    """Both phases of ``kvpool conform``: the pool agrees, every legal pair among its features
    meets, none of what it lacks is made or called."""
    gone = closed(names)
    for phase, opts in ((run_campaign_phase, Options(lacks=names)),
                        (run_machine_phase, Options(lacks=names, examples=120))):
        called: list[str] = []
        result = phase(kvpool_adapter(lacking(names, called)), opts)
        assert result.ok and result.features is not None, result.failure
        met = pair_coverage(result.features, result.name, True, lacks=names)
        if phase is run_campaign_phase:  # the machine's share of pairs rests on its examples
            assert not met.missed, met.missed
        assert not result.features.features & gone and not set(called) & gone


def test_a_python_pool_declares_what_it_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A class attribute ``kvpool_lacks`` (and ``--lacks``): the class need not have the operations it
    lacks; the first lines say what is not checked."""
    (tmp_path / "partial_pool.py").write_text(
        "from kvpool.impl import BlockPool\n\n"
        "class NoReaders(BlockPool):\n"
        "    kvpool_lacks = ('unpin_blocks',)\n"
        "    unpin_blocks = None  # not an operation of this pool\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = conform.main(["--impl", "partial_pool:NoReaders", "--lacks", "mask", "--runs", "1",
                         "--steps", "200", "--examples", "20"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "operations never called: unpin_blocks" in text and "features never made: mask" in text
    assert "reuse_fired*" in text  # implied
    bad = conform.main(["--impl", "kvpool.impl:BlockPool", "--lacks", "masks"])
    assert bad == 2 and "unknown name(s) 'masks' (did you mean mask?)" in capsys.readouterr().err


def test_coverage_says_which_missed_branches_the_pool_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The branches of a lacked operation are missed because no call of it is made, not gaps; a
    function it shares with another operation is not counted as lacked."""
    monkeypatch.chdir(tmp_path)
    code = conform.main(["--impl", "kvpool.impl:BlockPool", "--lacks", "unpin_blocks", "--phase", "campaign",
                         "--runs", "1", "--steps", "200", "--coverage"])
    text = capsys.readouterr().out
    assert code == 0, text
    lacked = [line for line in text.splitlines() if line.startswith("    [the pool lacks it]")]
    assert lacked and any('"unpin"' in line for line in lacked), text
    assert not any('"unpin"' in line for line in text.splitlines() if "[reachable without misuse]" in line)
    assert re.search(r"\d+ of them reachable without misuse, \d+ in operations the pool lacks:", text), text
    whole = conform.main(["--impl", "kvpool.impl:BlockPool", "--phase", "campaign", "--runs", "1",
                          "--steps", "200", "--coverage"])
    assert whole == 0 and "the pool lacks it" not in capsys.readouterr().out
