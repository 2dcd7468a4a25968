"""The layer rule (docs/ARCHITECTURE.md): what import-linter checks, and what it cannot.

``scripts/lint-imports.sh`` runs the contracts of ``[tool.importlinter]`` in
``pyproject.toml`` (``.ci/run`` runs it).  Here: the linter refuses a seeded
violation of each kind of contract, so a contract that could never fail is
noticed; the model imports only the standard library (the linter can only
forbid third-party modules by name); and no private name crosses a package.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kvpool": ROOT / "kvpool", "kvpool.model": ROOT / "model", "kvpool.impl": ROOT / "impl",
            "kvpool.proofs": ROOT / "proofs", "kvpool.oracle": ROOT / "oracle"}
if (ROOT / "bugs").is_dir():
    PACKAGES["kvpool.bugs"] = ROOT / "bugs"


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, and its source file."""
    out = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if name == "kvpool" and parts and parts[0] in ("model", "impl", "proofs", "oracle", "bugs"):
                continue
            out[".".join((name, *parts))] = path
    return out


def _imports(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [alias.name for alias in node.names]))
    return out


def _package_of(module: str) -> str:
    return ".".join(module.split(".")[:2]) if module.startswith("kvpool.") else module


def _type_checking_imports(path: Path) -> set[str]:
    """Modules imported only under ``if TYPE_CHECKING:`` (never at run time)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and not inner.level and inner.module:
                    out.add(inner.module)
    return out


@pytest.mark.parametrize("package", ["kvpool.model", "kvpool.impl"])
def test_the_model_and_the_pool_import_only_the_standard_library_and_themselves(package: str) -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    # The pool's mypyc class options (impl/native.py) are read at build time only.
    build_only = {"mypy_extensions"} if package == "kvpool.impl" else set()
    for module, path in _modules().items():
        if not module.startswith(package):
            continue
        typing_only = _type_checking_imports(path) & build_only
        for imported, _names in _imports(path, module):
            top = imported.split(".")[0]
            assert top in stdlib or imported.startswith(package) or imported in typing_only, \
                f"{module} imports {imported}"


def test_the_type_checking_only_import_rule_sees_a_run_time_import(tmp_path: Path) -> None:
    """The exception above covers an import under ``if TYPE_CHECKING:`` only."""
    guarded, plain = tmp_path / "guarded.py", tmp_path / "plain.py"
    guarded.write_text("if TYPE_CHECKING:\n    from mypy_extensions import mypyc_attr\n")
    plain.write_text("from mypy_extensions import mypyc_attr\n")
    assert _type_checking_imports(guarded) == {"mypy_extensions"}
    assert _type_checking_imports(plain) == set()


@pytest.mark.parametrize("package", ["kvpool.model", "kvpool.impl"])
def test_no_check_of_the_pool_or_the_model_is_an_assert(package: str) -> None:
    """``python -O`` drops ``assert``: none may guard an input or a state."""
    for module, path in _modules().items():
        if module.startswith(package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]
            assert not lines, f"{path}: assert at line(s) {lines}"


_IMPORT_GROUP = ("#", "from ", "import ", "try:", ")")
"""The lines of a group of imports (and their comment) above an import."""


def _unexplained_local_imports(source: str) -> list[int]:
    """Lines of imports inside a function with no comment on them or just above their group."""
    lines = source.splitlines()
    bare = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            row = node.lineno - 1
            said = "#" in lines[row]
            while not said and row > 0 and lines[row - 1].strip().startswith(_IMPORT_GROUP):
                row -= 1
                said = lines[row].strip().startswith("#")
            if not said:
                bare.append(node.lineno)
    return bare


def test_every_import_inside_a_function_says_why() -> None:
    """An import is at the top of its module unless a comment says why not (docs/ARCHITECTURE.md)."""
    sources = [*_modules().values(), *(ROOT / "fuzz").glob("*.py")]
    bare = {str(p.relative_to(ROOT)): lines for p in sources
            if (lines := _unexplained_local_imports(p.read_text(encoding="utf-8")))}
    assert bare == {}


def test_the_local_import_rule_sees_a_bare_import() -> None:
    seeded = "def f() -> None:\n    x = 1\n    import json\n\n\ndef g() -> None:\n    import os  # why\n"
    assert _unexplained_local_imports(seeded) == [3]


def test_no_private_name_crosses_a_package() -> None:
    modules = _modules()
    crossings = []
    for module, path in modules.items():
        for imported, names in _imports(path, module):
            if not imported.startswith("kvpool") or _package_of(imported) == _package_of(module):
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if imported.split(".")[-1].startswith("_") or private:
                crossings.append(f"{module}: from {imported} import {', '.join(private) or '*'}")
    assert crossings == []


def _stage(tmp_path: Path) -> Path:
    """The package as it installs, copied, so that a violation can be seeded into it."""
    stage = tmp_path / "stage"
    shutil.copytree(ROOT / "kvpool", stage / "kvpool", ignore=shutil.ignore_patterns("__pycache__"))
    for name, folder in PACKAGES.items():
        if name != "kvpool":
            shutil.copytree(folder, stage / "kvpool" / name.split(".")[1],
                            ignore=shutil.ignore_patterns("__pycache__"))
    return stage


def _lint(stage: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run([lint, str(ROOT / "pyproject.toml"), "--no-cache"], cwd=stage,
                          env={"PYTHONPATH": str(stage), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("target", "line", "contract"), [
    ("model/state.py", "import kvpool.impl.keys", "Layers"),
    ("model/state.py", "import z3", "The model and the pool are plain Python"),
    ("impl/pool.py", "import kvpool.model", "Layers"),
    ("proofs/finite.py", "import kvpool.oracle.core.observe", "Layers"),
    ("proofs/finite.py", "import kvpool.impl.pool", "The proofs are about the model"),
    ("oracle/core/abstraction.py", "import kvpool.impl.keys", "The oracle compares through its own"),
    ("oracle/core/lockstep.py", "import kvpool.pictures", "Layers"),
])
def test_the_linter_refuses_a_seeded_violation(tmp_path: Path, target: str, line: str,
                                                contract: str) -> None:
    if shutil.which("lint-imports") is None and not (Path(sys.executable).parent / "lint-imports").exists():
        pytest.skip("import-linter is not installed")
    stage = _stage(tmp_path)
    path = stage / "kvpool" / target
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # seeded\n", encoding="utf-8")
    done = _lint(stage)
    assert done.returncode == 1, done.stdout + done.stderr
    importer = "kvpool." + target.removesuffix(".py").replace("/", ".")
    imported = line.split()[-1]
    broken = done.stdout.split("Broken contracts")[-1]
    assert contract in broken and f"{importer} -> {imported}" in broken, done.stdout


def test_every_slow_case_names_a_collected_case() -> None:
    """conftest.SLOW_CASES names cases by id, SAMPLED tests by name: a renamed one would silently
    run by default again."""
    from conftest import SAMPLED, SLOW_CASES  # tests are no package: conftest.py's folder is on sys.path

    # -P: the checkout's kvpool/ folder (the face alone) must not shadow the installed package.
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-m", "slow",
                           "-p", "no:cacheprovider", str(ROOT / "tests")],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    collected = {line.removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line}
    assert collected, done.stdout + done.stderr
    assert not [case for case in SLOW_CASES if case not in collected]
    sampled = {case.partition("[")[0] for case in collected}
    assert not [test for test in SAMPLED if test not in sampled]
