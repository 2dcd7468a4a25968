"""The docs say what is there: every file of the package and every tracked source file is on
docs/ARCHITECTURE.md, and the path a call takes names only what exists.

The architecture page has one table per folder (a heading ``### `model/` ...``) naming each
file relative to that folder, and the table under ``### Outside the package`` naming paths
from the top.  A package module, or a tracked ``.py`` or ``.rs`` file outside ``tests/``,
missing from its table fails here, and so does a row naming a file that does not exist.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
FOLDERS = ("model", "impl", "proofs", "oracle", "bugs", "kvpool")
"""The folders that install as the package ``kvpool``."""
SOURCES = (".py", ".rs")
NOT_SOURCE = ("tests", "fuzz/corpus", "build", ".venv", "target", "kvpool.egg-info")
"""Where a walk (outside a git checkout) finds no file of the project's own."""


def _listed(text: str) -> tuple[set[str], set[str]]:
    """The paths (from the top) the page's tables name, and the package folders that have a table."""
    paths: set[str] = set()
    tables: set[str] = set()
    base: str | None = None
    for line in text.splitlines():
        heading = re.match(r"### `([A-Za-z0-9_./-]+)/`", line)
        if heading:
            base = heading.group(1) + "/"
            tables.add(heading.group(1))
            continue
        if line.startswith("### "):
            base = "" if line.strip() == "### Outside the package" else None
            continue
        row = re.match(r"\| `([^`]+)` \|", line)
        if base is not None and row:
            paths.add(base + row.group(1))
    return paths, tables & set(FOLDERS)


def _package_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for folder in FOLDERS for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in (".py", ".md", ".css", ".toml", ".typed")
            and "__pycache__" not in p.parts}


def _sources() -> set[str]:
    """The tracked ``.py`` and ``.rs`` files outside ``tests/`` (a walk where git cannot say)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", *(f"*{s}" for s in SOURCES)], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        found = {f for f in out.split("\0") if f}
    except (OSError, subprocess.CalledProcessError):
        found = {str(p.relative_to(ROOT)) for s in SOURCES for p in ROOT.rglob(f"*{s}")}
    return {f for f in found
            if not any(f == d or f.startswith(d + "/") for d in NOT_SOURCE)
            and "__pycache__" not in f}


def _missing_and_gone(text: str) -> tuple[list[str], list[str]]:
    listed, _ = _listed(text)
    files = _package_files() | _sources()
    gone = [p for p in listed if not p.endswith("/") and not (ROOT / p).exists()]
    return sorted(files - listed), sorted(gone)


def test_every_module_is_listed_and_every_listed_file_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert _listed(text)[1] == set(FOLDERS), f"package tables on {PAGE.name}: {_listed(text)[1]}"
    missing, gone = _missing_and_gone(text)
    assert not missing, f"files not on {PAGE.name}: {missing}"
    assert not gone, f"{PAGE.name} lists files that do not exist: {gone}"


def test_the_check_fails_on_a_missing_row_and_on_a_row_of_no_file() -> None:
    """The completeness check can fail both ways, outside the package as well as inside it."""
    text = PAGE.read_text(encoding="utf-8")
    for row in ("| `lockstep_speed.py` |", "| `src/pool.rs` |", "| `core/lockstep.py` |",
                "| `setup.py` |"):
        assert row in text, row
        lines = [line for line in text.splitlines() if not line.startswith(row)]
        missing, _ = _missing_and_gone("\n".join(lines))
        assert len(missing) == 1, (row, missing)
    extra = text.replace("| `soak.py` |", "| `soak.py` |\n| `no_such_benchmark.py` | gone |", 1)
    assert _missing_and_gone(extra)[1] == ["benchmarks/no_such_benchmark.py"]


# ------------------------------------------------------------------ the path a call takes


def _path_section(text: str) -> str:
    start = text.index("## The path a call takes")
    return text[start:text.index("\n## ", start + 1)]


def _defined(path: Path, name: str) -> bool:
    """Whether ``name`` (``f``, ``Class`` or ``Class.method``) is defined at the top of ``path``."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in name.split("."):
        names: dict[str, ast.stmt] = {}
        for node in scope:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, ast.Assign):
                names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        found = names.get(part)
        if found is None:
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _unknown_names(section: str) -> list[str]:
    """The ``file.py`` and ``file.py:name`` references of ``section`` that name nothing."""
    wrong = []
    for ref in re.findall(r"`([A-Za-z0-9_/]+\.py(?::[A-Za-z_][A-Za-z0-9_.]*)?)`", section):
        file, _, name = ref.partition(":")
        if not (ROOT / file).is_file() or (name and not _defined(ROOT / file, name)):
            wrong.append(ref)
    return wrong


def test_the_path_a_call_takes_names_modules_and_functions_that_exist() -> None:
    section = _path_section(PAGE.read_text(encoding="utf-8"))
    refs = re.findall(r"`([A-Za-z0-9_/]+\.py:[A-Za-z_][A-Za-z0-9_.]*)`", section)
    layers = {ref.split("/")[0] for ref in refs}
    assert {"kvpool", "oracle", "model"} <= layers, layers  # the face, the oracle, the model
    assert len(refs) >= 15, refs
    assert _unknown_names(section) == []
    # and the check fails on a name that is not there, or a module that is not
    assert _unknown_names("`model/pool.py:no_such_update` `model/guards.py:free_blocks`") == [
        "model/pool.py:no_such_update"]
    assert _unknown_names("`oracle/core/lockstep.py:Lockstep.no_such` `oracle/nowhere.py`") == [
        "oracle/core/lockstep.py:Lockstep.no_such", "oracle/nowhere.py"]
