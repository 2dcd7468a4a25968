"""What the engine's side of a shadow sends its checker: plain tuples, cheap to make and to pickle.

``("pool", n, config)``
    pool ``n`` was created (its trace header, its name, where its trace goes, what it shows);
``("req", r, fields)``, ``("grow", r, tokens, hashes)``, ``("forget", r)``
    request ``r`` seen for the first time (its tokens a list, its hashes :data:`Packed`), what it
    gained since (its new hashes :data:`Packed` too), and that it is gone;
``("call", n, op, args, result, error, events, fired, whole)``
    one call: the model's arguments (block ids, :data:`RequestRef`, watcher names,
    :data:`BlockSlice`), the pool's result (ids, event field dicts), its exception
    (class names and message), the events it queued, the watchers it fired, and
    the whole pool's raw values when a whole-pool check is due;
``("same", n, ops)``
    argument-less calls of pool ``n``, by name, each with the result and events last recorded for
    it without an error or a whole-pool check (the checker puts them to the model with those);
``("taken", n)``
    events pool ``n`` queued were taken through another pool's queue;
``("stop", n, why)``, ``("close", n, keep)``
    the shadow gave up on pool ``n``; pool ``n`` is gone (its trace kept or not);
``("sync", k)``
    answer when everything before is checked (a checker process only).
"""

from __future__ import annotations

from typing import Any

from kvpool.model import OPERATIONS

# Each record is pickled alone (its memo starts again), so a class in it costs its module's and
# its name's strings every time (a NamedTuple made a cache call's record 4x as slow to pickle):
# the parts below are plain tuples, told apart by the argument's kind or by tuple against list.

RequestRef = tuple[int, int, int]
"""A request argument: its number, and its tokens and hashes then."""

BlockSlice = tuple[int, list[int], int]
"""``(start, ids, total)``: a list of ``total`` blocks of which the pool reads only ``ids``, from
``start`` (the blocks ``cache_full_blocks`` caches); the others stand as the null block. A list of
blocks sent whole is a list."""

Packed = tuple[str, bytes]
"""``(f"{N}s", data)``: byte strings of one length ``N`` (a request's hashes) as one block of bytes.
Hashes of mixed lengths are sent as a list."""

REPEATABLE = frozenset(op for op, decl in OPERATIONS.items() if decl.role == "query" and not decl.args)
"""Queries without arguments: most of an engine's calls, recorded on a shorter path (and, as every
argument-less call, sent by name when answered as last recorded: ``same``)."""


def expand(blocks: BlockSlice | list[int]) -> list[int]:
    """A list of block ids, whole."""
    if isinstance(blocks, list):
        return blocks
    start, ids, total = blocks
    return [0] * start + ids + [0] * max(0, total - start - len(ids))


def unpack(values: Packed | list[Any]) -> list[Any]:
    """Values sent packed or as a list, as a list."""
    if isinstance(values, list):
        return list(values)
    kind, data = values
    size = int(kind[:-1])
    return [data[i:i + size] for i in range(0, len(data), size)]


__all__ = ["REPEATABLE", "BlockSlice", "Packed", "RequestRef", "expand", "unpack"]
