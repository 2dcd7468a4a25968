"""A short soak in the suite: the long one is benchmarks/soak.py (10M operations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvpool.impl import BlockPool
from kvpool.oracle.core.observe import pool_invariant_errors

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def test_short_soak_keeps_every_invariant() -> None:
    done = subprocess.run([sys.executable, str(SOAK), "--ops", "100000", "--blocks", "256",
                           "--check-every", "2000", "--report-every", "50000"],
                          capture_output=True, text=True, timeout=1800, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "invariant checks passed" in done.stdout


def test_pool_invariant_errors_sees_a_corrupted_pool() -> None:
    pool = BlockPool(6, True, 4)
    assert pool_invariant_errors(pool) == []
    pool.get_new_blocks(2)[0].ref_cnt = 0  # idle but not queued: a lost block
    assert pool_invariant_errors(pool)
