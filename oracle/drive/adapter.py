"""The oracle's :class:`~kvpool.oracle.core.adapter.Adapter` for a pool in another process.

``construct`` sends a header to one of (at most) two copies of the command
and returns a :class:`~.facade.DrivenPool` over it: the workloads use two pools
at once (blocks of a second pool freed through the first), and each pool is a
process of its own.  The copy used is the one constructed least recently, so a
run's first and second pool are always its two latest constructs; a process is
reused (a new header makes a fresh pool) until it fails, then started anew.

Within :meth:`DriveAdapter.ahead` the pools answer ahead of their process
(:mod:`.session`): a phase that can make a run again (the campaign) drives
the process at the pool's own speed, and makes the run again call by call
when an answer, checked as it comes, differs from the model's
(:class:`~kvpool.oracle.core.adapter.Mispredicted`).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.abstraction import names_refusal
from ..core.adapter import ReferencePool
from ..trace.read import Header
from ..trace.schema import DEFAULT_REFERENCE
from . import protocol
from .facade import DrivenPool, DrivenRefusal
from .process import PoolProcess, Verdict
from .session import Session

PROCESSES = 2
"""Copies of the command kept running: the workloads use at most two pools at once."""
DEFAULT_TIMEOUT = 10.0
"""Seconds a process may take over one answer."""


@dataclass
class _Slot:
    process: PoolProcess
    used: int = -1
    session: Session | None = None


@dataclass
class DriveAdapter:
    """The pool behind ``command``: reference API through the drive protocol (``DRIVE_PROTOCOL.md``).

    ``misuse``: whether the process refuses deliberately wrong calls with the
    model's error names (kvpool's names: ``NotEnoughFreeBlocksError``, ...);
    ``vllm_errors``: ``ValueError`` also counts for running out of blocks.
    """

    command: Sequence[str]
    timeout: float = DEFAULT_TIMEOUT
    reference: str = DEFAULT_REFERENCE
    misuse: bool = True
    vllm_errors: bool = False
    cwd: str | None = None
    env: dict[str, str] | None = None
    slots: list[_Slot] = field(default_factory=list, repr=False)
    constructed: int = 0
    recent: list[DrivenPool] = field(default_factory=list, repr=False)
    """The latest pools constructed (newest last), its scratch's included: where a failure's trace
    is found."""
    _scratch: DriveAdapter | None = field(default=None, repr=False)
    retired: int = 0
    """Lines sent to processes already ended."""
    speculate: bool = False
    """Whether the pools made now answer ahead of their process (:meth:`ahead`)."""
    pipelined: bool = True
    """Whether :meth:`ahead` lets pools answer ahead at all (False: every call waits for its answer)."""
    declared: frozenset[str] | None = None
    """What the process declared its pool lacks, at its first header (None: no pool made yet)."""

    @classmethod
    def from_command(cls, command: str, **kwargs: Any) -> DriveAdapter:
        """The adapter for a command line, split as a POSIX shell splits it."""
        argv = shlex.split(command)
        if not argv:
            raise ValueError("empty command")
        return cls(argv, **kwargs)

    @property
    def name(self) -> str:
        return f"exec:{shlex.join(self.command)}"

    @property
    def supports_misuse(self) -> bool:
        return self.misuse

    @property
    def lacks(self) -> frozenset[str]:
        """What the process declares its pool lacks (a first pool, with a collector, is made to ask
        it); ``metrics`` too when it reports no metrics collector's calls."""
        if self.declared is None:
            self.construct(4, True, 1, False, metrics_collector=_NoCollector())
        return self.declared or frozenset()

    def construct(self, num_blocks: int, caching: bool, hash_block_size: int,
                  events: bool, metrics_collector: Any = None) -> ReferencePool:
        """A fresh pool in the least recently used process (started if it is not running);
        ``metrics_collector`` is told what the process reports its pool's collector was told.

        Typed as the reference API: :class:`DrivenPool` makes most of its methods from the
        operations' declarations when it is imported, where mypy cannot see them."""
        pool = protocol.pool_fields(num_blocks, caching, hash_block_size, events,
                                    reference=self.reference, metrics=metrics_collector is not None,
                                    when_asked=self.speculate)
        header = Header(num_blocks, caching, hash_block_size, events, "GPU", self.reference)
        slot = self._take()
        session = slot.session = Session(slot.process, pool, header, None, None,
                                         vllm_errors=self.vllm_errors)
        session.open()
        if self.declared is None and metrics_collector is not None:
            self.declared = session.lacks | (frozenset() if session.metrics else frozenset({"metrics"}))
        driven = DrivenPool(session, ahead=self.speculate, collector=metrics_collector)
        self.recent.append(driven)  # shared with the scratch adapter: one list, updated in place
        del self.recent[:-2 * PROCESSES]
        return cast(ReferencePool, driven)

    def scratch(self) -> DriveAdapter:
        """The same command for pools made and dropped while this adapter's are in use (the state
        machine's directed calls): processes of their own, so those pools stay current; they end
        with this adapter's."""
        if self._scratch is None:
            self._scratch = DriveAdapter(self.command, self.timeout, self.reference, self.misuse,
                                         self.vllm_errors, self.cwd, self.env, recent=self.recent,
                                         declared=self.declared)
        return self._scratch

    @contextlib.contextmanager
    def ahead(self) -> Iterator[DriveAdapter]:
        """Pools made within answer ahead of their process; every answer is checked before it ends
        (raising :class:`~kvpool.oracle.core.adapter.Mispredicted` at the first that differs)."""
        was, self.speculate = self.speculate, self.pipelined
        try:
            yield self
            self.settle()
        except BaseException:
            self.abandon()
            raise
        finally:
            self.speculate = was

    def abandon(self) -> None:
        """Drop the pools with answers still owed (their process is ended: its pool is no longer
        the model's), so that nothing of a run that failed is checked in another."""
        for slot in self.slots:
            session = slot.session
            if session is not None and (session.ahead or slot.process.owed):
                session.ahead.clear()
                session.current = False
                slot.session = None
                slot.process.kill()

    def protocol_lines(self) -> int:
        """Lines sent to the processes so far (headers, calls and questions), scratch ones too."""
        mine = sum(slot.process.total_sent for slot in self.slots) + self.retired
        return mine + (self._scratch.protocol_lines() if self._scratch is not None else 0)

    def settle(self) -> None:
        """Wait for every answer still owed to a current pool, each checked."""
        for slot in self.slots:
            if slot.session is not None:
                slot.session.settle()

    def borrow(self) -> PoolProcess:
        """A copy of the command for replays of one's own (shrinking a failure): the least
        recently used one, whose pool is then no longer current; started on first use."""
        return self._take().process

    def _take(self) -> _Slot:
        """The least recently used copy (a new one while there are fewer than :data:`PROCESSES`);
        the pool it held is no longer current."""
        if len(self.slots) < PROCESSES:
            self.slots.append(_Slot(PoolProcess(self.command, self.timeout, cwd=self.cwd,
                                                env=self.env)))
        slot = min(self.slots, key=lambda s: s.used)
        if slot.session is not None:  # its answers are checked before the process makes another pool
            slot.session.settle()
            slot.session.current = False
            slot.session = None
        self.constructed += 1
        slot.used = self.constructed
        return slot

    def errors_match(self, model_error: Exception, pool_error: Exception | None) -> bool:
        """The process named the model's refusal (as ``check-trace`` compares error names)."""
        if not isinstance(pool_error, DrivenRefusal):
            return False
        return names_refusal(type(pool_error).__name__, model_error, vllm_errors=self.vllm_errors)

    def close(self) -> list[Verdict]:
        """End every process (stdin closed, then killed if it lingers); what they did wrong then."""
        self.retired += sum(slot.process.total_sent for slot in self.slots)
        for slot in self.slots:
            if slot.session is not None:
                slot.session.current = False
        verdicts = [v for slot in self.slots if (v := slot.process.close()) is not None]
        self.slots.clear()
        if self._scratch is not None:
            verdicts += self._scratch.close()
        return verdicts

    def __enter__(self) -> DriveAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NoCollector:
    """A collector for the pool made to ask what the process lacks: told nothing that matters."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


__all__ = ["DEFAULT_TIMEOUT", "PROCESSES", "DriveAdapter"]
