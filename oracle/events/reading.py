"""One engine's stream read by every reader at once, event by event: the rules, the warnings, the routers.

``check-events`` (a file) and ``kvpool watch`` (the wire) both feed a
:class:`Reading`, an event at a time, so that a capture replayed gives the
findings the live watcher gave, at the same positions.  The profiles start
once group 0's full block size is known (declared, or learned by the
checker; at the latest after :data:`STARTUP` events), as a router is
configured with its block size: the events before are held and fed then.

Memory stays the engine's: the checker bounds its own state
(:mod:`.online`); keys it retires (removed, cleared, forgotten) queue here,
and past ``history`` of them a key no group holds any more is forgotten by
every profile too (:meth:`~.routers.base.Profile.forget`).  After a restart
with lost batches the checker marks the events that rest on what it cannot
see; a profile's reaction to such an event is counted as *not judged*, not
reported: the profile (restarted empty) lacks what the real router holds.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from .kinds import Key, Position, Violation
from .online import HISTORY, Facts, StreamChecker
from .routers.base import Profile, Reaction
from .routers.check import Factory, RouterReport

STARTUP = 4_096
"""Events held for the router profiles until group 0's full block size is known."""
TRIM = 1_024
"""Events between two trims of the profiles' bounded memories."""


class Finding(NamedTuple):
    """What a reading reports, as it reads: a violation, a warning, or a profile's reaction."""

    kind: str  # "violation" | "warning" | "reaction"
    rule: str
    position: Position
    message: str
    profile: str | None = None
    reaction: str | None = None
    """For a reaction: its kind (``dropped-store``, ``unhandled``, ... :data:`~.routers.REACTION_KINDS`)."""


Sink = Callable[[Finding], None]


class Reading:
    """The checker and the router profiles over one engine's events; findings to ``sink``, or kept
    (``sink`` None: a file's reports, :meth:`reports`)."""

    def __init__(self, name: str, block_sizes: dict[int, int] | None = None,
                 profiles: Sequence[tuple[str, Factory]] = (), *, facts: Facts | None = None,
                 history: int = HISTORY, sink: Sink | None = None):
        self.name = name
        self.declared = dict(block_sizes or {})
        self.specs = list(profiles)
        self.history = history
        self.sink = sink
        keep = sink is None
        self.checker = StreamChecker(
            block_sizes, facts=facts, history=history,
            on_violation=None if keep else partial(self._found, "violation"),
            on_warning=None if keep else partial(self._found, "warning"),
            retire=self._retire if self.specs else None)
        self.routers = [RouterReport(spec, name) for spec, _ in self.specs]
        self.profiles: list[Profile] | None = None
        self._feeds: list[tuple[RouterReport, Callable[[dict[str, Any], Position], list[Reaction]]]] = []
        self.held: deque[tuple[dict[str, Any], Position, bool]] = deque()
        self.retired: OrderedDict[Key, None] = OrderedDict()
        """Keys retired, oldest first (an OrderedDict: its oldest is found at once, see online.py)."""
        self.fed = 0

    # ------------------------------------------------------------------ findings

    def _found(self, kind: str, v: Violation) -> None:
        if self.sink is not None:
            self.sink(Finding(kind, v.rule, v.position, v.message))

    def _reacted(self, report: RouterReport, reactions: list[Reaction], blind: bool) -> None:
        if blind:
            report.unjudged += len(reactions)
        elif self.sink is None:
            report.reactions += [(r, None) for r in reactions]
        else:
            report.reacted += len(reactions)
            for r in reactions:
                self.sink(Finding("reaction", r.rule, r.position, r.message, report.profile, r.kind))

    # ------------------------------------------------------------------ the stream

    def feed(self, event: dict[str, Any], pos: Position) -> None:
        """One validated event, through the checker and (once started) every profile."""
        blind = self.checker.feed(event, pos)
        if not self.specs:
            return
        if self.profiles is None:
            self.held.append((event, pos, blind))
            if 0 in self.checker.full or len(self.held) >= STARTUP:
                self._start()
            return
        self._through(event, pos, blind)

    def _start(self) -> None:
        sizes = {**self.checker.largest, **self.checker.full}
        self.profiles = [factory(sizes) for _, factory in self.specs]
        self._feeds = list(zip(self.routers, (p.feed for p in self.profiles), strict=True))
        for report, profile in zip(self.routers, self.profiles, strict=True):
            profile.bound(self.history)
            profile.unasked()  # a reading's profiles are read for their reactions only
            report.rules = dict(profile.rules)
        while self.held:
            self._through(*self.held.popleft())

    def _through(self, event: dict[str, Any], pos: Position, blind: bool) -> None:
        self.fed += 1
        if not self.fed % TRIM:
            for profile in self.profiles or ():
                profile.trim()
        for report, feed in self._feeds:
            report.events += 1
            reactions = feed(event, pos)
            if reactions:
                self._reacted(report, reactions, blind)

    def _retire(self, key: Key) -> None:
        retired = self.retired
        retired[key] = None
        retired.move_to_end(key)
        if len(retired) > self.history:
            old = retired.popitem(last=False)[0]
            if self.profiles is not None and not self.checker.holds_hash(old[0]):
                for profile in self.profiles:
                    profile.forget(old)

    def restart(self, pos: Position, known_empty: bool) -> None:
        """Start over (a new engine, or batches lost): the checker from an empty or an unknown index,
        the profiles from empty (configured again once group 0's size is known)."""
        self.finish()
        self.checker.restart(pos, known_empty)
        self.profiles, self._feeds = None, []
        self.retired.clear()

    def finish(self) -> None:
        """The end of what is read: undecided stores reported, held events given to the profiles."""
        self.checker.finish()
        if self.specs and self.profiles is None and self.held:
            self._start()

    # ------------------------------------------------------------------ a file's reports

    def reports(self) -> list[RouterReport]:
        """Each profile's report on the stream read (a bare stream: no query has an answer)."""
        self.finish()
        if self.specs and self.profiles is None:
            self._start()
        for report, profile in zip(self.routers, self.profiles or (), strict=False):
            report.repeated_stores = self.checker.reannounced
            report.note = (f"a stream alone answers no prefix query: whether {profile.name}'s index matches "
                           "the pool needs a trace (kvpool check-trace --router). "
                           f"{report.repeated_stores} store(s) of a key already stored: a re-announced hit "
                           f"and a second copy are the same events; {profile.name} reads each as "
                           f"{profile.repeats}")
        return self.routers


__all__ = ["STARTUP", "Finding", "Reading", "Sink"]
