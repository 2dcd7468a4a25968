"""Each conformance phase alone reaches every branch of the model's actions it can.

A branch of the model's operations (their updates ``model/pool.py``, guards
``model/guards.py`` and contracts ``model/contracts.py``) that a phase never
takes is one on which no pool is compared with the model by that phase.  So, measured with
:mod:`kvpool.oracle.search.coverage` (what ``kvpool conform --coverage`` prints):

* without misuse (how vLLM's pool and third-party pools are checked), each
  phase takes every branch but the refusals (branches into ``raise
  Refusal``, which only a wrong call takes) and :data:`UNREACHABLE`;
* with misuse, each phase takes every branch but :data:`UNREACHABLE`;
* neither takes a branch into ``raise ContractBroken`` (the phases keep the
  caller contracts: a broken one ends the run with the caller's verdict, see
  ``tests/test_contracts.py``) nor one of the owner's writes (``write_block``,
  a caller action the pool never sees; the BMC explores both).

Budgets: the campaign at ``kvpool conform``'s defaults (4 runs of 1,000
steps, seed 0: its seeds fix caching, events and block sizes so that any
four runs in a row see them all); the state machine at
:data:`MACHINE_EXAMPLES` examples of 25 steps, seed 0, 20 to 30 s a run
under coverage.  Hypothesis turns rules off at random per example (swarm
testing), so the machine's rarest chains (a partial entry that grows inside
its block, a hash conflict, some refusals) come late: at 800 examples seeds
0-5 reached every branch, misuse on and off; at 600, 9 runs in 10; at the
default 200, without misuse, most seeds.
"""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from types import ModuleType

import pytest

from kvpool.cli import conform
from kvpool.model import ACTIONS, initial_state
from kvpool.oracle.core.adapter import ClassAdapter, kvpool_adapter
from kvpool.oracle.search.conform import Options, run_campaign_phase, run_machine_phase
from kvpool.oracle.search.coverage import Branch, PhaseCoverage, measure, measure_phase

UNREACHABLE = {
    ("if b == NULL and not s.null_counted:", "continue"):
        "free_blocks and touch skip the null block only under vLLM 0.33 (null_counted=False); "
        "the phases run vLLM 0.31 by default: test_vllm_033_reaches_the_null_block_branches",
}
"""Branches no phase takes by design, as (decision, where it goes), with the reason."""

MACHINE_EXAMPLES = 800
"""The state machine's documented budget for these measurements (``--examples``)."""


def _unexpected(measured: PhaseCoverage, misuse: bool) -> list[str]:
    found = [str(b) for b in measured.missed
             if (b.source, b.into) not in UNREACHABLE and (misuse or not b.refusal)
             and not b.contract and not b.caller]
    # what ``--coverage`` lists as gaps are exactly these (the others say why they are missed)
    assert {str(b) for b in measured.gaps} <= set(found)
    return found


def _pool033() -> type:
    """The 0.33 pool of ``tests/test_workload_shapes.py`` (loaded by path: tests are no package)."""
    spec = importlib.util.spec_from_file_location(
        "workload_shapes", Path(__file__).with_name("test_workload_shapes.py"))
    assert spec is not None and spec.loader is not None
    module = ModuleType(spec.name)
    spec.loader.exec_module(module)
    pool: type = module.Pool033
    return pool


@pytest.mark.parametrize("misuse", [False, True], ids=["no-misuse", "misuse"])
def test_the_campaign_alone_reaches_every_branch(misuse: bool) -> None:
    result, measured = measure_phase(run_campaign_phase, kvpool_adapter(), Options(misuse=misuse))
    assert result.ok and measured.phase == "campaign" and measured.misuse is misuse
    assert not _unexpected(measured, misuse), "\n".join(_unexpected(measured, misuse))


@pytest.mark.slow  # 2 x 110 s: the campaign's case runs by default
@pytest.mark.parametrize("misuse", [False, True], ids=["no-misuse", "misuse"])
def test_the_machine_alone_reaches_every_branch(misuse: bool) -> None:
    opts = Options(misuse=misuse, examples=MACHINE_EXAMPLES)
    result, measured = measure_phase(run_machine_phase, kvpool_adapter(), opts)
    assert result.ok and measured.phase == "machine" and measured.misuse is misuse
    assert not _unexpected(measured, misuse), "\n".join(_unexpected(measured, misuse))


@pytest.mark.parametrize("run_phase", [run_campaign_phase, run_machine_phase], ids=["campaign", "machine"])
def test_vllm_033_reaches_the_null_block_branches(run_phase: object) -> None:
    """With ``--reference 0.33`` (and a pool that behaves so) each phase takes what 0.31 cannot."""
    adapter = ClassAdapter(_pool033(), "0.33 pool", supports_misuse=False)
    result, measured = measure_phase(run_phase, adapter, Options(reference="0.33", examples=600))  # type: ignore[arg-type]
    assert result.ok, result.failure
    assert not [b for b in measured.missed if (b.source, b.into) in UNREACHABLE]
    assert not [str(b) for b in measured.missed
                if not (b.refusal or b.contract or b.caller)], measured.missed


def test_a_measurement_is_plain_data() -> None:
    """One call measured: few branches taken, the others named by file, line, text and target."""
    state = initial_state(4, True, 1)
    _, measured = measure(lambda: ACTIONS["get_new_blocks"](state, 1), "one call", False)
    assert 0 < measured.covered < measured.total == measured.covered + len(measured.missed)
    assert 0 < measured.percent < 100
    assert all(isinstance(b, Branch) and b.source for b in measured.missed)
    refusal = next(b for b in measured.missed if b.refusal)
    assert "refused (" in str(refusal)
    assert str(refusal).startswith(f"{refusal.file}:{refusal.line} -> {refusal.to}: ")
    assert {b.file for b in measured.missed} == {"pool.py", "guards.py", "contracts.py"}
    doc = json.loads(json.dumps(measured.to_json()))
    assert doc["phase"] == "one call" and doc["covered"] == measured.covered
    assert {"file", "line", "to", "source", "into", "refusal", "contract", "caller", "lacked", "why"} == set(
        doc["missed"][0])


def test_conform_prints_and_writes_coverage(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "r.json"
    status = conform.main(["--impl", "kvpool.impl:BlockPool", "--coverage", "--json", str(path),
                           "--runs", "1", "--steps", "200", "--examples", "20"], out=out)
    text = out.getvalue()
    assert status == 0, text
    assert text.count("model branches reached: ") == 2 and "refused (" in text
    assert text.count("the pool's own branches reached: ") == 2 and " pool.py" in text
    assert text.count("feature pairs met in one call: ") == 2 and "[needs misuse] " in text
    doc = json.loads(path.read_text())
    assert [c["phase"] for c in doc["coverage"]] == ["campaign", "machine"]
    assert all(c["misuse"] and 0 < c["covered"] <= c["total"] for c in doc["coverage"])
    for c in doc["coverage"]:  # the pool's own source, by file; the legal pairs of features
        assert 0 < c["pool"]["covered"] <= c["pool"]["total"]
        assert any(f.endswith("pool.py") for f, _covered, _total in c["pool"]["files"])
        assert 0 < c["pairs"]["met"] <= c["pairs"]["legal"]
        assert {m["why"] for m in c["missed"]} <= {"needs misuse", "caller contract", "caller action",
                                                    "another --reference", "reachable without misuse"}
    status = conform.main(["--impl", "kvpool.impl:BlockPool", "--json", str(path),
                           "--runs", "1", "--steps", "50", "--examples", "5"], out=io.StringIO())
    assert status == 0 and "coverage" not in json.loads(path.read_text())
