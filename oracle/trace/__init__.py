"""JSONL traces of pool calls: record one from any pool, check one against the model.

A trace lets an implementation that cannot be imported here (another
language, another process) be checked: it writes what each call returned,
raised and emitted, and :func:`check_trace` replays the same calls on the
model and names the first line where they differ.  The format is specified
in ``oracle/TRACE_FORMAT.md``; this package is its reference reader and writer.

The reader is strict on purpose: a writer in another language gets a
:class:`TraceError` naming the file, the line and the field, rather than a
silent mismatch later.  It never raises anything else on bad input.

Modules: :mod:`.schema` (the format as data), :mod:`.read`, :mod:`.write`,
:mod:`.check` (replaying on the model), :mod:`.record` (a pool running the
workload).  ``kvpool record`` and ``kvpool check-trace`` are
:mod:`kvpool.cli.trace`.
"""

from .check import CheckReport, check_trace
from .read import TraceStep, json_lines, parse_event
from .record import Recording, RecordingLockstep, record, record_adapter, recording_pair
from .schema import DEFAULT_REFERENCE, FieldError, TraceError

__all__ = [
    "DEFAULT_REFERENCE", "CheckReport", "FieldError", "Recording", "RecordingLockstep", "TraceError",
    "TraceStep", "check_trace", "json_lines", "parse_event", "record",
    "record_adapter", "recording_pair",
]
