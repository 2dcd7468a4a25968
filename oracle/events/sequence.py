"""One engine's batches put back in sequence: duplicates dropped, reordering undone, gaps asked of the
replay socket and, when they are gone, declared with their size; restarts told from all of these.

Pure logic, no sockets: the watcher hands it each batch as it arrives (from the
PUB socket or the replay socket) and does what it answers (deliver a batch,
restart the reading, report, ask for a replay); a capture replayed through it
gives the same answers in the same order, since nothing here reads a clock.

* A batch with the next sequence number is delivered, and any held after it.
* A later one is held; with a replay socket, the missing ones are asked for
  at once (vLLM answers with every batch it still buffers from there on, then
  an end marker; of the answer only the hole is taken, the rest comes live);
  without one, or when the answer ends with batches still missing, they are
  *lost*: a gap of that size, after which the reading restarts with what it
  cannot see (:class:`Reset` ``known_empty=False``).
* An earlier one is a duplicate if its payload is the one delivered under
  that number (the last ``window`` numbers are remembered), *late* if its
  number (not 0) was declared lost, and otherwise a *restart*: the engine's
  sequence went back (to 0: a new engine with a fresh pool).
* The first batch of an engine (or after a restart) with a number above 0
  means the watcher joined late: batches from 0 are asked for; the reading
  starts from an empty index only if the stream from 0 is whole.

State is bounded: ``hold`` batches held, ``window`` numbers remembered.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Deliver:
    """The next batch, in sequence."""

    record: int
    seq: int
    payload: bytes


@dataclass(frozen=True)
class Reset:
    """The reading starts over before the next delivery: from an empty index (the stream read from its
    first batch) or from an unknown one (batches lost)."""

    record: int
    known_empty: bool


@dataclass(frozen=True)
class Note:
    """Something about the wire worth a line: ``joined``, ``gap``, ``restart`` or ``late``."""

    kind: str
    record: int
    seq: int
    message: str
    lost: int = 0
    recovered: int = 0


@dataclass(frozen=True)
class Ask:
    """Ask the replay socket for every batch from ``start`` on."""

    start: int


Action = Deliver | Reset | Note | Ask


@dataclass
class Stats:
    """What the sequence came to (the watcher's summary and metrics read them)."""

    delivered: int = 0
    duplicates: int = 0
    """Batches received again, dropped (the replay socket's copy of one delivered is not counted: it
    resends all it buffers)."""
    reordered: int = 0
    gaps: int = 0
    recovered: int = 0
    lost: int = 0
    restarts: int = 0
    late: int = 0


class Sequencer:
    """One engine's sequence: feed it arrivals, do what it answers."""

    def __init__(self, replay: bool, *, hold: int = 4_096, window: int = 4_096, reorder: int = 16):
        self.replay = replay
        self.hold, self.window, self.reorder = hold, window, reorder
        self.expected: int | None = None
        """The next number to deliver (None: a new epoch, not started)."""
        self.held: dict[int, tuple[int, bytes]] = {}
        self.asked: int | None = None
        """The start of the replay asked and not answered yet."""
        self.asked_until = -1
        """The last number of the hole asked for: a replayed batch after it is left to the live stream
        (the replay socket answers ahead of it, and an answer's end may overtake live batches)."""
        self.answered: int | None = None
        """The lowest number the replay's answer had: below it, the replay socket no longer has them."""
        self.retries = 0
        self.recent: OrderedDict[int, int] = OrderedDict()  # its oldest found at once (see online.py)
        """Numbers delivered lately, to their payload's digest."""
        self.lost: deque[tuple[int, int]] = deque(maxlen=64)
        """Ranges declared lost lately (a batch arriving after is late, not a restart)."""
        self.epochs = 0
        self.filled = 0
        """Batches the replay socket sent since the last hole was settled."""
        self.last: int | None = None
        """The last number delivered."""
        self.stats = Stats()

    # ------------------------------------------------------------------ arrivals

    def arrive(self, record: int, seq: int, payload: bytes, replayed: bool = False) -> list[Action]:
        """A batch from the PUB socket, or (``replayed``) the replay socket."""
        if replayed and self.asked is not None and (self.answered is None or seq < self.answered):
            self.answered = seq
        if replayed and (self.asked is None or seq > self.asked_until):
            return []
        out: list[Action] = []
        if self.expected is not None and seq < self.expected:
            if self.recent.get(seq) == hash(payload):
                self.stats.duplicates += not replayed
                return out
            if replayed or (seq and any(a <= seq <= b for a, b in self.lost)):
                if not replayed:
                    self.stats.late += 1
                    out.append(Note("late", record, seq, f"batch {seq} arrived after it was declared lost: "
                                    "dropped"))
                return out
            self.stats.restarts += 1
            out.append(Note("restart", record, seq, f"the sequence went back from {self.last} to {seq}: "
                            + ("a new engine, read from its first batch" if seq == 0 else
                               "a new engine (or another publisher on the same topic)")))
            self._new_epoch()
        if seq in self.held:
            self.stats.duplicates += 1
            return out
        if replayed:
            self.stats.recovered += 1
            self.filled += 1
        if self.expected is None:
            return out + self._start(record, seq, payload)
        if seq == self.expected:
            return out + self._deliver(record, seq, payload)
        self.stats.reordered += 1
        self.held[seq] = (record, payload)
        return out + self._hole(record)

    def _new_epoch(self) -> None:
        self.expected, self.asked = None, None
        self.held.clear()
        self.recent.clear()
        self.lost.clear()
        self.epochs += 1

    def _start(self, record: int, seq: int, payload: bytes) -> list[Action]:
        """The first batch of an epoch: from 0, or (asked for, or lost) the ones before it."""
        if seq == 0:
            self.expected = 0
            return [Reset(record, known_empty=True), *self._deliver(record, seq, payload)]
        self.held[seq] = (record, payload)
        if len(self.held) > (self.hold if self.replay else self.reorder):
            return self._give_up(record)
        return self._ask(0) if self.replay and self.asked is None else []

    def _hole(self, record: int) -> list[Action]:
        if len(self.held) > self.hold:
            return self._give_up(record)
        if self.replay:
            return self._ask(self.expected) if self.asked is None else []
        return self._give_up(record) if len(self.held) > self.reorder else []

    def _ask(self, start: int | None) -> list[Action]:
        self.asked = start or 0
        self.asked_until = min(self.held) - 1
        self.answered = None
        return [Ask(self.asked)]

    def replay_ended(self, record: int) -> list[Action]:
        """The replay socket's end marker: what it no longer had of the hole asked for is gone.

        An answer that had the hole's first batch and yet did not bring it lost it on the way (vLLM
        0.31's ROUTER drops what exceeds its high-water mark): it is asked again, a few times in a row
        without progress (a slow reader gets a part of each answer; a long hole takes many).
        """
        if self.asked is None:
            return []
        start = 0 if self.expected is None else self.expected
        gone = self.asked_until if self.answered is None else min(self.asked_until, self.answered - 1)
        if self.held and min(self.held) > start and gone < start:  # it had the hole's start
            if start > self.asked:  # it brought part of the hole: the rest is a hole of its own
                self.retries = 0
            if self.retries < 3:
                self.retries += 1
                return self._ask(start)
            gone = self.asked_until  # asked for three times, never brought: lost all the same
        self.retries = 0
        return self._give_up(record, until=gone)

    def gave_up(self, record: int) -> list[Action]:
        """The watcher stopped waiting (for a replay's answer, or for a hole to fill): what is missing
        below every batch held is lost."""
        out: list[Action] = []
        while self.held:
            out += self._give_up(record, again=False)
        return out

    @property
    def waiting(self) -> bool:
        """Whether batches are held for a hole (the watcher may give up waiting)."""
        return bool(self.held)

    def _give_up(self, record: int, again: bool = True, until: int | None = None) -> list[Action]:
        """Declare lost the numbers missing below the lowest held batch (up to ``until``: the hole a
        replay was asked for), deliver from there, and ask for (or wait for) the next hole (``again``)."""
        self.asked = None
        if not self.held:
            self.filled = 0
            return []
        start = 0 if self.expected is None else self.expected
        low = min(self.held)
        end = low - 1 if until is None else min(low - 1, until)
        out: list[Action] = []
        if end >= start:
            n = end - start + 1
            self.stats.gaps += 1
            self.stats.lost += n
            self.lost.append((start, end))
            if self.expected is None:
                out.append(Note("joined" if not self.epochs else "gap", record, end + 1,
                                f"the first batch seen is {low}: batches 0 to {end} were published before, "
                                "and the replay socket did not give them; what they stored is not known",
                                lost=n, recovered=self.filled))
            else:
                out.append(Note("gap", record, end + 1, f"batches {start} to {end} ({n}) are lost: the "
                                "reading restarts, and removals and parents of keys stored before are not "
                                "judged until the next AllBlocksCleared", lost=n, recovered=self.filled))
            out.append(Reset(record, known_empty=False))
            self.expected, self.filled = end + 1, 0
        if self.expected is not None and self.expected in self.held:
            held_record, payload = self.held.pop(self.expected)
            out += self._deliver(held_record, self.expected, payload)
        if self.held and again:
            if self.replay:
                out += self._ask(self.expected)
            elif len(self.held) > self.reorder:
                out += self._give_up(record)
        return out

    def _deliver(self, record: int, seq: int, payload: bytes) -> list[Action]:
        out: list[Action] = []
        while True:
            out.append(Deliver(record, seq, payload))
            self.stats.delivered += 1
            self.recent[seq] = hash(payload)
            if len(self.recent) > self.window:
                self.recent.popitem(last=False)
            self.last = seq
            self.expected = seq + 1
            nxt = self.held.pop(self.expected, None)
            if nxt is None:
                break
            record, payload = nxt
            seq = self.expected
        return out


__all__ = ["Action", "Ask", "Deliver", "Note", "Reset", "Sequencer", "Stats"]
