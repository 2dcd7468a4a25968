"""How a shadow's records reach the checker: on the engine's thread, or in a checker process.

One hub per engine process and mode.  :class:`InlineHub` runs the checker
right after each call (a divergence can then raise from the call,
:data:`~.settings.ENV_STRICT`).  :class:`ProcessHub` starts one checker
process (``python -m kvpool.oracle.shadow.child``) at the first shadowed pool
and writes the records to its stdin in batches, each record pickled when it is
sent (a record then leaves no object behind for the garbage collector to
walk, which would otherwise be most of the shadow's cost inside an engine's
large heap): the engine's thread only records, the model runs on another core.  A full pipe makes the engine
wait (memory stays bounded); a checker that dies stops the shadows, never the
engine.  At exit the hub waits for the checker to finish and writes the
totals (:data:`~.settings.ENV_DIR`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .check import Checker
from .settings import ENV_DIR, TOTALS, logger, shadow_dir

if TYPE_CHECKING:  # the engine's side imports this module
    from .record import RequestRefs, Shadow

BATCH = 2048
"""Records sent to the checker process at once (fewer, larger writes)."""
LATENCY = 0.5
"""Seconds after which the buffer goes out early (looked at every 128 records: the clock is not read
on every call); everything goes at a sync and at exit."""
_FRAME = struct.Struct("<I")
_dumps, _PROTOCOL = pickle.dumps, pickle.HIGHEST_PROTOCOL


def write_frame(out: IO[bytes], value: Any) -> None:
    write_records(out, [_dumps(value, _PROTOCOL)])


def read_frame(src: IO[bytes]) -> Any:
    """The next pickled value, or None at the end of the stream."""
    data = _read_data(src)
    return None if data is None else pickle.loads(data)


def write_records(out: IO[bytes], records: list[bytes]) -> None:
    """Records pickled one by one (:meth:`ProcessHub.send`), as one frame."""
    data = b"".join(records)
    out.write(_FRAME.pack(len(data)))
    out.write(data)
    out.flush()


def read_records(src: IO[bytes]) -> list[Any] | None:
    """The records of the next :func:`write_records` frame, or None at the end of the stream."""
    data = _read_data(src)
    if data is None:
        return None
    stream = io.BytesIO(data)  # an unpickler per record: each was pickled alone (its memo starts again)
    records = []
    while stream.tell() < len(data):
        records.append(pickle.load(stream))
    return records


def _read_data(src: IO[bytes]) -> bytes | None:
    head = src.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    data = src.read(size)
    return data if len(data) == size else None


class Hub:
    """What every hub does: requests by number, the shadows it serves, totals at exit."""

    remote = False

    def __init__(self) -> None:
        # lazy: record imports this module (the shadow's two sides name each other)
        from .record import RequestRefs

        self.requests: RequestRefs = RequestRefs(self.send)
        self.shadows: weakref.WeakValueDictionary[int, Shadow] = weakref.WeakValueDictionary()
        self.pid = os.getpid()

    def add(self, shadow: Shadow, config: dict[str, Any]) -> None:
        self.shadows[shadow.number] = shadow

    def send(self, message: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def close(self, number: int, keep: bool) -> Path | None:
        raise NotImplementedError

    def pair(self, number: int) -> Any:
        return None

    def stopped(self, number: int) -> None:
        """The checker ended this pool's check: its shadow stops recording."""
        shadow = self.shadows.get(number)
        if shadow is not None:
            shadow.active = False

    def finish(self) -> None:
        """Everything sent is checked, every working file closed."""


class InlineHub(Hub):
    """The checker on the engine's thread, right after each call."""

    def __init__(self) -> None:
        super().__init__()
        self.checker = Checker()
        self.checker.on_stop = self.stopped
        self.pending: list[tuple[Any, ...]] = []
        self.busy = False

    def add(self, shadow: Shadow, config: dict[str, Any]) -> None:
        super().add(shadow, config)
        self.checker.handle(("pool", shadow.number, config), live=shadow.pool)

    def send(self, message: tuple[Any, ...]) -> None:
        # a message sent while one is checked (a pool collected meanwhile) waits its turn
        self.pending.append(message)
        if self.busy:
            return
        self.busy = True
        try:
            while self.pending:
                self.checker.handle(self.pending.pop(0))
        finally:
            self.busy = False

    def close(self, number: int, keep: bool) -> Path | None:
        if self.busy:
            self.pending.append(("close", number, keep))
            return None
        self.busy = True
        try:
            while self.pending:
                self.checker.handle(self.pending.pop(0))
            path: Path | None = self.checker.handle(("close", number, keep))
            return path
        finally:
            self.busy = False

    def pair(self, number: int) -> Any:
        check = self.checker.pools.get(number)
        return None if check is None else check.pair

    def finish(self) -> None:
        self.checker.close_all()


