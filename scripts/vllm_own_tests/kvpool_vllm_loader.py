"""A pytest plugin for vLLM's own tests: load vLLM's general plugins before collection.

``scripts/vllm-own-tests.sh`` runs vLLM's tests twice with ``-p kvpool_vllm_loader``:
with ``VLLM_PLUGINS=kvpool`` (vLLM's loader finds kvpool's entry point and puts
kvpool's pool in place) and with ``VLLM_PLUGINS`` naming no plugin (vLLM's own pool).
Test modules are imported after this hook, so they see the pool the plugin left.
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


def pytest_report_header(config: pytest.Config) -> str:
    return f"block pool under test: {config.stash.get(_POOL, '?')}"
