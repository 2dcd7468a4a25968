"""The CI recipes (valid files, linked from the docs, the pre-commit hook really runs) and
the project's own weekly mutation-testing workflow."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import merge, verify
from kvpool.verify import Shard

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
yaml = pytest.importorskip("yaml")


def load(name: str) -> Any:
    return yaml.safe_load((RECIPES / name).read_text())


def verify_argv(command: str) -> list[str]:
    """The arguments after ``kvpool verify`` in a shell command line."""
    words = shlex.split(command)
    at = next(i for i, w in enumerate(words) if w == "kvpool" and words[i + 1:i + 2] == ["verify"])
    return words[at + 2:]


@pytest.mark.parametrize("name", ["github-actions.yml", "github-actions-matrix.yml",
                                  "pre-commit-config.yaml"])
def test_the_docs_link_each_recipe(name: str) -> None:
    """The docs point at the file rather than quote it, so there is one copy."""
    assert f"](../recipes/{name})" in (ROOT / "docs" / "verification.md").read_text()


def test_the_github_actions_job_is_a_workflow_that_runs_verify() -> None:
    flow = load("github-actions.yml")
    assert flow["name"] and flow.get("on", flow.get(True))  # YAML 1.1 reads "on" as True
    (job,) = flow["jobs"].values()
    assert job["runs-on"]
    for step in job["steps"]:
        assert ("uses" in step) != ("run" in step), step
    (command,) = [step["run"] for step in job["steps"] if "kvpool verify" in step.get("run", "")]
    parsed = verify.parser().parse_args(verify_argv(command))
    assert parsed.impl == ["mypkg.block_pool:BlockPool"] and parsed.junit == "kvpool.xml"


def test_the_matrix_recipe_runs_every_shard_once_then_merges_them() -> None:
    """N shard jobs whose --shard I/N cover 1..N once, and a merge job after them all that
    reads every shard's --json."""
    flow = load("github-actions-matrix.yml")
    assert flow["name"] and flow.get("on", flow.get(True))
    jobs = flow["jobs"]
    shard_job, merge_job = jobs["shard"], jobs["merge"]
    for job in (shard_job, merge_job):
        assert job["runs-on"]
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step
    values = shard_job["strategy"]["matrix"]["shard"]
    assert shard_job["strategy"]["fail-fast"] is False  # one failing shard must not cancel the others
    (command,) = [s["run"] for s in shard_job["steps"] if "kvpool verify" in s.get("run", "")]
    (upload,) = [s for s in shard_job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    shards, outputs = [], []
    for value in values:
        line = command.replace("${{ matrix.shard }}", str(value)).split("||")[0]
        parsed = verify.parser().parse_args(verify_argv(line))
        shards.append(Shard.parse(parsed.shard))
        outputs.append(parsed.json)
        assert parsed.impl == ["mypkg.block_pool:BlockPool"] and parsed.profile == "deep"
        assert upload["with"]["path"].replace("${{ matrix.shard }}", str(value)) == parsed.json
    count = len(values)
    assert sorted((s.index, s.count) for s in shards) == [(i, count) for i in range(1, count + 1)]
    assert merge_job["needs"] == "shard" and merge_job["if"] == "always()"
    (download,) = [s for s in merge_job["steps"]
                   if s.get("uses", "").startswith("actions/download-artifact@")]
    (merging,) = [s["run"] for s in merge_job["steps"] if "kvpool merge" in s.get("run", "")]
    words = shlex.split(merging)
    args = merge.parser().parse_args(words[words.index("merge") + 1:])
    (pattern,) = args.files
    assert all(Path(out).match(pattern) for out in outputs)
    assert download["with"]["pattern"].rstrip("*") in upload["with"]["name"]
    assert args.json and args.junit and args.report


def test_the_pre_commit_config_is_valid() -> None:
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    if not Path(pre_commit).exists():
        pytest.skip("pre-commit is not installed")
    done = subprocess.run([pre_commit, "validate-config", str(RECIPES / "pre-commit-config.yaml")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (hook,) = load("pre-commit-config.yaml")["repos"][0]["hooks"]
    assert verify.parser().parse_args(verify_argv(hook["entry"])).impl == ["mypkg.block_pool:BlockPool"]


POOLS = {
    "good": "from kvpool.impl import BlockPool\n",
    "broken": "from kvpool.bugs.pools import FreeHashedToHead as BlockPool\n",
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_the_pre_commit_hook_passes_a_good_pool_and_stops_a_broken_one(pool: str, tmp_path: Path) -> None:
    """The recipe in a real git repository with a package ``mypkg``; ``pre-commit run``."""
    bindir = Path(sys.executable).parent
    if not (bindir / "pre-commit").exists() or not (bindir / "kvpool").exists() or not shutil.which("git"):
        pytest.skip("needs pre-commit, the kvpool command and git")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "block_pool.py").write_text(POOLS[pool])
    shutil.copy(RECIPES / "pre-commit-config.yaml", tmp_path / ".pre-commit-config.yaml")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(tmp_path),
           "PRE_COMMIT_HOME": str(tmp_path / ".cache"), "GIT_CONFIG_GLOBAL": os.devnull}
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True, env=env)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True, env=env)
    done = subprocess.run([str(bindir / "pre-commit"), "run", "--all-files"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == (0 if pool == "good" else 1), done.stdout + done.stderr
    assert ("Passed" if pool == "good" else "FAILED conformance/mypkg.block_pool:BlockPool") in done.stdout


# ------------------------------------------------------------ the scheduled workflows


def test_weekly_mutation_workflow_is_valid() -> None:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "mutation-weekly.yml").read_text())
    assert isinstance(doc, dict) and doc["name"]
    crons = [entry["cron"] for entry in doc.get("on", doc.get(True))["schedule"]]  # YAML 1.1: `on` is true
    assert crons and all(len(c.split()) == 5 for c in crons)
    job = doc["jobs"]["mutation"]
    assert isinstance(job["runs-on"], str) and int(job["timeout-minutes"]) > 0
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("bash benchmarks/mutation.sh all" in r for r in runs)
    assert any(step.get("uses", "").startswith("actions/checkout@") for step in job["steps"])