CHECKER = ["-P", "-m", "kvpool.oracle.shadow.child"]
"""The checker process's arguments to this Python (-P: a checkout's kvpool/ folder in the working
directory must not hide the installed one); benchmarks/replay_trace.py puts one that only counts
the records in its place, to tell the recording's cost from the checker's."""


class ProcessHub(Hub):
    """The checker in a process of its own, fed batches of pickled records through a pipe."""

    remote = True

    def __init__(self) -> None:
        super().__init__()
        env = {**os.environ, "KVPOOL_SHADOW_PARENT": str(os.getpid())}
        self.child = subprocess.Popen([sys.executable, *CHECKER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        self.buffer: list[bytes] = []
        self.since = 0.0
        self.dead = False
        self.why = ""
        self.syncs = 0

    def send(self, message: tuple[Any, ...]) -> None:
        buffer = self.buffer
        buffer.append(_dumps(message, _PROTOCOL))
        if len(buffer) >= BATCH or (not len(buffer) & 127 and time.monotonic() - self.since > LATENCY):
            self.flush()

    def add(self, shadow: Shadow, config: dict[str, Any]) -> None:
        super().add(shadow, config)
        self.send(("pool", shadow.number, config))

    def flush(self) -> None:
        if self.pid != os.getpid() and not self.dead:  # a process forked from the engine's: not its pipe
            self.dead = True
            for shadow in list(self.shadows.values()):
                shadow.active = False
        if not self.buffer or self.dead:
            self.buffer.clear()
            return
        batch, self.buffer = self.buffer, []
        self.since = time.monotonic()
        try:
            write_records(self.child.stdin, batch)  # type: ignore[arg-type]
        except (BrokenPipeError, OSError, ValueError) as exc:
            self._died(f"cannot reach the checker process: {exc!r}")

    def _died(self, why: str) -> None:
        self.dead = True
        self.why = why
        logger.warning("kvpool shadow: %s; the pools of process %d are no longer shadowed", why, self.pid)
        for shadow in list(self.shadows.values()):
            shadow.active = False

    def sync(self) -> dict[str, Any]:
        """Wait until the checker has checked everything sent; its totals so far."""
        if self.dead:
            return {"dead": self.why}
        for shadow in list(self.shadows.values()):
            shadow.repeats.tell(self, shadow.number)
        self.syncs += 1
        self.send(("sync", self.syncs))
        self.flush()
        reply = None if self.dead else read_frame(self.child.stdout)  # type: ignore[arg-type]
        if reply is None:
            self._died("the checker process ended")
            return {"dead": self.why}
        for number in reply["stopped"]:
            self.stopped(number)
        totals: dict[str, Any] = reply["totals"]
        return totals

    def close(self, number: int, keep: bool) -> Path | None:
        self.send(("close", number, keep))
        return None

    def finish(self) -> None:
        if self.dead:
            return
        self.flush()
        with contextlib.suppress(OSError, ValueError):
            self.child.stdin.close()  # type: ignore[union-attr]
        reply = read_frame(self.child.stdout)  # type: ignore[arg-type]
        self.child.wait()
        self.dead = True
        if reply is not None:
            TOTALS.add(reply["totals"])


_hubs: dict[str, Hub] = {}


def hub(mode: str) -> Hub:
    """This process's hub for ``mode`` (``process`` or ``inline``), started at its first pool."""
    found = _hubs.get(mode)
    if found is None or found.pid != os.getpid():  # a forked engine process starts its own
        found = _hubs[mode] = ProcessHub() if mode == "process" else InlineHub()
        _at_exit()
    return found


def sync() -> dict[str, Any]:
    """Wait until every recorded call of this process is checked; the totals of the checker
    process so far (those of checks on the engine's thread are :data:`~.settings.TOTALS`)."""
    found = _hubs.get("process")
    if isinstance(found, ProcessHub) and found.pid == os.getpid():
        return found.sync()
    for other in _hubs.values():
        if isinstance(other, InlineHub):
            other.send(("noop",))
    return {}


def finish() -> None:
    """Wait for every check of this process, close every working file, gather the totals."""
    for mode, found in list(_hubs.items()):
        if found.pid == os.getpid():
            found.finish()
        del _hubs[mode]


@functools.cache
def _at_exit() -> None:
    """Once: at exit, finish the checks and write this process's totals to :data:`ENV_DIR` (when set)."""

    def write() -> None:
        finish()
        if not os.environ.get(ENV_DIR):
            return
        with contextlib.suppress(OSError):
            path = shadow_dir() / f"totals-{os.getpid()}.json"
            path.write_text(json.dumps(TOTALS.to_json(), indent=1) + "\n", encoding="utf-8")

    atexit.register(write)


__all__ = ["BATCH", "CHECKER", "Hub", "InlineHub", "ProcessHub", "finish", "hub", "read_frame",
           "read_records", "sync", "write_frame", "write_records"]
