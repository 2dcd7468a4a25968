"""docs/operations.md and oracle/DRIVE_PROTOCOL.md say what the code does.

The operations page's refusal tables and its table of versions are made from
the model (``kvpool.operations_page``): the page must hold exactly what the
model makes today, and a guard changed without the page is caught.  The
protocol page's limits are the code's; the integers kvpool writes fit a
JavaScript number, as the page promises.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool import operations_page
from kvpool.cli.conform import _parser
from kvpool.model import OPERATIONS
from kvpool.model.guards import check_count
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.oracle.core.lockstep import BLOCKS_PER_CALL
from kvpool.oracle.drive.adapter import PROCESSES
from kvpool.oracle.drive.process import BATCH, GRACE, HIGH_WATER, STDERR_LINES

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "operations.md"
PROTOCOL = ROOT / "oracle" / "DRIVE_PROTOCOL.md"
MISBEHAVING = Path(__file__).parent / "drive_misbehaving.py"


def test_the_pages_tables_are_the_models() -> None:
    page = PAGE.read_text()
    made, missing = operations_page.rewrite(page)
    assert not missing, f"docs/operations.md has no place for {missing}"
    assert made == page, "docs/operations.md differs from the model: python -m kvpool.operations_page --write"
    assert operations_page.main([str(PAGE)]) == 0


def _reordered_get_new_blocks(s: Any, num_blocks: int) -> None:
    """get_new_blocks's checks the other way round."""
    if num_blocks > len(s.free):
        raise Refusal(RefusalKind.NOT_ENOUGH_FREE_BLOCKS, f"Cannot get {num_blocks} free blocks")
    check_count("num_blocks", num_blocks)


def _looping_guard(s: Any, num_blocks: int) -> None:
    while num_blocks:
        num_blocks -= 1


def test_a_guard_changed_without_the_page_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rows, _where = operations_page.rows("get_new_blocks")
    assert [r.outcome for r in rows] == ["InvalidArgumentError", "NotEnoughFreeBlocksError"]
    changed = dataclasses.replace(OPERATIONS["get_new_blocks"], guard=_reordered_get_new_blocks)
    monkeypatch.setitem(OPERATIONS, "get_new_blocks", changed)
    rows, _where = operations_page.rows("get_new_blocks")
    assert [r.outcome for r in rows] == ["NotEnoughFreeBlocksError", "InvalidArgumentError"]
    copy = tmp_path / "operations.md"
    copy.write_text(PAGE.read_text())
    assert operations_page.main([str(copy)]) == 1
    assert operations_page.main([str(copy), "--write"]) == 0 and operations_page.main([str(copy)]) == 0
    monkeypatch.setitem(OPERATIONS, "get_new_blocks",
                        dataclasses.replace(changed, guard=_looping_guard))
    with pytest.raises(ValueError, match="does not know"):  # never a silent gap in the page
        operations_page.rows("get_new_blocks")


def test_the_tables_say_the_guards_conditions() -> None:
    rows, where = operations_page.rows("cache_full_blocks")
    outcomes = [r.outcome for r in rows]
    assert outcomes.index(operations_page.NOOP) < outcomes.index("CachingDisabledError")
    assert "num_cached_blocks >= num_full_blocks" in rows[outcomes.index(operations_page.NOOP)].when
    assert "needed" in where and where["MAX_GROUP_ID"] == "`4294967295`"
    free, where = operations_page.rows("free_blocks")
    assert [r.outcome for r in free] == ["UnknownBlockError", "BlockNotInUseError"]
    assert "b != NULL" in free[1].when and "listed" in where
    assert operations_page.rows("reset_prefix_cache") == ([], {})
    assert '`"0.33"`' in operations_page.references()


def test_the_protocol_pages_limits_are_the_codes() -> None:
    text = " ".join(PROTOCOL.read_text().split())
    assert f"exits with status 0, within {GRACE:g} s" in text
    assert f"keeps its last {STDERR_LINES} lines" in text
    timeout = _parser().parse_args(["--exec", "x"]).timeout
    assert f"within `--timeout` seconds (default {timeout:g})" in text
    assert f"batches of up to {BATCH // 1024} KiB" in text and f"up to {HIGH_WATER >> 20} MiB" in text
    assert f"kvpool runs at most {('one', 'two', 'three')[PROCESSES - 1]}" in text
    assert f"every `num_blocks / {BLOCKS_PER_CALL}` calls" in text


def _integers(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _integers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _integers(v)]
    return []


def test_every_integer_kvpool_sends_fits_a_javascript_number(tmp_path: Path) -> None:
    """Both phases, misuse on: every integer written lies in [-2^31, 2^32] (the page's promise)."""
    record = tmp_path / "input.jsonl"
    command = shlex.join([sys.executable, str(MISBEHAVING), "well", "--record", str(record)])
    done = subprocess.run([sys.executable, "-P", "-m", "kvpool", "conform", "--exec", command, "--runs", "1",
                           "--steps", "300", "--examples", "40"], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "misuse on" in done.stdout
    numbers = [n for line in record.read_text().splitlines() for n in _integers(json.loads(line))]
    assert len(numbers) > 1000
    assert all(-2**31 <= n <= 2**32 for n in numbers), [n for n in numbers if not -2**31 <= n <= 2**32][:5]
    assert min(numbers) < 0  # misuse reached the pipe: the bounds are tested, not assumed
    assert not re.search(r'"block_hash":\s*\d', record.read_text())  # hashes travel as hex
