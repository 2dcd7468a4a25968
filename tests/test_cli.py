"""The kvpool command, end to end in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BROKEN_POOL = '''
from kvpool.impl import BlockPool


class ForgetsLazyEviction(BlockPool):
    def get_new_blocks(self, num_blocks):
        enable, self.enable_caching = self.enable_caching, False
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            self.enable_caching = enable
'''


def kvpool(
    *args: str, cwd: Path | None = None, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-P", "-m", "kvpool", *args], capture_output=True,
                          text=True, cwd=cwd or "/", env=env, timeout=1800)


def test_version_and_help() -> None:
    assert kvpool("--version").stdout.startswith("kvpool ")
    help_text = kvpool("--help").stdout
    assert "check" in help_text and "example" in help_text
    assert "example" in kvpool("check", "--help").stdout


def test_check_passes_on_kvpool() -> None:
    done = kvpool("check", "--steps", "400", "--runs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 runs agree" in done.stdout


def test_check_fails_on_a_broken_pool_and_names_the_step(tmp_path: Path) -> None:
    (tmp_path / "broken_pool.py").write_text(BROKEN_POOL)
    done = kvpool("check", "--steps", "1500", "--runs", "6", "--pool",
                  "broken_pool:ForgetsLazyEviction", pythonpath=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGED" in done.stdout and "step " in done.stdout


@pytest.mark.parametrize("spec", ["no_such_module:X", "kvpool.impl:NoSuchClass", "nocolon"])
def test_bad_pool_argument_is_a_usage_error_without_traceback(spec: str) -> None:
    done = kvpool("check", "--pool", spec)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "--pool" in done.stderr


def test_non_positive_budget_is_a_usage_error() -> None:
    assert kvpool("check", "--steps", "0").returncode == 2


def test_prove_proves_everything_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "proofs.json"
    done = kvpool("prove", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checks proven" in done.stdout
    assert out.read_text().strip().startswith(("{", "["))


def test_kvpool_with_no_command_prints_usage_and_exits_2() -> None:
    done = kvpool()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kvpool") and "COMMAND" in done.stderr


THIRD_PARTY = Path(__file__).parent / "third_party"


@pytest.mark.parametrize("command", [["check", "--steps", "300", "--runs", "1", "--pool"],
                                     ["record", "trace.jsonl", "--steps", "300", "--pool"],
                                     ["conform", "--runs", "1", "--steps", "300", "--examples", "20",
                                      "--impl"]])
def test_every_command_agrees_on_misuse_and_says_why(command: list[str], tmp_path: Path) -> None:
    """A pool without kvpool's typed refusals gets only legal calls, in every command, and the
    output says so; a module in the current directory is found."""
    for name in ("mypool.py",):
        (tmp_path / name).write_text((THIRD_PARTY / name).read_text())
    done = kvpool(*command, "mypool:BlockPool", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "misuse off: mypool:BlockPool does not refuse misuse" in done.stdout
    if command[0] == "record":  # the trace a black-box pool recorded checks as it is
        checked = kvpool("check-trace", "trace.jsonl", cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    ours = kvpool(*command, "kvpool.impl:BlockPool", cwd=tmp_path)
    assert ours.returncode == 0 and "misuse on:" in ours.stdout, ours.stdout + ours.stderr


def _reader_gone(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``kvpool ARGS | head -c 0``: the reader of its output closes the pipe before it writes."""
    proc = subprocess.Popen([sys.executable, "-P", "-m", "kvpool", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, "", err)


def test_every_command_ends_quietly_when_its_reader_goes(tmp_path: Path) -> None:
    """A broken pipe on standard output is handled once, at the command line's entry."""
    events = tmp_path / "e.jsonl"
    events.write_text('{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0}\n' * 50)
    trace = tmp_path / "t.jsonl"
    assert kvpool("record", str(trace), "--steps", "50", cwd=tmp_path).returncode == 0
    for args in (["check-events", str(events), "--json"], ["check-events", str(events)],
                 ["check-trace", str(trace), "--json"], ["check-trace", str(trace)], ["--help"],
                 ["claims"]):
        done = _reader_gone(*args, cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr and "Error" not in done.stderr, (
            args, done.returncode, done.stderr)
