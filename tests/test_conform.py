"""``kvpool conform``: green on kvpool.impl (and on vLLM's pool when importable),
red with a short trace on each seeded bug, and clean usage errors.

The seeded bugs are the broken pools of the catalogue (``kvpool.bugs.pools``),
each modelled on a real failure of block pools, loaded with ``--impl`` as a
user's class would be; the adapter factories are published as the module
``kvpool_seeded_bugs``.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import conform
from kvpool.impl import BlockPool
from kvpool.oracle.core.adapter import ClassAdapter, kvpool_adapter, load_object

# ------------------------------------------------------------------ seeded bugs

SEEDED_BUGS = ["FreeWithoutRefcountCheck", "FreeSameBlockTwice", "EvictForgetsIndex",
               "TouchLeavesBlockFree", "NullBlockHandedOut", "NullBlockHashed",
               "PartialKeptAfterPromotion", "ResetWhileInUse", "RefusedFreeKeepsPartialEffect"]
"""Broken pools of the catalogue (kvpool.bugs.pools) the state machine must shrink."""


def adapter_of_fixed_pool() -> ClassAdapter:
    """An ``--adapter`` factory, as a user would write one."""
    return kvpool_adapter(BlockPool)


def not_an_adapter() -> object:
    return object()


@pytest.fixture(autouse=True, scope="module")
def seeded_bugs_module() -> Iterator[None]:
    module = types.ModuleType("kvpool_seeded_bugs")
    module.adapter_of_fixed_pool = adapter_of_fixed_pool  # type: ignore[attr-defined]
    module.not_an_adapter = not_an_adapter  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield
    del sys.modules[module.__name__]


QUICK = ["--runs", "2", "--steps", "300", "--examples", "60", "--machine-steps", "20"]
HUNT = ["--runs", "2", "--steps", "500", "--examples", "500", "--machine-steps", "15"]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return conform.main(list(argv), out=out), out.getvalue()


# ---------------------------------------------------------------------- green


def test_kvpool_impl_conforms_with_json_and_junit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_EXAMPLE_DB", raising=False)  # the suite may run with one
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    status, text = run("--impl", "kvpool.impl:BlockPool", *QUICK, "--json", str(json_path),
                       "--junit", str(junit_path))
    assert status == 0, text
    assert "agrees with the model" in text
    doc = json.loads(json_path.read_text())
    assert doc["schema"] == conform.SCHEMA and doc["ok"] is True and doc["exit_code"] == 0
    assert doc["settings"] == {"steps": 300, "runs": 2, "examples": 60, "machine_steps": 20,
                               "seed": 0, "misuse": True, "reference": "0.31", "shard": [1, 1],
                               "database": None, "blocks": None, "long_lived": False, "lacks": []}
    assert [p["name"] for p in doc["phases"]] == ["campaign", "machine"]
    assert all(p["ok"] and p["failure"] is None and p["executed"] > 0 for p in doc["phases"])
    suite = ET.parse(junit_path).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == ["campaign", "machine"]


def test_adapter_factory_is_accepted() -> None:
    status, text = run("--adapter", "kvpool_seeded_bugs:adapter_of_fixed_pool", *QUICK)
    assert status == 0, text


# ------------------------------------------------------------------------ red


@pytest.mark.parametrize("bug", SEEDED_BUGS)
def test_seeded_bug_is_caught_with_a_short_trace(bug: str, tmp_path: Path) -> None:
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    status, text = run("--impl", f"kvpool.bugs.pools:{bug}", *HUNT,
                       "--json", str(json_path), "--junit", str(junit_path))
    assert status == 1, text
    assert "DIVERGES from the model" in text and "minimal trace" in text
    doc = json.loads(json_path.read_text())
    assert doc["ok"] is False and doc["exit_code"] == 1
    machine = doc["phases"][1]
    assert machine["name"] == "machine" and not machine["ok"]
    failure = machine["failure"]
    assert set(failure) == {"kind", "message", "details", "trace", "seed", "steps", "shrunk_from",
                            "shrink_note", "requests"}
    assert failure["shrunk_from"] is None  # the machine's trace is shrunk by Hypothesis
    assert failure["kind"] == "divergence" and failure["message"] in failure["details"]
    assert 1 <= len(failure["trace"]) <= 15, failure["trace"]
    assert failure["trace"][0].startswith("state.setup(")
    assert failure["steps"] and failure["steps"][-1]["picture"] is not None, "pictured steps"
    campaign = doc["phases"][0]
    if not campaign["ok"]:  # shrunk: the calls kept, the run's length and seed to replay it
        shrunk = campaign["failure"]
        assert shrunk["shrunk_from"] >= len(shrunk["trace"]) >= 1 and shrunk["seed"] in (0, 1)
        assert campaign["executed"] >= shrunk["shrunk_from"]
        assert f"{shrunk['shrunk_from']:,} workload calls, shrunk to {len(shrunk['trace'])}" in text
    cases = {c.get("name"): c for c in ET.parse(junit_path).getroot().iter("testcase")}
    failed = cases["machine"].find("failure")
    assert failed is not None and failed.get("message") == failure["message"]
    assert failure["trace"][-1] in (failed.text or "")


# --------------------------------------------------------------- usage errors


@pytest.mark.parametrize("argv, says", [
    (["--impl", "no_such_module_xyz:Pool"], "cannot import"),
    (["--impl", "kvpool.impl:NoSuchPool"], "has no attribute"),
    (["--impl", "kvpool.impl"], "expected MODULE:NAME"),
    (["--impl", "collections:OrderedDict"], "not a block pool class"),
    (["--adapter", "kvpool_seeded_bugs:not_an_adapter"], "returned no adapter"),
    (["--impl", "kvpool.impl:BlockPool", "--json", "/no/such/dir/r.json"], "cannot write"),
    (["--impl", "kvpool.impl:BlockPool", "--junit", "/"], "cannot write"),
    (["--impl", "kvpool.impl:BlockPool", "--steps", "0"], "--steps must be positive"),
    (["--impl", "kvpool.impl:BlockPool", "--reference", "9.9"], "choose from"),
    ([], "required"),
    (["--impl", "kvpool.impl:BlockPool", "--adapter", "x:y"], "not allowed"),
])
def test_usage_errors_exit_2_in_one_line(argv: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    status, text = run(*argv)
    err = capsys.readouterr().err
    assert status == 2 and text == ""
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_a_pool_in_the_current_directory_is_found_after_the_installed_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In front, the current directory's folders shadow installed packages for the rest of the
    # process and in every process spawned with its sys.path (a checkout's kvpool/ broke them).
    (tmp_path / "pool_here.py").write_text("Pool = 'here'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "pool_here", raising=False)
    before = list(sys.path)
    assert load_object("pool_here:Pool") == "here"
    assert sys.path == [*before, str(tmp_path)]
    sys.modules.pop("pool_here", None)


def test_usage_error_from_the_command_line_has_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kvpool.cli.conform", "--impl", "nope_nope:Pool"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("kvpool conform: error: --impl 'nope_nope:Pool'")
    assert "Traceback" not in done.stderr and done.stdout == ""


# ----------------------------------------------------------------------- vLLM


def test_vllm_block_pool_conforms_without_misuse() -> None:
    pytest.importorskip("vllm.v1.core.block_pool")
    status, text = run("--impl", "vllm.v1.core.block_pool:BlockPool", "--no-misuse",
                       "--runs", "3", "--steps", "1000", "--examples", "200")
    assert status == 0, text
    assert "misuse off" in text


# ------------------------------------------------------------------- the first hour


def _third_party(name: str) -> types.ModuleType:
    """A module of tests/third_party (no package), loaded by path under its own name."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).with_name("third_party") / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def exhausted_module() -> Iterator[str]:
    """A third-party pool whose refusal for lack of blocks is ``ValueError("pool exhausted")``."""
    mypool = _third_party("mypool")

    class Exhausted(mypool.BlockPool):  # type: ignore[misc,name-defined]
        def get_new_blocks(self, num_blocks: int) -> Any:
            try:
                return super().get_new_blocks(num_blocks)
            except ValueError:
                raise ValueError("pool exhausted") from None

    module = types.ModuleType("kvpool_exhausted_pool")
    module.Exhausted = Exhausted  # type: ignore[attr-defined]
    Exhausted.__module__ = module.__name__
    sys.modules[module.__name__] = module
    yield "kvpool_exhausted_pool:Exhausted"
    del sys.modules[module.__name__]


