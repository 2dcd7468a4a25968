"""scripts/spec_mutants.py: each wrong specification still applies to the current sources.

Running the judge on every mutant takes a ``kvpool verify`` run each (docs/verification.md
lists the measured verdicts); here each mutant is only staged, so that a change of the
sources that leaves a mutant's text behind fails at once instead of at the next measurement.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "spec_mutants.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("spec_mutants", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spec_mutants"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SM = _script()


def test_the_mutants_cover_every_kind_of_wrong_specification() -> None:
    kinds = {m.kind for m in SM.MUTANTS}
    assert kinds == {"model", "z3", "both", "contract", "domain"}
    assert len(SM.MUTANTS) >= 12 and len({m.name for m in SM.MUTANTS}) == len(SM.MUTANTS)


@pytest.mark.parametrize("mutant", SM.MUTANTS, ids=[m.name for m in SM.MUTANTS])
def test_each_mutant_applies_and_changes_the_sources(mutant: Any, tmp_path: Path) -> None:
    root = SM.stage(tmp_path, mutant)
    for path, old, new in mutant.edits:
        text = (root / "kvpool" / path).read_text(encoding="utf-8")
        assert old not in text or old in new, path
        assert new in text, path
