"""Wrong specifications written by hand, one per kind: kept as named regressions of the judge.

Each is a small text edit of the specification: of the model only, of the z3 encoding only,
of both the same way (which no single-site mutant can be), of a caller contract (too weak or
too strong), or of the BMC's call domains.  The generated mutants (:mod:`.mutate`) are the
population the score is measured on; these are the stories the project's review told, and the
judge (:mod:`.judge`) must refute each.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Named:
    """One wrong specification: edits as (file under the repository, old text, new text)."""

    name: str
    kind: str
    """``model``, ``z3``, ``both``, ``contract`` or ``domain``."""
    story: str
    edits: tuple[tuple[str, str, str], ...]


TABLE = Path(__file__).with_name("named.toml")
"""The wrong specifications, as data: one table each, its edits as text."""


def _edits(table: dict[str, Any], name: str) -> tuple[tuple[str, str, str], ...]:
    """An entry's edits: those of the entry it is ``like`` first (the same edit of the model in a
    "both"), then its own."""
    entry = table[name]
    first = _edits(table, entry["like"]) if "like" in entry else ()
    return first + tuple((e["file"], e["old"], e["new"]) for e in entry.get("edits", []))


def load(path: Path = TABLE) -> tuple[Named, ...]:
    """Every wrong specification of the table at ``path``, in its order."""
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    return tuple(Named(name, entry["kind"], entry["story"], _edits(table, name))
                 for name, entry in table.items())


NAMED: tuple[Named, ...] = load()


def edited(named: Named, root: Path) -> dict[str, str]:
    """Each file the wrong specification changes, with its edits applied (by path under ``root``)."""
    from .mutate import source

    out: dict[str, str] = {}
    for path, old, new in named.edits:
        text = out.get(path, source(path, root))
        if text.count(old) != 1:
            raise ValueError(f"{named.name}: {path} has {text.count(old)} copies of {old!r}")
        out[path] = text.replace(old, new)
    return out


__all__ = ["NAMED", "Named", "edited"]