def test_any_value_error_is_out_of_blocks_unless_strict_messages(exhausted_module: str) -> None:
    status, text = run("--impl", exhausted_module, "--phase", "campaign", "--runs", "2", "--steps", "300")
    assert status == 0, text
    status, text = run("--impl", exhausted_module, "--phase", "campaign", "--runs", "2", "--steps", "300",
                       "--strict-messages", "--no-shrink")
    assert status == 1 and "pool exhausted" in text, text


def test_one_phase_and_fail_fast() -> None:
    status, text = run("--impl", "kvpool.impl:BlockPool", "--phase", "machine", "--examples", "5")
    assert status == 0 and "machine: ok" in text and "campaign:" not in text, text
    status, text = run("--impl", "kvpool.bugs.pools:FreeHashedToHead", "--fail-fast", "--runs", "1")
    assert status == 1 and "campaign: DIVERGED" in text and "machine:" not in text, text
    assert "--fail-fast: the other phases are not run" in text


def test_the_pools_log_lines_are_silenced_unless_verbose(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    argv = ["--impl", "kvpool.impl:BlockPool", "--phase", "campaign", "--runs", "2", "--steps", "400"]
    status, text = run(*argv)
    assert status == 0 and "the pool's log lines are silenced (kvpool" in text, text
    assert not [r for r in caplog.records if r.name.startswith("kvpool")]
    status, text = run(*argv, "--verbose")
    assert status == 0 and "silenced" not in text
    assert [r for r in caplog.records if r.name.startswith("kvpool")]  # kvpool warns of refused resets
    assert logging.getLogger("kvpool").level == logging.NOTSET  # restored


def test_hypothesis_files_go_to_the_cache_folder_named_in_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hypothesis.configuration import set_hypothesis_home_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPOOL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KVPOOL_EXAMPLE_DB", raising=False)
    try:
        status, text = run("--impl", "kvpool.impl:BlockPool", "--phase", "machine", "--examples", "5")
    finally:
        set_hypothesis_home_dir(None)
    assert status == 0, text
    assert f"hypothesis files: {tmp_path / 'cache' / 'hypothesis'}" in text
    assert not (tmp_path / ".hypothesis").exists()


def test_failures_show_hashes_and_keys_short() -> None:
    status, text = run("--impl", "kvpool.bugs.pools:RemovedEventDropsGroup", "--runs", "2",
                       "--examples", "30")
    assert status == 1, text
    assert "b'" not in text and "…" in text, text
    assert max(len(line) for line in text.splitlines()) < 1000  # a long take of events is cut
