"""The corpus of legal call sequences from vLLM's own tests (``tests/corpus/vllm``).

Each trace is what one pool of one of vLLM 0.31.0's ``tests/v1/core`` tests was
asked, under the shadow (``KVPOOL_SHADOW_KEEP=1 bash scripts/vllm-own-tests.sh``,
then ``scripts/vllm_own_tests/make_corpus.py``): legal calls the model agrees
with, and so calls every contract of the pool must accept (issue 23).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.oracle.trace import check_trace

CORPUS = sorted((Path(__file__).parent / "corpus" / "vllm").glob("*.jsonl"))


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
