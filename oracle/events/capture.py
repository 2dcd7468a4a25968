"""A capture of the wire (``kvpool watch --record FILE``), written and read: an incident, replayable.

The format is ``oracle/WIRE_FORMAT.md``'s (version 1): length-prefixed msgpack records, a
header map first, then ``["msg", ...]`` (a message as received), ``["ask", ...]`` (a replay
asked) and ``["gave-up", ...]`` (a hole no longer waited for), numbered from 1 (findings say
``record N``).

Replaying a capture feeds these records in order to the same sequencing
and checking as the live watcher, so it finds what the watcher found, at
the same records.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..trace import TraceError

VERSION = 1
_LENGTH = struct.Struct(">I")
MAX_RECORD = 1 << 30


@dataclass(frozen=True)
class Source:
    """One subscribed endpoint: where its batches come from, its replay socket, its data-parallel rank."""

    endpoint: str
    replay: str | None = None
    rank: int = 0


@dataclass(frozen=True)
class Header:
    sources: list[Source]
    topic: str = ""
    started: float = 0.0


Record = list[Any]


class CaptureWriter:
    """Appends records to a capture file; flushed on :meth:`flush` and :meth:`close`."""

    def __init__(self, path: str | Path, header: Header):
        import msgspec  # the extra kvpool[live]; is_capture() needs none

        self.handle: BinaryIO = Path(path).open("wb")  # noqa: SIM115 (closed by close())
        self.encode = msgspec.msgpack.Encoder().encode
        self.write({"kvpool_wire": VERSION, "started": header.started or time.time(),
                     "sources": [asdict(s) for s in header.sources], "topic": header.topic})

    def write(self, record: Record | dict[str, Any]) -> None:
        data = self.encode(record)
        self.handle.write(_LENGTH.pack(len(data)))
        self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def is_capture(path: str | Path) -> bool:
    """Whether the file starts as a capture does (a length whose high byte is 0: never JSON text)."""
    try:
        with Path(path).open("rb") as handle:
            head = handle.read(5)
    except OSError:
        return False
    return len(head) == 5 and head[0] == 0 and (head[4] in (0xDE, 0xDF) or 0x80 <= head[4] < 0x90)


def read_capture(path: str | Path) -> tuple[Header, Iterator[tuple[int, Record]]]:
    """The header, and the records numbered from 1, read as they come; :class:`TraceError` (with
    the record's number) on a truncated or malformed file."""
    import msgspec  # the extra kvpool[live], as in CaptureWriter

    name = str(path)
    try:
        handle = Path(path).open("rb")  # noqa: SIM115 (closed by the generator)
    except OSError as exc:
        raise TraceError(name, 0, f"cannot read: {exc.strerror or exc}") from None
    decode = msgspec.msgpack.Decoder().decode
    try:
        first = _next(handle, name, 0, decode)
        if not isinstance(first, dict) or first.get("kvpool_wire") != VERSION:
            raise TraceError(name, 0, f"not a kvpool wire capture of version {VERSION}")
        try:
            sources = [Source(str(s["endpoint"]), s.get("replay"), int(s.get("rank", 0)))
                       for s in first.get("sources", [])]
        except (KeyError, TypeError, ValueError):
            raise TraceError(name, 0, "header: sources must be a list of {endpoint, replay, rank}") from None
    except TraceError:
        handle.close()
        raise
    header = Header(sources, str(first.get("topic", "")), float(first.get("started", 0.0)))

    def records() -> Iterator[tuple[int, Record]]:
        with handle:
            number = 0
            while True:
                number += 1
                value = _next(handle, name, number, decode)
                if value is None:
                    return
                if not isinstance(value, list) or not value or not isinstance(value[0], str):
                    raise TraceError(name, number, "a record must be an array naming its kind first")
                yield number, value

    return header, records()


def _next(handle: BinaryIO, name: str, number: int, decode: Any) -> Any:
    head = handle.read(4)
    if not head:
        if number == 0:
            raise TraceError(name, 0, "empty file: no capture header")
        return None
    if len(head) < 4:
        raise TraceError(name, number, "truncated: the record's length is cut off")
    (size,) = _LENGTH.unpack(head)
    if size > MAX_RECORD:
        raise TraceError(name, number, f"a record of {size} bytes: not a capture, or corrupt")
    data = handle.read(size)
    if len(data) < size:
        raise TraceError(name, number, f"truncated: {len(data)} of the record's {size} bytes")
    try:
        return decode(data)
    except ValueError as exc:  # msgspec.DecodeError
        raise TraceError(name, number, f"not msgpack: {exc}") from None


__all__ = ["VERSION", "CaptureWriter", "Header", "Record", "Source", "is_capture", "read_capture"]