def test_weekly_spec_mutation_workflow_judges_every_mutant_then_reports() -> None:
    """Every shard once, each judging its part of the whole population; the report after them all."""
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "spec-mutation-weekly.yml").read_text())
    crons = [entry["cron"] for entry in doc.get("on", doc.get(True))["schedule"]]  # YAML 1.1: `on` is true
    assert crons and all(len(c.split()) == 5 for c in crons)
    shard, report = doc["jobs"]["shard"], doc["jobs"]["report"]
    shards = shard["strategy"]["matrix"]["shard"]
    run = "\n".join(step.get("run", "") for step in shard["steps"])
    count = int(run.split("--shard ${{ matrix.shard }}/")[1].split()[0])
    assert sorted(shards) == list(range(1, count + 1))
    assert "scripts/spec_mutants.py --all" in run and "--jobs 2" in run
    assert report["needs"] == "shard" and "--report" in "\n".join(s.get("run", "") for s in report["steps"])
    assert int(shard["timeout-minutes"]) > 0 and int(report["timeout-minutes"]) > 0


def test_nightly_slow_workflow_runs_the_slow_tests() -> None:
    """The cases left out of the per-push run (conftest.SLOW_CASES, SAMPLED, @pytest.mark.slow)."""
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "slow-nightly.yml").read_text())
    crons = [entry["cron"] for entry in doc.get("on", doc.get(True))["schedule"]]  # YAML 1.1: `on` is true
    assert crons and all(len(c.split()) == 5 for c in crons)
    job = doc["jobs"]["slow"]
    assert isinstance(job["runs-on"], str) and int(job["timeout-minutes"]) > 0
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "pytest" in runs and "-m slow" in runs and ".[test]" in runs
