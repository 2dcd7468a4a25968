"""Finite interpretations: a model state as the encoding sees it, over finite carriers.

A ``Block`` is an int (``NULL`` is 0), a ``Key`` or a ``Content`` an index into
:attr:`Carriers.keys` / :attr:`Carriers.contents` (``EMPTY`` is ``()``); an array over
``Block`` or ``Key`` is a tuple, a two-place Boolean array (a relation such as ``idx``) the
frozenset of the index pairs where it is true.  Cells the model leaves undefined are ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import Content as ModelContent
from kvpool.model.request import extends
from kvpool.model.state import Key as ModelKey
from kvpool.model.state import PoolState

from ..concrete import mentioned
from ..symbolic import FIELDS
from .runtime import defined

UNDEFINED_CELLS = ("pkey", "ptok", "names", "pos")
"""Fields whose cells the model leaves undefined somewhere (``None`` in an interpretation)."""


@dataclass(frozen=True)
class Carriers:
    """The finite carriers: blocks ``0 .. num_blocks-1``, the keys and contents, by index."""

    num_blocks: int
    keys: tuple[ModelKey, ...]
    contents: tuple[ModelContent, ...]
    key_id: Mapping[ModelKey, int] = field(repr=False, compare=False)
    content_id: Mapping[ModelContent, int] = field(repr=False, compare=False)

    @classmethod
    def of(cls, num_blocks: int, keys: Iterable[ModelKey],
           contents: Iterable[ModelContent]) -> Carriers:
        """Every key and content given (the empty prefix always among the contents), in a fixed order."""
        ks = tuple(sorted(set(keys)))
        cs = tuple(sorted({EMPTY_PREFIX, *contents}, key=repr))
        return cls(num_blocks, ks, cs, {k: i for i, k in enumerate(ks)},
                   {c: i for i, c in enumerate(cs)})

    @classmethod
    def covering(cls, states: Sequence[PoolState], keys: Iterable[ModelKey] = (),
                 contents: Iterable[ModelContent] = ()) -> Carriers:
        """Every key and content the states (and the extra values) mention."""
        all_keys, all_contents = mentioned(states, keys, contents)
        return cls.of(states[0].num_blocks, all_keys, all_contents)

    def prefix_table(self) -> tuple[tuple[bool, ...], ...]:
        """``prefix(a, b)`` for every pair of contents: ``a`` is a prefix of ``b``."""
        return tuple(tuple(extends(b, a) for b in self.contents) for a in self.contents)


class Interp(NamedTuple):
    """A concrete :class:`~kvpool.proofs.symbolic.SymState`: one value per field, same names."""

    ref: tuple[int, ...]
    free: tuple[bool, ...]
    prim: tuple[bool, ...]
    pkey: tuple[int | None, ...]
    ptok: tuple[int | None, ...]
    sec: frozenset[tuple[int, int]]
    """(block, key) pairs."""
    idx: frozenset[tuple[int, int]]
    """(key, block) pairs."""
    watched: tuple[bool, ...]
    holds: tuple[int, ...]
    names: tuple[int | None, ...]
    holders: tuple[int, ...]
    live: frozenset[tuple[int, int]]
    """(key, block) pairs."""
    events: bool
    caching: bool
    hbs: int


assert Interp._fields == FIELDS, "Interp must list SymState's fields in order"


def abstract(d: Carriers, s: PoolState) -> Interp:
    """The model state as the encoding sees it (:func:`kvpool.proofs.concrete.encode`'s facts).

    The free queue becomes a set, the index and the secondary keys relations:
    order and duplicates are gone, as in the encoding.  Undefined cells are ``None``.
    """
    kid, cid = d.key_id, d.content_id
    free = set(s.free)
    n = s.num_blocks
    return Interp(
        ref=tuple(s.ref),
        free=tuple(b in free for b in range(n)),
        prim=tuple(p is not None for p in s.primary),
        pkey=tuple(None if p is None else kid[p.key] for p in s.primary),
        ptok=tuple(None if p is None else p.num_tokens for p in s.primary),
        sec=frozenset((b, kid[k]) for b in range(n) for k in s.secondary[b]),
        idx=frozenset((kid[k], b) for k, bs in s.index.items() for b in bs),
        watched=tuple(b in s.watchers for b in range(n)),
        holds=tuple(cid[c] for c in s.holds),
        names=names_of(d, s),
        holders=tuple(s.holders),
        live=frozenset((kid[k], b) for k, b in s.announced),
        events=s.events_on,
        caching=s.caching,
        hbs=s.hash_block_size,
    )


def names_of(d: Carriers, s: PoolState) -> tuple[int | None, ...]:
    """The content each key names (``None``: the model names none)."""
    names: list[int | None] = [None] * len(d.keys)
    for k, c in s.names.items():
        names[d.key_id[k]] = d.content_id[c]
    return tuple(names)


class QInterp(NamedTuple):
    """A concrete :class:`~kvpool.proofs.order.QState`: the queue as places, same field names."""

    ref: tuple[int, ...]
    free: tuple[bool, ...]
    cached: tuple[bool, ...]
    pos: tuple[int | None, ...]
    """The place of each queued block; ``None`` (undefined) for the others."""
    lo: int
    hi: int
    head: int
    gap: int


def queue_of(s: PoolState) -> QInterp:
    """The model's queue as places ``0 .. len - 1``, head first; no reservation pending."""
    place = {b: i for i, b in enumerate(s.free)}
    n = s.num_blocks
    return QInterp(tuple(s.ref), tuple(b in place for b in range(n)),
                   tuple(s.caching and s.primary[b] is not None for b in range(n)),
                   tuple(place.get(b) for b in range(n)), 0, len(place), 0, 0)


def queue_order(q: QInterp) -> tuple[int, ...]:
    """The queued blocks in the order of their places (head first)."""
    queued = [b for b, f in enumerate(q.free) if f]
    return tuple(sorted(queued, key=lambda b: defined(q.pos[b])))
