"""What the engine's side of a shadow sends its checker: plain tuples, cheap to make and to pickle.

``("pool", n, config)``
    pool ``n`` was created (its trace header, its name, where its trace goes, what it shows);
``("req", r, fields)``, ``("grow", r, tokens, hashes)``, ``("forget", r)``
    request ``r`` seen for the first time (its tokens and hashes :class:`Packed`), what it
    gained since (its new hashes :class:`Packed` too), and that it is gone;
``("call", n, op, args, result, error, events, fired, whole)``
    one call: the model's arguments (block ids, :class:`RequestRef`, watcher names,
    :class:`BlockSlice`), the pool's result (ids, event field dicts), its exception
    (class names and message), the events it queued, the watchers it fired, and
    the whole pool's raw values when a whole-pool check is due;
``("taken", n)``
    events pool ``n`` queued were taken through another pool's queue;
``("stop", n, why)``, ``("close", n, keep)``
    the shadow gave up on pool ``n``; pool ``n`` is gone (its trace kept or not);
``("sync", k)``
    answer when everything before is checked (a checker process only).
"""

from __future__ import annotations

import array
from typing import Any, NamedTuple


class RequestRef(NamedTuple):
    """A request argument: its number, and how long it was then."""

    number: int
    tokens: int
    hashes: int


class BlockSlice(NamedTuple):
    """A list of blocks of which the pool reads only ``[start, start + len(ids))`` (the blocks
    ``cache_full_blocks`` caches): the others are sent as the null block."""

    start: int
    ids: list[int]
    total: int

    def expand(self) -> list[int]:
        return [0] * self.start + self.ids + [0] * max(0, self.total - self.start - len(self.ids))


class Packed(NamedTuple):
    """Values of one kind as one block of bytes: ``i`` or ``q`` (32- or 64-bit ints) or ``Ns``
    (``N`` bytes each)."""

    kind: str
    data: bytes

    def unpack(self) -> list[Any]:
        if self.kind in ("i", "q"):
            return array.array(self.kind, self.data).tolist()
        size = int(self.kind[:-1])
        return [self.data[i:i + size] for i in range(0, len(self.data), size)]


__all__ = ["BlockSlice", "Packed", "RequestRef"]
