"""Packaging and module boundaries: one import package, liftable impl, light model."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/").stdout
    return set(json.loads(out))


def test_impl_needs_nothing_outside_itself() -> None:
    before = _modules_after("pass")
    loaded = _modules_after("import kvpool.impl") - before
    project = {m for m in loaded if m.startswith("kvpool")}
    assert project <= {"kvpool"} | {m for m in project if m.startswith("kvpool.impl")}
    third_party = {m.split(".")[0] for m in loaded} - {"kvpool"}
    stdlib = set(sys.stdlib_module_names) | {"_" + m for m in sys.stdlib_module_names}
    assert {m for m in third_party if m not in stdlib and not m.startswith("_")} == set()


def test_model_loads_no_solver_and_no_test_machinery() -> None:
    loaded = _modules_after("import kvpool.model")
    assert not any(m.startswith(("z3", "hypothesis", "kvpool.proofs", "kvpool.oracle"))
                   for m in loaded)


def test_model_code_does_not_reach_into_the_pool() -> None:
    for path in (ROOT / "model").glob("*.py"):
        text = path.read_text()
        for forbidden in ("impl.pool", "impl.block", "impl.free_queue", "impl.hash_index", "z3"):
            assert forbidden not in text, f"{path.name} mentions {forbidden}"


def test_wheel_installs_only_the_kvpool_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)], check=True)
    (wheel,) = tmp_path.glob("kvpool-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kvpool"}
    for sub in ("model", "impl", "proofs", "oracle"):
        assert f"kvpool/{sub}/__init__.py" in names
