"""Shards (``--shard I/N``) and ``kvpool merge``: N shards merged are one run of the same budget."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import conform as conform_cli
from kvpool.cli import merge as merge_cli
from kvpool.cli import verify as verify_cli
from kvpool.proofs import bmc
from kvpool.verify import Shard, ShardError
from kvpool.verify.merge import MergeError, interleave, merge

SMALL = ["--skip", "seeded-bugs", "--skip", "agreement", "--runs", "3", "--steps", "300",
         "--refinement-depth", "1", "--impl", "kvpool.impl:BlockPool", "--examples", "10",
         "--machine-steps", "5", "--plain"]
"""A budget small enough to run whole and in shards in a test: every split phase and a whole one."""


def run_verify(tmp: Path, name: str, *args: str) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    verify_cli.main([*SMALL, *args, "--json", str(out)], out=io.StringIO())
    return dict(json.loads(out.read_text()))


def totals(doc: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on sharding: verdicts, case ids and every count."""
    out: dict[str, Any] = {"ok": doc["ok"], "exit_code": doc["exit_code"]}
    for p in doc["phases"]:
        row: dict[str, Any] = {"skipped": p["skipped"], "cases": [(c["id"], c["ok"]) for c in p["cases"]]}
        if p["skipped"]:
            pass
        elif p["name"] == "bmc":
            row["runs"] = [(r["depth"], r["states"], r["transitions"], r["complete"]) for r in p["runs"]]
        elif p["name"] == "lockstep":
            row.update({k: p[k] for k in ("runs", "calls", "operations", "errors", "configs")})
        elif p["name"] == "refinement":
            row["runs"] = [(r["name"], r["states"], r["sequences"], r["depth"]) for r in p["runs"]]
            row["totals"] = (p["states"], p["sequences"], p["operations"])
        elif p["name"] == "conformance":
            row["campaign"] = [(t["phases"][0]["executed"], t["operations"], t["refusals"])
                               for t in p["targets"]]
        elif p["name"] == "proofs":
            row["matrix"] = p["matrix"].keys()
        out[p["name"]] = row
    return out


@pytest.mark.parametrize("count", [2, 3])
def test_merged_shards_have_the_verdict_and_totals_of_one_run(count: int, tmp_path: Path) -> None:
    whole = run_verify(tmp_path, "whole")
    shards = [run_verify(tmp_path, f"s{i}", "--shard", f"{i}/{count}") for i in range(1, count + 1)]
    assert [d["shard"] for d in shards] == [[i, count] for i in range(1, count + 1)]
    # each shard did only its part: no shard alone has the run's totals
    for d in shards:
        lock = next(p for p in d["phases"] if p["name"] == "lockstep")
        assert lock["runs"] < 3
    assert sum(next(p for p in d["phases"] if p["name"] == "proofs")["skipped"] for d in shards) == count - 1
    files = [str(tmp_path / f"s{i}.json") for i in range(count, 0, -1)]  # any order
    code = merge_cli.main([*files, "--json", str(tmp_path / "m.json"), "--junit", str(tmp_path / "m.xml"),
                           "--report", str(tmp_path / "report")], out=io.StringIO())
    merged = json.loads((tmp_path / "m.json").read_text())
    assert code == whole["exit_code"] == 0
    assert totals(merged) == totals(whole)
    assert merged["shard"] is None and [m["shard"] for m in merged["merged"]] == [[i, count]
                                                                                 for i in range(1, count + 1)]
    assert merged["claims"] == whole["claims"]
    suites = ET.parse(tmp_path / "m.xml").getroot()
    assert int(suites.get("tests", "0")) == sum(len(p["cases"]) for p in whole["phases"])
    assert (tmp_path / "report" / "report.html").stat().st_size > 0


@pytest.mark.parametrize("count", [2, 3])
def test_bmc_parts_count_each_state_once(count: int) -> None:
    for hbs in (1, 2):
        cfg = bmc.Bounds(blocks=4, hash_block_size=hbs)
        whole = bmc.explore(cfg, 2, 3600)  # a safety net: the verdict is the depth, not the load
        parts = [bmc.explore(cfg, 2, 3600, part=(i, count)) for i in range(count)]
        assert whole.complete
        assert all(p.part is not None and p.ok and p.complete for p in parts)
        # the parts overlap beyond the split (a plain sum would count states twice) ...
        assert sum(p.states for p in parts) > whole.states
        # ... and every state at the split is some part's, once
        assert sum(p.part.owned for p in parts if p.part) == parts[0].part.frontier  # type: ignore[union-attr]
        assert bmc.merge_parts([p.part for p in parts if p.part]) == (whole.states, whole.transitions)


