"""mypyc's class options and native integer type, which change nothing when this package
runs as plain Python.

``KVPOOL_COMPILE=1 pip install .`` compiles this package with mypyc (``setup.py``),
except this module: mypyc reads ``mypyc_attr`` at build time, so the compiled
modules never call it, and the plain build must not need ``mypy_extensions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import i64, mypyc_attr
else:

    def mypyc_attr(*_flags: Any, **_options: Any) -> Any:
        """Interpreted, a class keeps every Python ability these options grant it compiled."""
        return lambda cls: cls

    # A 64-bit machine integer when compiled (mypyc reads the annotation); interpreted, an int.
    i64 = int


__all__ = ["i64", "mypyc_attr"]
