"""vLLM's own modules for the tests that run kvpool beside them, and vLLM's requests.

Importing this skips the importing test module unless vLLM is importable: ``scripts/install-vllm.sh``
makes it so on a CPU-only machine, and ``.ci/run`` runs those files in its vLLM stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

REASON = "needs vLLM (scripts/install-vllm.sh; .ci/run's vLLM stage runs it)"
vllm_pool = pytest.importorskip("vllm.v1.core.block_pool", reason=REASON)
vllm_request = pytest.importorskip("vllm.v1.request", reason=REASON)
vllm_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils", reason=REASON)
vllm_hashing = pytest.importorskip("vllm.utils.hashing", reason=REASON)
vllm_sampling = pytest.importorskip("vllm.sampling_params", reason=REASON)
pytest.importorskip("vllm.envs", reason=REASON).enable_envs_cache()


def vllm_requests(block_size: int) -> Callable[..., Any]:
    """A maker of real vLLM Requests, ``(rid, tokens, **Request's keywords)``, whose block hashes
    vLLM computes itself, ``block_size`` tokens a hash (sha256: the same none-hash every time)."""
    vllm_utils.init_none_hash(vllm_hashing.sha256)
    hasher = vllm_utils.get_request_block_hasher(block_size, vllm_hashing.sha256)
    params = vllm_sampling.SamplingParams(max_tokens=8)

    def make(rid: str, tokens: list[int], **kw: Any) -> Any:
        return vllm_request.Request(rid, tokens, params, None, block_hasher=hasher, **kw)

    return make
