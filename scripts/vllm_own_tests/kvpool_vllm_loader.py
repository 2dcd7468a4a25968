"""A pytest plugin for vLLM's own tests: load vLLM's general plugins before collection.

``scripts/vllm-own-tests.sh`` runs vLLM's tests twice with ``-p kvpool_vllm_loader``:
with ``VLLM_PLUGINS=kvpool`` (vLLM's loader finds kvpool's entry point and puts
kvpool's pool in place) and with ``VLLM_PLUGINS`` naming no plugin (vLLM's own pool).
Test modules are imported after this hook, so they see the pool the plugin left.

``KVPOOL_RECORD_PASSED=FILE`` writes the ids of the tests that passed; ``KVPOOL_ONLY=FILE`` runs
only the tests listed there.  The run with kvpool's pool runs only what passed with vLLM's: a test
that fails with vLLM's own pool (most need a model's files from the hub) says nothing about kvpool's,
and failing it again cost a third of the run.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm.v1.core import block_pool

    want = os.environ.get("KVPOOL_EXPECT_POOL", "")
    got = f"{block_pool.BlockPool.__module__}.{block_pool.BlockPool.__qualname__}"
    if want and got != want:
        raise pytest.UsageError(f"after vLLM loaded its plugins the pool is {got}, expected {want}")
    config.stash[_POOL] = got


_POOL = pytest.StashKey[str]()
_PASSED: dict[str, bool] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (only := os.environ.get("KVPOOL_ONLY", "")):
        return
    with open(only, encoding="utf-8") as f:
        wanted = set(f.read().split("\n"))
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test passed when its call passed and its set-up and teardown did not fail."""
    if report.when == "call":
        _PASSED[report.nodeid] = report.passed
    elif report.failed:
        _PASSED[report.nodeid] = False


def pytest_sessionfinish(session: pytest.Session) -> None:
    if record := os.environ.get("KVPOOL_RECORD_PASSED", ""):
        with open(record, "w", encoding="utf-8") as f:
            f.write("".join(f"{test}\n" for test, ok in sorted(_PASSED.items()) if ok))


def pytest_report_header(config: pytest.Config) -> str:
    return f"block pool under test: {config.stash.get(_POOL, '?')}"
