"""Shards: one run's work split among ``N`` runners, each told ``--shard I/N`` (``1 <= I <= N``).

What shard ``I`` of ``N`` does in each phase (``docs/scale.md``):

* ``proofs``, ``agreement``, ``traces``: run whole by one shard each, the
  ``k``-th of these phases by shard ``k mod N + 1`` (proofs on shard 1,
  agreement on shard 2, traces on shard 3); the other shards mark them
  ``elsewhere``;
* ``seeded-bugs``: the ``i``-th bug of the catalogue (all its forms) when
  ``i mod N == I - 1``;
* ``lockstep``: the ``r``-th run (seed ``seed + r``) when ``r mod N == I - 1``;
* ``refinement``: the ``j``-th pool of the budget when ``j mod N == I - 1``;
* ``bmc``: every pool, as part ``I`` of ``N`` of its search
  (:func:`kvpool.proofs.bmc.explore`'s ``part``): the levels up to the split
  depth in full, then every ``N``-th state of that level, sorted by digest;
* ``conformance``: the campaign's runs as the lockstep's; the state machine's
  examples shared out (``examples // N``, one more for the first
  ``examples mod N`` shards), each shard with its own Hypothesis seed
  (:class:`kvpool.oracle.search.conform.Options`).

``kvpool merge`` (:mod:`.merge`) joins the shards' documents into the
document of one run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WHOLE = ("proofs", "agreement", "traces")
"""Phases one shard runs whole; the ``k``-th goes to shard ``k mod N + 1``."""


class ShardError(ValueError):
    """A ``--shard`` that names no shard (not ``I/N`` with ``1 <= I <= N``)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``; ``Shard(1, 1)`` is the whole run."""

    index: int = 1
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` with ``1 <= I <= N``; anything else raises :class:`ShardError`."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if m is None:
            raise ShardError(f"{text!r}: expected I/N, e.g. 1/4")
        index, count = int(m.group(1)), int(m.group(2))
        if count < 1 or not 1 <= index <= count:
            raise ShardError(f"{text!r}: need 1 <= I <= N")
        return cls(index, count)

    @property
    def whole(self) -> bool:
        """The only shard: the run is not split."""
        return self.count == 1

    @property
    def part(self) -> tuple[int, int]:
        """``(index from 0, count)``, as the oracle and the BMC take it."""
        return self.index - 1, self.count

    def takes(self, i: int) -> bool:
        """Whether the ``i``-th item (from 0) of a split list is this shard's."""
        return i % self.count == self.index - 1

    def owner(self, phase: str) -> int:
        """The shard (1-based) that runs ``phase`` whole (a phase of :data:`WHOLE`)."""
        return WHOLE.index(phase) % self.count + 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


__all__ = ["WHOLE", "Shard", "ShardError"]
