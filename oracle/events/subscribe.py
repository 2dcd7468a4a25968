"""The sockets of ``kvpool watch``: a SUB per endpoint, a DEALER per replay socket, one poll loop.

Each message is numbered as it is received (its *record*: the number it has
in a capture, and in every finding about it), written to the capture first
when there is one, then handed to the :class:`~.fleet.Fleet`; the replays it
asks for are sent on the source's DEALER (vLLM's ROUTER answers a request
``[b"", start]`` with the batches it still has, then an end marker).  When a
hole does not fill within ``give_up`` seconds (a replay not answered, a
reordering never resolved) the watcher stops waiting: that decision is a
record too, so a capture replays to the same findings.  Wall-clock time
decides only *when* the watcher stops waiting, never what a batch is.

Needs ``pyzmq`` and ``msgspec`` (``pip install 'kvpool[live]'``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import zmq

from .capture import CaptureWriter, Source
from .fleet import Fleet

DRAIN = 512
"""Messages taken from one socket before the next is looked at (fairness between engines)."""


class Watcher:
    """Subscribes to the sources and feeds the fleet until told to stop."""

    def __init__(self, fleet: Fleet, sources: Sequence[Source], *, topic: str = "", bind: bool = False,
                 capture: CaptureWriter | None = None, give_up: float = 10.0, hwm: int = 100_000,
                 context: Any = None):
        self.fleet, self.sources, self.capture, self.give_up = fleet, list(sources), capture, give_up
        self.context = context or zmq.Context.instance()
        self.poller = zmq.Poller()
        self.subs: list[Any] = []
        self.dealers: dict[int, Any] = {}
        self.owner: dict[Any, tuple[int, str]] = {}
        for i, src in enumerate(self.sources):
            sub = self.context.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, hwm)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt_string(zmq.SUBSCRIBE, topic)
            (sub.bind if bind else sub.connect)(src.endpoint)
            self.subs.append(sub)
            self.poller.register(sub, zmq.POLLIN)
            self.owner[sub] = (i, "pub")
            if src.replay is not None:
                dealer = self.context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.setsockopt(zmq.RCVHWM, 0)
                dealer.connect(src.replay)
                self.dealers[i] = dealer
                self.poller.register(dealer, zmq.POLLIN)
                self.owner[dealer] = (i, "replay")
        self.records = 0
        self.stopped = False

    def _record(self, record: list[Any]) -> int:
        self.records += 1
        if self.capture is not None:
            self.capture.write(record)
        return self.records

    def poll(self, timeout_ms: int = 200) -> int:
        """Wait up to ``timeout_ms`` for messages, handle what came; how many messages that was."""
        handled = 0
        for sock, _ in self.poller.poll(timeout_ms):
            source, via = self.owner[sock]
            for _ in range(DRAIN):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                handled += 1
                if via == "replay":
                    if not frames or frames[0]:
                        frames = [b"?", *frames]  # no empty delimiter: not vLLM's reply; reported as such
                    frames = frames[1:]
                t = time.time()
                record = self._record(["msg", t, source, via, frames])
                self._ask(self.fleet.message(record, t, source, via, frames))
        self._stop_waiting()
        return handled

    def _ask(self, asks: list[tuple[int, bytes, int]]) -> None:
        for source, topic, start in asks:
            dealer = self.dealers.get(source)
            self._record(["ask", time.time(), source, topic, start])
            if dealer is not None:
                dealer.send_multipart([b"", start.to_bytes(8, "big")])

    def _stop_waiting(self) -> None:
        now = time.time()
        for source, topic, since in self.fleet.waiting():
            if now - since >= self.give_up:
                record = self._record(["gave-up", now, source, topic])
                self._ask(self.fleet.gave_up(record, now, source, topic))

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        for sock in [*self.subs, *self.dealers.values()]:
            sock.close(linger=0)
        if self.capture is not None:
            self.capture.close()


__all__ = ["DRAIN", "Watcher"]