def test_a_bug_one_shard_finds_fails_the_merged_run(tmp_path: Path) -> None:
    args = ["--skip", "proofs", "--skip", "agreement", "--skip", "seeded-bugs", "--skip", "bmc",
            "--skip", "lockstep", "--skip", "refinement", "--impl", "kvpool.bugs.pools:FreeHashedToHead",
            "--runs", "2", "--steps", "400", "--examples", "20", "--plain"]
    codes = []
    for i in (1, 2):
        codes.append(verify_cli.main([*args, "--shard", f"{i}/2", "--json", str(tmp_path / f"{i}.json")],
                                     out=io.StringIO()))
    assert codes == [1, 1]
    merged = merge([json.loads((tmp_path / f"{i}.json").read_text()) for i in (1, 2)])
    (case,) = next(p for p in merged["phases"] if p["name"] == "conformance")["cases"]
    assert merged["exit_code"] == 1 and not case["ok"] and case["failure"]["kind"] == "divergence"


def test_seeded_bugs_split_by_bug_and_merge_in_catalogue_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split and the merge of the seeded-bugs phase, with each check replaced by a quick one."""
    from types import SimpleNamespace

    import kvpool.bugs.check
    from kvpool.bugs import BUGS, forms
    from kvpool.verify import PROFILES, run_seeded_bugs
    from kvpool.verify.merge import _merge_phase
    from kvpool.verify.progress import Progress

    def quick(name: str, **_: Any) -> Any:
        for i, _form in enumerate(forms(BUGS[name])):
            yield SimpleNamespace(by=[f"{name}-{i}"], method=("bmc", "lockstep")[i % 2], seconds=0.0,
                                  detail="")

    monkeypatch.setattr(kvpool.bugs.check, "every_check", quick)
    progress = Progress(io.StringIO())
    whole = run_seeded_bugs(PROFILES["ci"], progress, workers=1).as_json()  # the patch is in-process
    for count in (2, 3, 7):
        parts = [run_seeded_bugs(PROFILES["ci"], progress, Shard(i, count), workers=1).as_json()
                 for i in range(1, count + 1)]
        assert sorted(b["name"] for p in parts for b in p["bugs"]) == sorted(b["name"] for b in whole["bugs"])
        merged = _merge_phase("seeded-bugs", parts)
        assert merged["bugs"] == whole["bugs"]
        assert [c["id"] for c in merged["cases"]] == [c["id"] for c in whole["cases"]]
        # no dead weight is decided over the whole catalogue: by the whole run, by the merge, by no shard
        assert whole["cases"][-1]["id"] == merged["cases"][-1]["id"] == "seeded-bugs/no-dead-weight"
        assert not any(c["id"] == "seeded-bugs/no-dead-weight" for p in parts for c in p["cases"])
        assert whole["cases"][-1]["ok"] is merged["cases"][-1]["ok"] is False  # "bug-0" is no property


def test_no_dead_weight_holds_in_sharded_runs_as_in_whole_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each property refuting some bug is a verdict on the catalogue: a shard holding the only bug a
    property refutes makes the merged run pass, and no bug refuting it makes it fail."""
    from types import SimpleNamespace

    import kvpool.bugs.check
    from kvpool.bugs import BUGS, forms
    from kvpool.model import INVARIANTS
    from kvpool.model.properties import STEP_PROPERTIES
    from kvpool.verify import PROFILES, run_seeded_bugs
    from kvpool.verify.merge import _merge_phase
    from kvpool.verify.progress import Progress

    names = [*INVARIANTS, *STEP_PROPERTIES]

    def refuting(spared: str) -> Any:
        def quick(name: str, **_: Any) -> Any:
            i = list(BUGS).index(name)
            for _form in forms(BUGS[name]):  # bug i refutes property i (round the list)
                prop = names[i % len(names)]
                yield SimpleNamespace(by=[] if prop == spared else [prop], method="bmc", seconds=0.0,
                                      detail="")
        return quick

    progress = Progress(io.StringIO())
    for spared, ok in (("", True), (names[3], False)):
        monkeypatch.setattr(kvpool.bugs.check, "every_check", refuting(spared))
        whole = run_seeded_bugs(PROFILES["ci"], progress, workers=1).as_json()
        parts = [run_seeded_bugs(PROFILES["ci"], progress, Shard(i, 4), workers=1).as_json()
                 for i in range(1, 5)]
        merged = _merge_phase("seeded-bugs", parts)
        for doc in (whole, merged):
            case = doc["cases"][-1]
            assert case["id"] == "seeded-bugs/no-dead-weight" and case["ok"] is ok
            assert ok or spared in case["failure"]["message"]


