"""Router profiles on the replayed traffic: what each would route wrongly, request by request.

Each profile (:mod:`kvpool.oracle.events.routers`) reads the run's KV events
as they are published (at the end of each step, as a router receives them).
When a request is admitted for the first time, each profile is asked how many
of its leading blocks the engine holds, and its answer (capped as the engine
caps a hit: all but the last token) is set against what the pool served: more
is an over-claim (a request routed there for its cache misses), fewer an
under-claim (a hit given away).  Tallied in requests and prompt tokens.
"""

from __future__ import annotations

from typing import Any

from ..events.check import Position
from ..events.routers import profile_factory, query_of
from ..events.routers.base import Profile
from .run import Replay, RouterTally


class RouterWatch:
    """Every ``--router`` profile of one run."""

    def __init__(self, names: list[str], block_size: int, replay: Replay) -> None:
        self.block_size = block_size
        self.profiles: list[tuple[RouterTally, Profile]] = []
        for spec in names:
            name, factory = profile_factory(spec)
            tally = replay.add_router(name)
            self.profiles.append((tally, factory({0: block_size})))

    def feed(self, events: list[dict[str, Any]], step: int) -> None:
        """One step's events, in the trace's JSON form."""
        for i, event in enumerate(events):
            pos = Position(step, i)
            for tally, profile in self.profiles:
                tally.reactions += len(profile.feed(event, pos))

    def admitted(self, request: Any, served: int, cap: int, step: int) -> None:
        """A request's first admission: ``served`` leading blocks were hits, at most ``cap`` could be."""
        bs = self.block_size
        query = query_of(request, 0, bs, bs)
        for tally, profile in self.profiles:
            tally.queries += 1
            claimed = min(profile.prefix(query), cap)
            if claimed > served:
                tally.over_requests += 1
                tally.over_tokens += (claimed - served) * bs
            elif claimed < served:
                tally.under_requests += 1
                tally.under_tokens += (served - claimed) * bs


__all__ = ["RouterWatch"]
