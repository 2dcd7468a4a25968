"""Packaging: one import package, with every subpackage (the layers: tests/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    # The default build is plain Python: no compiled module (KVPOOL_COMPILE=1 makes them).
    assert [n for n in names if n.endswith(".so")] == []
    for init in sorted({*ROOT.glob("*/__init__.py"), *ROOT.glob("*/*/__init__.py")}):
        rel = init.relative_to(ROOT)
        if rel.parts[0] in ("kvpool", "model", "impl", "proofs", "oracle", "bugs"):
            inside = rel if rel.parts[0] == "kvpool" else Path("kvpool", *rel.parts)
            assert inside.as_posix() in names, f"{inside} is not in the wheel"