def test_conform_shards_merge_to_one_campaign(tmp_path: Path) -> None:
    base = ["--impl", "kvpool.impl:BlockPool", "--runs", "3", "--steps", "200", "--examples", "9",
            "--machine-steps", "5"]
    log = io.StringIO()
    assert conform_cli.main([*base, "--json", str(tmp_path / "whole.json")], out=log) == 0
    for i in (1, 2):
        assert conform_cli.main([*base, "--shard", f"{i}/2", "--json", str(tmp_path / f"{i}.json")],
                                out=log) == 0
    code = merge_cli.main([str(tmp_path / "2.json"), str(tmp_path / "1.json"), "--json",
                           str(tmp_path / "m.json"), "--junit", str(tmp_path / "m.xml")], out=log)
    whole = json.loads((tmp_path / "whole.json").read_text())
    merged = json.loads((tmp_path / "m.json").read_text())
    parts = [json.loads((tmp_path / f"{i}.json").read_text()) for i in (1, 2)]
    assert code == 0 and merged["ok"]
    assert merged["phases"][0]["executed"] == whole["phases"][0]["executed"]
    assert [p["phases"][0]["executed"] for p in parts] != [whole["phases"][0]["executed"]] * 2
    assert ET.parse(tmp_path / "m.xml").getroot().find("testsuite") is not None


def test_interleave_puts_a_split_list_back() -> None:
    items = list(range(11))
    for n in (1, 2, 3, 5, 11, 13):
        parts = [[x for x in items if Shard(i, n).takes(x)] for i in range(1, n + 1)]
        assert interleave(parts) == items
    with pytest.raises(MergeError):
        interleave([[0, 2, 4], []])


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "x", "1/2/3", "-1/2", ""])
def test_a_bad_shard_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ShardError):
        Shard.parse(text)
    assert verify_cli.main(["--shard", text]) == 2
    assert conform_cli.main(["--impl", "kvpool.impl:BlockPool", "--shard", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--shard" in line for line in err)


def test_merge_refuses_what_is_not_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--skip", "proofs", "--skip", "agreement", "--skip", "seeded-bugs", "--skip", "refinement",
            "--runs", "2", "--steps", "50", "--bmc-depth", "1", "--plain"]
    paths = {}
    for name, extra in (("a1", ["--shard", "1/2"]), ("a2", ["--shard", "2/2"]), ("b2", ["--shard", "2/2",
                        "--steps", "60"]), ("c1", ["--shard", "1/3"])):
        paths[name] = str(tmp_path / f"{name}.json")
        verify_cli.main([*args, *extra, "--json", paths[name]], out=io.StringIO())
    (tmp_path / "bad.json").write_text("{")
    conform_cli.main(["--impl", "kvpool.impl:BlockPool", "--runs", "1", "--steps", "20", "--examples", "2",
                      "--shard", "1/1", "--json", str(tmp_path / "conf.json")], out=io.StringIO())
    capsys.readouterr()
    cases = {
        "missing": ([paths["a1"]], "shard 2/2 missing"),
        "twice": ([paths["a1"], paths["a1"], paths["a2"]], "given twice"),
        "budget": ([paths["a1"], paths["b2"]], "another budget"),
        "split": ([paths["a1"], paths["c1"]], "different splits"),
        "json": ([str(tmp_path / "bad.json")], "not JSON"),
        "absent": ([str(tmp_path / "nope.json")], "cannot read"),
        "mixed": ([paths["a1"], str(tmp_path / "conf.json")], "mixed documents"),
        "report": ([str(tmp_path / "conf.json"), "--report", str(tmp_path / "r")], "no report"),
    }
    for name, (argv, message) in cases.items():
        assert merge_cli.main(argv) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (name, err)
    assert merge_cli.main([paths["a2"], paths["a1"]], out=io.StringIO()) == 0
