"""The oracle on a pool that shares nothing with kvpool: black-box observation is enough.

``tests/third_party/mypool.py`` is another author's pool, written against
vLLM's API with its own internals (an ordered-dict free queue, a dict-of-dicts
index, its own event classes).  ``kvpool conform --impl mypool:BlockPool``,
run from that folder as its author would, must agree with the model, say that
it observed the pool as a black box, and catch each planted bug.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

THIRD_PARTY = Path(__file__).parent / "third_party"
BUDGET = ["--runs", "8", "--steps", "2000", "--examples", "300", "--machine-steps", "25"]


def conform(spec: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``kvpool conform --impl spec`` from the pool's own folder (found in the current directory)."""
    return subprocess.run([sys.executable, "-P", "-m", "kvpool", "conform", "--impl", spec, *BUDGET, *extra],
                          cwd=THIRD_PARTY, capture_output=True, text=True, check=False, timeout=1800)


def test_an_independent_pool_conforms_observed_as_a_black_box() -> None:
    done = conform("mypool:BlockPool")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "observed black-box" in done.stdout
    assert "misuse off: mypool:BlockPool does not refuse misuse" in done.stdout
    assert "agrees with the model" in done.stdout


@pytest.mark.parametrize("bug", ["QueuesPerListing", "CachedFreedToHead", "TouchLeavesQueued",
                                 "ForgetsLazyEviction", "StoredWithoutLoraId",
                                 "EvictKeepsSecondaryKeys"])
def test_each_planted_bug_is_caught(bug: str) -> None:
    done = conform(f"mypool_bugs:{bug}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGES from the model" in done.stdout
    assert " | pool " in done.stdout  # the difference names both sides


def test_traceback_shows_where_the_pool_raised(tmp_path: Path) -> None:
    (tmp_path / "crashing.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(THIRD_PARTY)!r})\n"
        "from mypool import BlockPool as _Pool\n\n"
        "class Crashing(_Pool):\n"
        "    def touch(self, blocks):\n"
        "        if len(blocks) > 1:\n"
        "            raise KeyError('deep inside the pool')\n"
        "        return super().touch(blocks)\n")
    argv = [sys.executable, "-P", "-m", "kvpool", "conform", "--impl", "crashing:Crashing", *BUDGET]
    plain = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert plain.returncode == 1 and "the pool raised KeyError; --traceback shows where" in plain.stdout
    shown = subprocess.run([*argv, "--traceback"], cwd=tmp_path, capture_output=True, text=True,
                           check=False)
    assert "the pool's own exception:" in shown.stdout and "crashing.py" in shown.stdout
    assert "KeyError: 'deep inside the pool'" in shown.stdout
