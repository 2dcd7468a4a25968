"""``kvpool verify`` end to end: exit codes, JUnit, JSON, the report, usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvpool import verify
from kvpool.bugs import BUGS
from kvpool.bugs.check import with_bug
from kvpool.proofs import bmc
from kvpool.proofs import inductive as proofs_inductive
from kvpool.proofs import transitions as proofs_transitions

SMALL = ["--bmc-depth", "1", "--refinement-depth", "1", "--steps", "200", "--runs", "2", "--examples", "5",
         "--machine-steps", "10", "--plain"]
"""A budget small enough for a test, big enough to reach every phase."""


def kvpool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed command as CI would: a subprocess, no TTY, CI=true."""
    env = {**os.environ, "CI": "true"}
    return subprocess.run([sys.executable, "-P", "-m", "kvpool", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


NO_PROOFS = ("--skip", "proofs", "--skip", "seeded-bugs", "--skip", "bmc", "--skip", "agreement",
             "--skip", "refinement")
"""Leave out every phase that does not run a pool or a file."""


def junit_cases(path: Path) -> list[ET.Element]:
    return list(ET.parse(path).getroot().iter("testcase"))


def failing_cases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for p in doc["phases"] for c in p["cases"] if not c["ok"]]


@pytest.mark.slow  # 78 s: a whole ci-profile run; .ci/run makes one and keeps its outputs
def test_a_passing_run_writes_junit_json_and_report(tmp_path: Path) -> None:
    done = kvpool("verify", *SMALL, "--skip", "seeded-bugs", "--impl", "kvpool.impl:BlockPool",
                  "--json", "out.json", "--junit", "out.xml", "--report", "report", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b[" not in done.stdout, "CI output must be plain"
    assert "kvpool verify: PASSED (exit 0)" in done.stdout
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["schema"] == verify.SCHEMA and doc["ok"] and doc["exit_code"] == 0
    phases = {p["name"]: p for p in doc["phases"]}
    assert list(phases) == list(verify.PHASES)
    assert phases["seeded-bugs"]["skipped"] and phases["traces"]["skipped"]
    proofs = phases["proofs"]
    order = proofs["order"]
    properties = sum(len(row) for row in proofs["properties"].values())
    assert len(proofs["cases"]) == len(proofs["steps"]) * (len(proofs["initial"]) + 1) + len(
        proofs["initial"]) + len(proofs["lemmas"]) + properties + 1 + len(order["steps"]) * (
        len(order["properties"]) + 1)
    assert all(cell["status"] == "proven" for row in order["matrix"].values() for cell in row.values())
    assert all(cell["status"] == "proven" for row in proofs["matrix"].values() for cell in row.values())
    assert [r["depth"] for r in phases["bmc"]["runs"]] == [1, 1, 1]  # --bmc-depth sets every pool's
    lockstep = phases["lockstep"]
    assert lockstep["calls"] >= 400 and len(lockstep["operations"]) >= 10 and lockstep["errors"]
    assert [t["spec"] for t in phases["conformance"]["targets"]] == ["kvpool.impl:BlockPool"]
    headline = {i["name"] for i in doc["invariants"] if i["encoded"]}
    assert {"idle_hashed_block_is_evictable", "index_entries_are_sound"} <= headline
    cases = junit_cases(tmp_path / "out.xml")
    assert len(cases) == sum(len(p["cases"]) for p in doc["phases"])
    assert not any(c.find("failure") is not None for c in cases)
    assert (tmp_path / "report" / "report.md").exists() and (tmp_path / "report" / "report.html").exists()


def test_a_broken_implementation_fails_with_a_pictured_counterexample(tmp_path: Path) -> None:
    done = kvpool("verify", *SMALL, *NO_PROOFS,
                  "--impl", "kvpool.bugs.pools:FreeHashedToHead",
                  "--json", "out.json", "--junit", "out.xml", "--report", "report", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED conformance/kvpool.bugs.pools:FreeHashedToHead" in done.stdout
    doc = json.loads((tmp_path / "out.json").read_text())
    (bad,) = failing_cases(doc)
    assert bad["failure"]["kind"] == "divergence"
    last = bad["failure"]["trace"][-1]
    assert last["picture"] and last["pool_picture"] and "free" in last["differs"]
    assert "free_blocks" in bad["failure"]["details"]  # the shrunk trace frees a cached block
    failures = [c for c in junit_cases(tmp_path / "out.xml") if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["conformance/kvpool.bugs.pools:FreeHashedToHead"]
    assert "free_blocks" in (failures[0].find("failure").text or "")  # type: ignore[union-attr]
    html = (tmp_path / "report" / "report.html").read_text()
    assert "pool-picture" in html and "free_blocks" in html


def test_a_recorded_trace_and_event_stream_are_checked(tmp_path: Path) -> None:
    assert kvpool("record", "--steps", "200", "trace.jsonl", cwd=tmp_path).returncode == 0
    done = kvpool("verify", *SMALL, *NO_PROOFS,
                  "--skip", "lockstep", "--trace", "trace.jsonl", "--events", "trace.jsonl",
                  "--json", "out.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    files = next(p for p in doc["phases"] if p["name"] == "traces")["files"]
    assert [(f["kind"], f["ok"]) for f in files] == [("trace", True), ("events", True)]
    assert files[0]["steps"] > 0
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    at = next(i for i, line in enumerate(lines) if line.get("op") == "get_num_free_blocks")
    lines[at]["result"] += 1  # the recorded pool "said" one block more than the model
    (tmp_path / "edited.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = kvpool("verify", *SMALL, *NO_PROOFS,
                  "--skip", "lockstep", "--trace", "edited.jsonl", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAILED traces/trace/edited.jsonl: edited.jsonl:{at + 1}: step {at}" in done.stdout


USAGE_ERRORS = {
    "unknown module": (["--impl", "no_such_module:Pool"], "cannot import no_such_module"),
    "unknown class": (["--impl", "kvpool.impl:NoSuchPool"], "has no attribute NoSuchPool"),
    "not a pool": (["--impl", "kvpool.impl.errors:BlockPoolError"], "is not a block pool class"),
    "bad adapter": (["--adapter", "kvpool.impl:BlockPool"], "--adapter"),
    "missing trace": (["--trace", "no-such-trace.jsonl"], "no-such-trace.jsonl: cannot read"),
    "unreadable trace": (["--trace", "not-json.txt"], "not-json.txt:1: bad JSON"),
    "unreadable events": (["--events", "not-json.txt"], "not-json.txt:1: bad JSON"),
    "report not writable": (["--report", "a-file/report"], "--report"),
    "json not writable": (["--json", "a-file/out.json"], "--json 'a-file': is a file"),
    "junit not writable": (["--junit", "a-file/out.xml"], "--junit 'a-file': is a file"),
    "bad budget": (["--steps", "0"], "--steps must be positive"),
    "bad time budget": (["--refinement-seconds", "0"], "--refinement-seconds must be positive"),
    "bad profile": (["--profile", "huge"], "invalid choice: 'huge'"),
    "bad reference": (["--reference", "0.5"], "--reference '0.5'"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_errors_exit_2_with_one_line(case: str, tmp_path: Path) -> None:
    (tmp_path / "not-json.txt").write_text("this is not JSON\n")
    (tmp_path / "a-file").write_text("")
    args, expected = USAGE_ERRORS[case]
    done = kvpool("verify", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpool verify: error: "), done.stderr
    assert expected in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["", "check", "prove", "bmc", "conform", "record",
                                     "check-trace", "check-events", "verify"])
def test_every_help_says_what_and_gives_an_example(command: str, tmp_path: Path) -> None:
    done = kvpool(*([command] if command else []), "--help", cwd=tmp_path)
    assert done.returncode == 0
    assert "example" in done.stdout.lower(), done.stdout
    assert f"kvpool {command}".strip() in done.stdout


def test_a_z3_counterexample_fails_the_proofs_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a seeded bug in place of a step, the matrix has a counterexample: exit 1."""
    broken = {**proofs_transitions.STEPS, "touch": BUGS["touch_leaves_block_free"].z3}
    monkeypatch.setattr(proofs_transitions, "STEPS", broken)
    monkeypatch.setattr(proofs_inductive, "STEPS", broken)
    phase = verify.run_proofs(verify.Budget(), verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    bad = [c for c in phase.cases if not c.ok]
    # Only the broken step is convicted; on a loaded machine another proof may time out
    # ("unknown", no counterexample), which fails the run too but convicts nothing.
    convicted = [c for c in bad if c.failure is not None and c.failure["kind"] == "counterexample"]
    assert convicted and all(c.id.startswith("proofs/preserve/touch/") for c in convicted)
    assert all(c.failure is not None and c.failure["kind"] == "unknown" for c in bad if c not in convicted)
    (case,) = [c for c in bad if c.id.endswith("/free_queue_holds_exactly_idle_blocks")]
    assert case.failure is not None and case.failure["kind"] == "counterexample"
    assert case.failure["details"], "z3's model (or why it has none) is kept"
    before, after = case.failure["trace"]  # drawn from a finite-scope model of the same query
    assert before["picture"]["blocks"][0]["null"] and after["call"].startswith("touch(#")
    assert any("ref" in change for change in after["changes"])
    # z3 may answer the unbounded query "unknown"; the finite-scope model still convicts the step
    assert phase.extra["matrix"]["touch"]["free_queue_holds_exactly_idle_blocks"]["status"] in (
        "counterexample", "unknown")


def test_a_bmc_violation_comes_with_a_picture_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    explore = bmc.explore
    monkeypatch.setattr(bmc, "explore", lambda cfg, depth, seconds, **part: explore(
        cfg, depth, seconds, with_bug("free_same_block_twice"), **part))
    budget = verify.Budget(bmc_pools=((4, 1),))
    phase = verify.run_bmc(budget, verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    case, other_version, legal, branches, misuse = phase.cases
    assert other_version.id == "bmc/3-blocks-hbs-2-vllm-0.33"  # the broken action is 0.33's too
    assert legal.id == "bmc/legal-corpus" and legal.ok
    assert branches.id == "bmc/domain-branches" and branches.ok
    assert misuse.id == "bmc/misuse-refused" and misuse.ok
    assert not case.ok and case.failure is not None
    trace = case.failure["trace"]
    assert trace and all(step["picture"]["blocks"] for step in trace)
    assert any(b["ref"] < 0 for b in trace[-1]["picture"]["blocks"])
    assert "free_blocks" in trace[-1]["call"]


CUT = {
    "bmc": (verify.run_bmc, verify.Budget(bmc_pools=((4, 1),), bmc_seconds=0.0),
            "bmc/4-blocks-hbs-1", "BMC 4 blocks, hash_block_size 1"),
    "agreement": (verify.run_agreement, verify.Budget(agreement_pools=((4, 1),), agreement_seconds=0.0,
                                                      agreement_samples=1),
                  "agreement/pool/4-blocks-hbs-1", "agreement on 4 blocks, hbs 1"),
    "refinement": (verify.run_refinement, verify.Budget(refinement_pools=((4, 2, True, True, 1),),
                                                        refinement_seconds=0.0),
                   "refinement/4-blocks-hbs-2",
                   "refinement 4 blocks, hash_block_size 2, caching on, events on"),
}
"""Each searching phase with its time budget spent before it starts: 0 s."""


@pytest.mark.parametrize("name", sorted(CUT))
def test_a_search_cut_by_its_time_budget_fails(name: str) -> None:
    """A run its time budget stops before its depth is not verified to that depth: it fails
    (the budgets are safety nets, so that a verdict never depends on the machine's load)."""
    run, budget, case_id, what = CUT[name]
    phase = run(budget, verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    case = next(c for c in phase.cases if c.id == case_id)
    assert not phase.ok and not case.ok and case.failure is not None
    assert case.failure["kind"] == "incomplete"
    assert case.failure["message"].startswith(f"{what}: cut by the time budget (0 s): not verified to depth ")


def test_a_seeded_bug_search_cut_by_its_time_budget_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpool.bugs

    name = next(n for n, b in BUGS.items() if b.action is not None)
    monkeypatch.setattr(kvpool.bugs, "BUGS", {name: BUGS[name]})
    phase = verify.run_seeded_bugs(verify.Budget(bmc_seconds=0.0),
                                   verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    case = next(c for c in phase.cases if c.id == f"seeded-bugs/bmc/{name}")
    assert not case.ok and case.failure is not None
    assert case.failure["message"] == (f"seeded bug {name} is not found by the BMC (its search was cut "
                                       "by the time budget, 0 s, after depth 0: a busy machine?)")


def test_the_ci_time_budgets_are_safety_nets() -> None:
    """Far above what the ci profile's searches take on a loaded 2-core machine (at most 90 s
    measured, docs/verification.md): a ci run is judged by its depths, not by the load."""
    ci = verify.PROFILES["ci"]
    assert min(ci.bmc_seconds, ci.agreement_seconds, ci.refinement_seconds) >= 600


def test_a_pool_keeps_its_own_depth_unless_the_command_line_sets_every_depth() -> None:
    """The ci profile explores a smaller pool one call deeper; ``--bmc-depth`` sets every pool's."""
    budget = verify.Budget(bmc_depth=1, bmc_pools=((3, 2), (3, 2, 2)))
    phase = verify.run_bmc(budget, verify.Progress(open(os.devnull, "w")))  # noqa: SIM115
    assert [(r["depth_target"], r["depth"]) for r in phase.extra["runs"]] == [(1, 1), (2, 2), (2, 2)]
    assert [c.id for c in phase.cases] == ["bmc/3-blocks-hbs-2", "bmc/3-blocks-hbs-2-depth-2",
                                           "bmc/3-blocks-hbs-2-depth-2-vllm-0.33", "bmc/legal-corpus",
                                           "bmc/domain-branches", "bmc/misuse-refused"]
    assert any(len(p) == 3 and p[2] >= 3 for p in verify.PROFILES["ci"].bmc_pools)
    assert any(len(p) == 3 and p[2] >= 3 for p in verify.PROFILES["ci"].agreement_pools)
    assert any(p[4] >= 3 for p in verify.PROFILES["dev"].refinement_pools)
    from kvpool.cli.verify import settings_from

    given = settings_from(["--bmc-depth", "1", "--agreement-depth", "1"]).budget
    assert all(len(p) == 2 for p in (*given.bmc_pools, *given.agreement_pools))


def test_a_terminal_gets_progress_bars(tmp_path: Path) -> None:
    """On a TTY (and CI unset) each phase draws a rich progress bar; CI gets plain lines."""
    import pty

    env = {k: v for k, v in os.environ.items() if k != "CI"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "kvpool", "verify", *NO_PROOFS, "--steps", "50",
                             "--runs", "2"],
                            cwd=tmp_path, env=env, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=900) == 0
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "\x1b[" in screen and "━" in screen, screen[-2000:]
    assert "lockstep" in screen and "kvpool verify: PASSED (exit 0)" in screen
