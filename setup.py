"""The build: plain Python by default; ``KVPOOL_COMPILE=1`` compiles kvpool.impl with mypyc.

Everything else about the package is in ``pyproject.toml``.  The compiled build
is the same ``impl/`` source, type-checked and translated to C by mypyc (part of
mypy), so there is one pool to read, model and verify; it needs a C compiler and
Python's headers.  ``python -c "import kvpool.impl; print(kvpool.impl.COMPILED)"``
tells which build is installed.  Why and when: docs/performance.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).resolve().parent

# The modules where the pool spends its time.  Left interpreted: native.py (read by
# mypyc at build time only), errors.py (exception classes), metrics.py (a protocol)
# and request.py (a stand-in for vLLM's Request that the pool never needs).
COMPILED_MODULES = ["__init__", "block", "events", "free_queue", "hash_index", "hashing", "keys", "pool"]

# mypyc's pinned range: the build's C depends on mypyc's version (its runtime library
# is compiled into the package).  2.x: group_name, native_class=False on dataclasses.
MYPYC = "mypy>=2.0,<3"


def _compile_flag() -> bool:
    raw = os.environ.get("KVPOOL_COMPILE", "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SystemExit(f"KVPOOL_COMPILE={raw!r}: use 1 to compile kvpool.impl with mypyc, 0 not to")


def _ext_modules() -> list[Any]:
    """mypyc's extensions for kvpool.impl, built from a staged copy of impl/.

    mypyc names a module after the folders that hold it, and the source keeps the
    pool in impl/ (setuptools' package-dir maps it to kvpool.impl), so the modules
    are compiled from build/mypyc-src/kvpool/impl/.  The shared runtime goes into
    kvpool/impl__mypyc*.so, inside the package.
    """
    from mypyc.build import mypycify

    stage = ROOT / "build" / "mypyc-src"
    shutil.rmtree(stage, ignore_errors=True)
    target = stage / "kvpool" / "impl"
    target.mkdir(parents=True)
    (stage / "kvpool" / "__init__.py").write_text("")
    for source in sorted((ROOT / "impl").glob("*.py")):
        shutil.copy2(source, target / source.name)
    paths = [str((target / f"{name}.py").relative_to(ROOT)) for name in COMPILED_MODULES]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return mypycify(paths, opt_level="3", group_name="kvpool.impl", verbose=False)  # type: ignore[no-any-return]
    finally:
        os.chdir(cwd)


# setuptools stages packages in build/lib* and does not empty it: a plain build after a
# compiled one in the same checkout would ship the compiled modules.  Stage afresh.
for staged in ROOT.glob("build/lib*"):
    shutil.rmtree(staged, ignore_errors=True)

if not _compile_flag():
    setup()
else:
    try:
        import mypyc.build  # noqa: F401
    except ImportError:  # pip's first pass asks what the build needs: mypyc
        setup(setup_requires=[MYPYC])
    else:
        setup(setup_requires=[MYPYC], ext_modules=_ext_modules())
