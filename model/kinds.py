"""What an operation's arguments are: their kinds, and the blocks a call names.

An argument's kind says enough for most of an operation's parts, so an
operation whose kinds say enough declares little more than its update
(:mod:`.operations`; the parts are derived in :mod:`.derived`): its guard
checks each argument by its kind, its footprint and its split are about the
blocks its block arguments name (:func:`named_blocks`), and its calls on a
small pool are every combination of a few values per kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

ArgKind = Literal["count", "block", "blocks", "block_ids", "request", "watcher", "hash", "group",
                  "groups", "size", "tokens", "tokens?", "flag", "mask?"]
"""What an argument is.  ``block``/``blocks`` are block ids the pool receives as its block objects;
``block_ids`` stay ids; ``count``, ``size`` (a block size) and ``tokens`` (a token count) are ints;
``group``/``groups`` KV-cache group ids; ``hash`` a block hash; ``mask?`` a list of bools or None."""

REQUIRED = object()
"""The default of an argument that has none."""


@dataclass(frozen=True)
class Arg:
    """One argument: its name (the model's parameter name, which traces use), its kind and its default."""

    name: str
    kind: ArgKind
    default: Any = REQUIRED

    @property
    def optional(self) -> bool:
        return self.default is not REQUIRED


BLOCK_KINDS: frozenset[str] = frozenset({"block", "blocks", "block_ids"})
"""The kinds that name blocks of the pool."""


def filled(args: Sequence[Arg], values: Sequence[Any]) -> tuple[Any, ...]:
    """``values`` with the defaults of the optional arguments left out filled in."""
    rest = tuple(a.default for a in args[len(values):])
    if REQUIRED in rest or len(values) > len(args):
        raise TypeError(f"{len(values)} argument(s) given for {[a.name for a in args]}")
    return (*values, *rest)


def named_blocks(args: Sequence[Arg], values: Sequence[Any]) -> list[Any]:
    """The block ids a call names: its block arguments' in declared order, a list's in list order."""
    pairs = zip(args, filled(args, values), strict=True)
    return [b for a, v in pairs if a.kind in BLOCK_KINDS for b in ([v] if a.kind == "block" else v)]
