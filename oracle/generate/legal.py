"""Legal call sequences every caller contract must accept: the contracts checked from the other side.

A contract too weak lets a wrong caller through, and a seeded bug that breaks
it must be caught (:mod:`kvpool.bugs`).  A contract too STRONG refuses calls a
correct caller makes, and nothing fails: the searches skip the calls it refuses
(``ContractBroken``) and explore less.  So kvpool ships call sequences known to
be legal, and every contract must accept each one whole:

* ``corpus/vllm/``: what vLLM 0.31's own tests asked of its pools, recorded by the
  shadow (``KVPOOL_SHADOW_KEEP=1 bash scripts/vllm-own-tests.sh``, then
  ``scripts/vllm_own_tests/make_corpus.py``);
* ``corpus/workloads/``: the oracle's vLLM-like workload, recorded without misuse
  (``kvpool record --seed S --steps 300 --no-misuse --no-observe``).

Each is replayed on the model (:func:`kvpool.oracle.trace.check_trace`): a call
the model refuses as a broken contract, or answers differently, fails the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..trace import check_trace
from ..trace.check import CheckReport

CORPORA = ("vllm", "workloads", "grown")
"""The folders of ``corpus/``, each a set of legal traces (``grown``: added by ``kvpool corpus add``)."""


def legal_traces() -> list[Path]:
    """Every legal trace shipped with the package, by corpus then name."""
    root = resources.files("kvpool.oracle.generate").joinpath("corpus")
    return [p for name in CORPORA for p in sorted(Path(str(root.joinpath(name))).glob("*.jsonl"))]


@dataclass
class Legal:
    """How the contracts fared on the legal corpus."""

    traces: int
    calls: int
    refused: list[CheckReport]
    """Traces the model did not accept whole: a contract refused a legal call, or the model differs."""

    @property
    def ok(self) -> bool:
        return self.traces > 0 and not self.refused


def check_legal(paths: list[Path] | None = None) -> Legal:
    """Replay every legal trace on the model; each must be accepted whole."""
    paths = legal_traces() if paths is None else paths
    reports = [check_trace(p) for p in paths]
    return Legal(len(reports), sum(r.steps for r in reports), [r for r in reports if not r.ok])


__all__ = ["CORPORA", "Legal", "check_legal", "legal_traces"]
