"""A concrete model state as a finite z3 interpretation, to test the encoding.

The proofs are only about the pool if :mod:`.transitions` computes what
:mod:`kvpool.model.actions` computes.  :func:`encode` pins a symbolic state to
a concrete :class:`~kvpool.model.state.PoolState` over a finite
:class:`Universe` (block ``i`` is an element, block 0 is ``NULL``, each key and
content is an element, ``()`` is ``EMPTY``, ``prefix`` is the real prefix
relation); :func:`compare` then decides, with quantifiers grounded over the
universe, whether a step is enabled there and whether its result is exactly
the model's next state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import z3  # type: ignore[import-untyped]

from kvpool.model.request import EMPTY as EMPTY_PREFIX
from kvpool.model.request import Content as ModelContent
from kvpool.model.request import extends
from kvpool.model.state import Key as ModelKey
from kvpool.model.state import PoolState

from .finite import ground
from .symbolic import EMPTY, NULL, Block, Content, Expr, KeySort, SymState, prefix
from .transitions import STEPS


def mentioned(states: Iterable[PoolState], keys: Iterable[ModelKey] = (),
              contents: Iterable[ModelContent] = ()) -> tuple[set[ModelKey], set[ModelContent]]:
    """Every key and content the states (and the extra values) mention."""
    all_keys, all_contents = set(keys), set(contents)
    for st in states:
        all_keys |= set(st.index) | set(st.names)
        all_keys |= {p.key for p in st.primary if p is not None}
        all_keys |= {k for keys_b in st.secondary for k in keys_b}
        all_keys |= {k for k, _b in st.announced}
        all_contents |= set(st.holds) | set(st.names.values())
    return all_keys, all_contents


@dataclass(frozen=True)
class Universe:
    """The finite carriers: one z3 element per block id, key and content."""

    blocks: list[Expr]
    keys: dict[ModelKey, Expr]
    contents: dict[ModelContent, Expr]

    @classmethod
    def of(cls, states: Iterable[PoolState], keys: Iterable[ModelKey] = (),
           contents: Iterable[ModelContent] = ()) -> Universe:
        """Every block, key and content the states (and extra arguments) mention."""
        states = list(states)
        all_keys, all_contents = mentioned(states, keys, contents)
        return cls(
            blocks=[NULL, *[z3.Const(f"blk{i}", Block) for i in range(1, states[0].num_blocks)]],
            keys={k: z3.Const(f"key{i}", KeySort) for i, k in enumerate(sorted(all_keys))},
            contents={c: (EMPTY if c is EMPTY_PREFIX else z3.Const(f"cnt{i}", Content))
                      for i, c in enumerate(sorted(all_contents | {EMPTY_PREFIX}, key=repr))})

    def domain(self) -> dict[str, list[Expr]]:
        """The carriers by sort name, for :func:`kvpool.proofs.finite.ground`."""
        return {str(Block): self.blocks, str(KeySort): list(self.keys.values()),
                str(Content): list(self.contents.values())}

    def axioms(self) -> list[Expr]:
        """Elements are distinct, and ``prefix`` is the real prefix relation on them."""
        out = [z3.Distinct(*self.blocks)]
        if len(self.keys) > 1:
            out.append(z3.Distinct(*self.keys.values()))
        if len(self.contents) > 1:
            out.append(z3.Distinct(*self.contents.values()))
        return out + [prefix(ea, eb) == extends(b, a)
                      for a, ea in self.contents.items() for b, eb in self.contents.items()]


def encode(u: Universe, m: PoolState, s: SymState) -> list[Expr]:
    """Facts pinning every variable of ``s`` to ``m`` on the universe.

    Left free, as the model leaves them undefined: ``pkey``/``ptok`` of an
    unhashed block and ``names`` of a key never named.
    """
    free = set(m.free)
    out = [s.caching == m.caching, s.hbs == m.hash_block_size, s.events == m.events_on]
    for i, b in enumerate(u.blocks):
        p = m.primary[i]
        out += [
            s.ref[b] == m.ref[i],
            s.free[b] == (i in free),
            s.prim[b] == (p is not None),
            s.watched[b] == (i in m.watchers),
            s.holds[b] == u.contents[m.holds[i]],
            s.holders[b] == m.holders[i],
        ]
        if p is not None:
            out += [s.pkey[b] == u.keys[p.key], s.ptok[b] == p.num_tokens]
        for k, ek in u.keys.items():
            out += [s.sec[b, ek] == (k in m.secondary[i]), s.idx[ek, b] == (i in m.index.get(k, ())),
                    s.live[ek, b] == ((k, i) in m.announced)]
    for k, c in m.names.items():
        out.append(s.names[u.keys[k]] == u.contents[c])
    return out


@dataclass(frozen=True)
class Verdict:
    """How a step relates to one concrete model call."""

    enabled: bool
    """The precondition holds in the encoded state."""
    agrees: bool
    """Whenever enabled, the step's result is exactly the model's next state."""


def _sat(facts: list[Expr]) -> bool:
    solver = z3.Solver()
    solver.set("timeout", 10_000)
    solver.add(*facts)
    verdict = solver.check()
    if verdict == z3.unknown:
        raise RuntimeError(f"z3 gave up on a finite instance: {solver.reason_unknown()}")
    return bool(verdict == z3.sat)


def compare(u: Universe, before: PoolState, after: PoolState | None, step: str,
            args: list[Expr]) -> Verdict:
    """Evaluate ``step(args)`` on ``before``; ``after`` is the model's result (``None``: refused)."""
    return compare_batch(u, before, after, [(step, args)])


def compare_batch(u: Universe, before: PoolState, after: PoolState | None,
                  calls: list[tuple[str, list[Expr]]]) -> Verdict:
    """Evaluate a SEQUENCE of steps on ``before`` against one model call (a batch).

    Enabled means every step's precondition holds in the state the earlier
    steps produced: the decomposition the proofs' induction relies on.
    """
    cur = s = SymState.fresh("c")
    pres = []
    for step, args in calls:
        st = STEPS[step].fn(cur, *args)
        pres.append(st.pre)
        cur = st.post
    dom = u.domain()
    memo: dict[int, tuple[Expr, Expr]] = {}
    base = [*u.axioms(), *encode(u, before, s), *[ground(p, dom, memo) for p in pres]]
    if not (enabled := _sat(base)) or after is None:
        return Verdict(enabled, True)
    expected = [ground(f, dom, memo) for f in encode(u, after, cur)]
    return Verdict(True, not _sat([*base, z3.Not(z3.And(*expected))]))
