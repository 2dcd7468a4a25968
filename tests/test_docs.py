"""The docs say what is there: every module of the package is listed in docs/ARCHITECTURE.md.

The architecture page has one table per package folder (a heading ``### `model/` ...``)
naming each file relative to that folder; a module missing from its table, or a row naming
a file that does not exist, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
FOLDERS = ("model", "impl", "proofs", "oracle", "bugs", "kvpool")
"""The folders that install as the package ``kvpool``."""


def _tables() -> dict[str, set[str]]:
    """Per package folder, the files its table on the page names."""
    out: dict[str, set[str]] = {}
    current: str | None = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"### `([a-z_]+)/`", line)
        if heading:
            current = heading.group(1) if heading.group(1) in FOLDERS else None
            continue
        if line.startswith("### "):
            current = None
        row = re.match(r"\| `([^`]+)` \|", line)
        if current is not None and row:
            out.setdefault(current, set()).add(row.group(1))
    return out


def _files(folder: str) -> set[str]:
    base = ROOT / folder
    return {str(p.relative_to(base)) for p in base.rglob("*")
            if p.is_file() and p.suffix in (".py", ".md", ".css", ".toml", ".typed")
            and "__pycache__" not in p.parts}


def test_every_module_is_listed_and_every_listed_file_exists() -> None:
    tables = _tables()
    assert set(tables) == set(FOLDERS), f"tables on {PAGE.name}: {sorted(tables)}"
    for folder in FOLDERS:
        files, listed = _files(folder), tables[folder]
        assert not files - listed, f"{folder}/ files not on {PAGE.name}: {sorted(files - listed)}"
        gone = sorted(listed - files)
        assert not gone, f"{PAGE.name} lists {folder}/ files that do not exist: {gone}"
