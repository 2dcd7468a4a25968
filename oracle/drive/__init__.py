"""Driving a pool in any language over stdin and stdout: kvpool's workloads and shrinking for it.

The pool runs as a process that speaks the drive protocol (version 1,
``oracle/DRIVE_PROTOCOL.md``): JSON lines built on the trace format.  The
oracle drives it through :class:`.adapter.DriveAdapter` exactly as it drives a
Python pool (the same campaign, state machine, observation and shrinking),
and a failure becomes a trace file that ``kvpool check-trace`` replays.

Modules: :mod:`.protocol` (the lines), :mod:`.process` (a child process that
may misbehave), :mod:`.facade` (the reference API over it), :mod:`.adapter`,
:mod:`.failure` (a failure as a short trace), :mod:`.serve` (a Python pool
behind the protocol).
"""

from .adapter import DEFAULT_TIMEOUT, DriveAdapter
from .facade import DrivenPool
from .process import ProcessFailure, ProcessHung, Verdict
from .protocol import VERSION

__all__ = ["DEFAULT_TIMEOUT", "VERSION", "DriveAdapter", "DrivenPool", "ProcessFailure", "ProcessHung",
           "Verdict"]
