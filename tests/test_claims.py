"""The claims table (kvpool claims): one row per property of the model, columns per method."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvpool.claims import claims_table, format_table
from kvpool.model import INVARIANTS, LEMMAS
from kvpool.model.properties import STEP_PROPERTIES


def passing_doc() -> dict[str, Any]:
    """The passing verify result of tests/fixtures_report.py (loaded by path: tests are no package)."""
    spec = importlib.util.spec_from_file_location(
        "fixtures_report", Path(__file__).with_name("fixtures_report.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc: dict[str, Any] = module.passing_document()
    return doc


def test_every_property_has_a_row_with_every_method() -> None:
    rows = claims_table()
    assert [r["property"] for r in rows] == [*INVARIANTS, *LEMMAS, *STEP_PROPERTIES]
    for row in rows:
        assert row["doc"] and row["z3"] and row["bmc"] and row["lockstep"], row
        assert row["bugs"] is None  # only a verify result says which bugs were caught
    by_name = {r["property"]: r for r in rows}
    assert by_name["usage_in_unit_interval"]["z3"].startswith("not encoded")
    assert by_name["queue_follows_eviction_policy"]["z3"].startswith("the eviction-order proof")
    assert by_name["event_announcements_match_index"]["z3"].startswith("every step it speaks of")
    assert by_name["fired_watchers_were_registered"]["z3"].startswith("not stated")
    assert by_name["writable_blocks_are_unindexed"]["z3"].startswith("follows from index_matches")


def test_every_bounded_claim_says_what_carries_it_past_the_bound_or_that_nothing_does() -> None:
    rows = {r["property"]: r for r in claims_table()}
    for name, row in rows.items():
        assert row["beyond"].startswith(("the inductive proof", "the per-step proof", "the order proof",
                                         "z3 from its premises", "nothing", "by construction")), name
    assert rows["usage_in_unit_interval"]["beyond"].startswith("nothing")
    assert rows["fired_watchers_were_registered"]["beyond"].startswith("nothing")
    assert "without 'once'" not in rows["free_queue_holds_exactly_idle_blocks"]["beyond"]  # completed
    assert "which nothing carries" in rows["index_matches_block_hashes"]["beyond"]
    assert "per-block split" in rows["evicted_blocks_leave_the_index"]["beyond"]
    assert all("cutoff: unproven" in r["beyond"] for r in rows.values() if r["beyond"].startswith("the "))
    text = format_table(list(rows.values()))
    assert "small-model (cutoff) argument: unproven" in text and "symmetry: " in text


def test_a_verify_result_fills_in_what_the_run_established() -> None:
    doc = passing_doc()
    rows = {r["property"]: r for r in claims_table(doc)}
    inv = rows["null_block_inert"]
    assert inv["z3"].startswith("proven:") and "any pool size" in inv["z3"]
    assert "depth" in inv["bmc"] and "blocks" in inv["bmc"]
    assert "calls" in inv["lockstep"]
    refuting = {b["name"] for b in next(p for p in doc["phases"] if p["name"] == "seeded-bugs")["bugs"]
                if "null_block_inert" in b["refuted_by"]}
    assert set(inv["bugs"]) == refuting
    assert "NONE" not in format_table([inv]) or not refuting


def test_the_command_prints_and_writes_json(tmp_path: Path) -> None:
    source = tmp_path / "verify.json"
    source.write_text(json.dumps(passing_doc()))
    out = tmp_path / "claims.json"
    done = subprocess.run([sys.executable, "-P", "-m", "kvpool", "claims", "--from", str(source),
                           "--json", str(out)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "free_queue_holds_exactly_idle_blocks  [invariant]" in done.stdout
    assert len(json.loads(out.read_text())["claims"]) == len(INVARIANTS) + len(LEMMAS) + len(STEP_PROPERTIES)
    bad = subprocess.run([sys.executable, "-P", "-m", "kvpool", "claims", "--from", str(out)],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "not a kvpool verify result" in bad.stderr


def test_the_report_shows_the_claims() -> None:
    from kvpool.report import render_html, render_markdown

    doc = passing_doc()
    doc["claims"] = claims_table(doc)
    md, page = render_markdown(doc), render_html(doc)
    assert "## Claims: what establishes each property" in md
    for row in doc["claims"]:
        assert row["property"] in md and row["property"] in page


def test_the_claims_say_exactly_what_holds() -> None:
    """No "every reachable state" where a depth bounds it, no "by construction" for the head of
    the queue, no "any pool size" for an invariant whose unchecked conjunct z3 drops (issue 23)."""
    from kvpool.proofs.invariants import PARTIAL

    for doc in (None, passing_doc()):
        rows = {r["property"]: r for r in claims_table(doc)}
        assert not any("every reachable state" in r["bmc"] for r in rows.values())
        assert all("within the depth" in r["bmc"] or "within the profile's depths" in r["bmc"]
                   for r in rows.values())
        head = rows["allocation_takes_queue_head"]["z3"]
        assert "by construction" not in head and "model's queue" not in head
        assert "queue step" in head and "any pool size" in head
        for name in set(PARTIAL) - {"free_queue_holds_exactly_idle_blocks"}:
            assert "without one conjunct" in rows[name]["z3"], rows[name]["z3"]
        assert "without one conjunct" not in rows["free_queue_holds_exactly_idle_blocks"]["z3"]
