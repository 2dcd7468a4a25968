"""The corpus of legal call sequences (``oracle/generate/corpus``: vLLM's own tests, the workloads).

Each trace is what one pool of one of vLLM 0.31.0's ``tests/v1/core`` tests was
asked, under the shadow (``KVPOOL_SHADOW_KEEP=1 bash scripts/vllm-own-tests.sh``,
then ``scripts/vllm_own_tests/make_corpus.py``): legal calls the model agrees
with, and so calls every contract of the pool must accept (issue 23).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.oracle.generate.legal import check_legal, legal_traces
from kvpool.oracle.trace import check_trace

CORPUS = [p for p in legal_traces() if p.parent.name == "vllm"]


def test_the_corpus_is_there_and_small() -> None:
    assert len(CORPUS) >= 20
    assert all(p.stat().st_size <= 24_000 for p in CORPUS)
    tests = {json.loads(p.read_text().splitlines()[0])["meta"]["test"].split("::")[0] for p in CORPUS}
    assert len(tests) >= 5  # from several of vLLM's test files


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem[:60] for p in CORPUS])
def test_every_trace_is_a_legal_sequence_the_model_accepts(path: Path) -> None:
    report = check_trace(path)
    assert report.ok, report.format()
    assert report.contract is None and report.steps >= 4


def test_the_workloads_are_in_the_corpus_and_every_trace_is_accepted() -> None:
    out = check_legal()
    assert out.ok, [r.format() for r in out.refused]
    assert out.traces == len(CORPUS) + 3 and out.calls > 1000


def test_a_contract_too_strong_refuses_a_legal_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache_full_blocks contract that forbids re-caching a key another block holds (vLLM
    caches one prefix in several blocks) shrinks what the searches explore, silently; the
    legal corpus refuses it with the call it broke."""
    from kvpool.model import contracts

    def one_block_per_key(s: Any, key: Any, prefix: Any) -> None:
        if s.index.get(key):
            raise contracts.ContractBroken("hashes_name_one_prefix", "a key already in use")

    monkeypatch.setattr(contracts, "hashes_name_one_prefix", one_block_per_key)
    out = check_legal()
    assert not out.ok and out.refused
    assert out.refused[0].contract is not None
    assert out.refused[0].contract.contract == "hashes_name_one_prefix"
