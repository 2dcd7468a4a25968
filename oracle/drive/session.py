"""One pool's life in one process: its header, the lines sent, the answers read, checked and kept.

Two ways to talk, on the same lines.  :meth:`Session.calls` sends calls and
waits for their answers (each checked as its trace line).  :meth:`Session.post`
sends calls ahead of their answers, each with what the model says its answer
must be (:class:`Expect`): the facade answers its caller as the model does at
once (:mod:`.facade`), and each answer, when it comes, is compared with what
was expected; the first that differs (or a process that fails meanwhile)
raises :class:`~kvpool.oracle.core.adapter.Mispredicted`, and the run is made
again call by call to say exactly where.  The pipe is never waited on while
the process keeps up, which is what makes the drive as fast as the pool.

Every answered line is kept as a trace line (:attr:`Session.log`); an
``observe`` line is kept as the queries it stands for, so a trace names only
operations of the trace format.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.adapter import Mispredicted
from ..trace.check import Expected, observation_diffs, outcome_diffs
from ..trace.read import Header, TraceStep
from ..trace.schema import Json, show
from . import protocol
from .process import PoolProcess, ProcessFailure, ProcessHung

SHORT_ANSWER = 120
"""Answers up to this many bytes (without an observation) are read once per operation."""
KNOWN_ANSWERS = 4096
FAILED_CALL_ERRORS = {"crash": "ProcessCrashed", "hang": "ProcessHung"}
"""The error name a trace line records for a call the process failed; ``ProtocolViolation`` else."""

Call = tuple[str, dict[str, Json]]
"""A call as sent: its operation and its arguments in the trace's form."""
Observed = tuple[int, list[bool], list[int | None]]
"""What an ``observe`` line answers: the free count, writability per block, lookup per key."""


@dataclass(slots=True)
class Expect:
    """A line sent ahead of its answer, and what the model says the answer must be."""

    name: str
    """``call 17 (free_blocks)``: how a verdict names the line."""
    op: str
    args: dict[str, Json]
    outcome: Expected | None = None
    """A call's refusal, result, events and watchers (None for an ``observe`` line)."""
    observed: Observed | None = None
    """An ``observe`` line's answer."""
    view: Callable[[dict[str, Json]], list[str]] | None = None
    """Checks of the observation the answer carries (a process that shows the whole pool)."""
    told: list[tuple[str, int | None]] | None = None
    """What a metrics collector must have been told, when one is attached."""


@dataclass
class Session:
    """One pool's life in one process: its header, the calls answered, and what failed."""

    process: PoolProcess
    pool: dict[str, Json]
    header: Header
    shape: frozenset[str] | None
    """The observation fields every answer carries (None: none)."""
    fresh: dict[str, Json] | None
    log: list[dict[str, Json]] = field(default_factory=list)
    unsupported: frozenset[str] = frozenset()
    """The operations the process said its pool lacks."""
    failed: dict[str, Json] | None = None
    """The call the process failed at, as a trace line (error ``ProcessCrashed``, ...)."""
    current: bool = True
    answers: dict[tuple[str, bytes], tuple[Json, str | None, list[dict[str, Json]], Json]] = field(
        default_factory=dict, repr=False)
    """Short answers already read, by operation: most answers are one of a few lines."""
    lacks: frozenset[str] = frozenset()
    """What the process declared its pool lacks, as declared (``unsupported`` and ``lacks``)."""
    observe: bool = False
    """The process answers ``observe`` lines."""
    metrics: bool = False
    """Every answer carries ``told``: a metrics collector's calls."""
    vllm_errors: bool = False
    ahead: deque[Expect] = field(default_factory=deque, repr=False)
    """Lines sent ahead of their answers (:meth:`post`), oldest first."""
    told: dict[int, list[tuple[str, int | None]]] = field(default_factory=dict, repr=False)
    """What the collector was told during each call answered (:meth:`calls`), by its step's line,
    until the facade takes it."""
    messages: dict[int, str] = field(default_factory=dict, repr=False)
    """A refusal's ``message`` by the number of its line in :attr:`log` (from 1)."""

    def open(self, again: bool = False) -> None:
        """Send the header and read its answer: a new pool, or (``again``) this one from scratch,
        which must be answered as the first time."""
        proc = self.process
        proc.start()
        (raw,) = proc.exchange([protocol.encode(protocol.header(self.pool))], lambda _i: "the header")
        try:
            answer = protocol.read_header_answer(protocol.decode(raw), self.header,
                                                 bool(self.pool.get("metrics_collector")))
        except protocol.ProtocolError as exc:
            raise proc.fail(exc.kind, exc.what, "the header", proc.lines_read) from None
        proc.check_unasked("the header")
        got = (answer.observation, answer.fresh, answer.unsupported, answer.lacks, answer.observe,
               answer.metrics)
        if again and got != (self.shape, self.fresh, self.unsupported, self.lacks, self.observe,
                             self.metrics):
            raise proc.fail("nondeterministic", "answered the same header differently", "the header",
                            proc.lines_read)
        (self.shape, self.fresh, self.unsupported, self.lacks, self.observe, self.metrics) = got

    def name(self, i: int, calls: Sequence[Call] | None = None) -> str:
        """How a verdict names the ``i``-th line sent from now on (or of ``calls``)."""
        if calls is not None:
            return f"call {len(self.log) + i + 1} ({calls[min(i, len(calls) - 1)][0]})"
        return self.ahead[min(i, len(self.ahead) - 1)].name if self.ahead else f"call {len(self.log) + 1}"

    # ------------------------------------------------------------ waiting for each answer

    def calls(self, calls: Sequence[Call], encoded: Sequence[bytes] | None = None) -> list[TraceStep]:
        """Send ``calls`` at once (``encoded``: their lines, if made already); each answer
        checked, logged and returned in order.  An ``observe`` line's step has the
        :data:`Observed` answer as its result."""
        if not self.current:
            raise RuntimeError("this pool was replaced by a newer one in its process")
        self.settle()
        first = len(self.log) + 1

        def name(i: int) -> str:
            return self.name(i, calls)

        proc = self.process
        if encoded is None:
            encoded = [protocol.encode({"op": op, "args": args}) for op, args in calls]
        try:
            raws = proc.exchange(encoded, name)
        except (ProcessFailure, ProcessHung) as exc:  # the trace records the call it failed at
            done = exc.answered[:len(calls)]
            self._read(calls[:len(done)], done, first, name)
            self._failed(calls, len(done), exc.verdict.kind)
            raise
        steps = self._read(calls, raws, first, name)
        proc.check_unasked(name(len(calls) - 1))
        return steps

    def _read(self, calls: Sequence[Call], raws: Sequence[bytes], first: int,
              name: Callable[[int], str]) -> list[TraceStep]:
        proc = self.process
        line0 = proc.lines_read - len(raws)
        out = []
        for i, (raw, (op, args)) in enumerate(zip(raws, calls, strict=True)):
            try:
                step = self._answer(op, args, raw, len(self.log) + 1)
            except protocol.ProtocolError as exc:
                self._failed(calls, i, exc.kind)
                raise proc.fail(exc.kind, exc.what, name(i), line0 + i + 1) from None
            out.append(step)
        return out

    def _answer(self, op: str, args: dict[str, Json], raw: bytes, number: int) -> TraceStep:
        """One answer read, checked and logged (an observe line as the queries it stands for)."""
        if op == protocol.OBSERVE:
            value = protocol.decode(raw)
            blocks, keys = args["blocks"], args["keys"]
            observed = protocol.read_observed(value, len(blocks), len(keys))
            self._log_observed(blocks, keys, observed)
            return TraceStep(number + 1, op, args, observed, None, [], [], None)
        known = self.answers
        seen = known.get((op, raw))
        if seen is not None:  # the same short answer to the same operation: read once
            result, error, events, fired = seen
            self.log.append({"op": op, "args": args, "result": result, "error": error, "events": events,
                             "fired": fired})
            return TraceStep(number + 1, op, args, result, error, events, fired, None)
        value = protocol.decode(raw)
        step, line = protocol.read_answer(op, args, value, self.header, number + 1, self.shape)
        told = protocol.read_told(value) if self.metrics else []
        if told:
            self.told[step.line] = told
        message = protocol.message_of(value)
        if message is not None and step.error is not None:
            self.messages[number] = message
        self.log.append(line)
        if step.observation is None and len(raw) <= SHORT_ANSWER and not told and message is None:
            if len(known) >= KNOWN_ANSWERS:
                known.clear()
            known[op, raw] = (step.result, step.error, step.events, step.fired)
        return step

    def _log_observed(self, blocks: Sequence[int], keys: Sequence[Json], observed: Observed) -> None:
        num_free, writable, cached = observed
        log = self.log
        log.append({"op": "get_num_free_blocks", "args": {}, "result": num_free, "error": None,
                    "events": [], "fired": []})
        log += [{"op": "is_block_writable", "args": {"block_id": b}, "result": w, "error": None,
                 "events": [], "fired": []} for b, w in zip(blocks, writable, strict=True)]
        log += [{"op": "get_cached_block", "args": {"block_hash": k[0], "kv_cache_group_ids": [k[1]]},
                 "result": None if hit is None else [hit], "error": None, "events": [], "fired": []}
                for k, hit in zip(keys, cached, strict=True)]

    def _failed(self, calls: Sequence[Call], i: int, kind: str) -> None:
        if 0 <= i < len(calls):
            op, args = calls[i]
            if op == protocol.OBSERVE:  # the first query the line stands for, as a trace names it
                op, args = "get_num_free_blocks", {}
            self.failed = {"op": op, "args": args, "result": None,
                           "error": FAILED_CALL_ERRORS.get(kind, "ProtocolViolation"), "events": []}

    def replay(self, keep: int) -> None:
        """Make the process's pool the one after the first ``keep`` logged calls, by replaying them.

        For undoing a call (see :meth:`~.facade.DrivenPool.free_blocks`); a process that
        answers the same calls differently is a verdict.
        """
        self.settle()
        kept = self.log[:keep]
        self.log = []
        self.open(again=True)
        calls = [(str(line["op"]), dict(line["args"])) for line in kept]
        if calls:
            self.calls(calls)
        for i, (old, new) in enumerate(zip(kept, self.log, strict=True)):
            if old != new:
                raise self.process.fail("nondeterministic", "answered a replay of the same calls "
                                        "differently", f"call {i + 1} ({old['op']})")

    # ------------------------------------------------------------ ahead of the answers

    def post(self, expects: Sequence[Expect], lines: Sequence[bytes]) -> None:
        """Send ``lines`` ahead of their answers, each with what it must be answered; check the
        answers that have come."""
        if not self.current:
            raise RuntimeError("this pool was replaced by a newer one in its process")
        self.ahead.extend(expects)
        try:
            self.process.post(lines, self.name)
            raws = self.process.collect(self.name)
        except ProcessFailure as exc:
            raise self._abandon(exc, exc.answered) from None
        except ProcessHung as exc:
            self._check(exc.answered)
            self._failed_ahead(exc.verdict.kind)
            raise
        self._check(raws)
        self._unasked()

    def settle(self) -> None:
        """Wait for every answer still owed, each checked (a no-op when none is)."""
        if not self.ahead:
            return
        try:
            raws = self.process.wait(len(self.ahead), self.name)
        except ProcessFailure as exc:
            raise self._abandon(exc, exc.answered) from None
        except ProcessHung as exc:
            self._check(exc.answered)
            self._failed_ahead(exc.verdict.kind)
            raise
        self._check(raws)
        self._unasked()

    def _unasked(self) -> None:
        """A line beyond those owed, once the answers before it were checked: a verdict."""
        try:
            self.process.check_unasked(self.name(len(self.ahead)))
        except ProcessFailure as exc:
            raise self._abandon(exc, []) from None

    def _check(self, raws: Sequence[bytes]) -> None:
        proc = self.process
        line0 = proc.lines_read - len(raws)
        for i, raw in enumerate(raws):
            expect = self.ahead.popleft()
            try:
                diffs = self._verify(expect, raw)
            except protocol.ProtocolError as exc:
                self.ahead.appendleft(expect)
                failure = proc.fail(exc.kind, exc.what, expect.name, line0 + i + 1)
                raise self._abandon(failure, []) from None
            if diffs:
                self.ahead.clear()
                self.process.kill()  # its pool is no longer the model's: start afresh
                raise Mispredicted(f"{expect.name}: {'; '.join(diffs)}")

    def _verify(self, expect: Expect, raw: bytes) -> list[str]:
        step = self._answer(expect.op, expect.args, raw, len(self.log) + 1)
        if expect.outcome is None:  # an observe line
            return _observed_diffs(expect.observed, step.result)
        diffs = outcome_diffs(step, expect.outcome, vllm_errors=self.vllm_errors)
        if expect.view is not None and step.observation is not None:
            diffs += expect.view(step.observation)
        told = self.told.pop(step.line, [])
        if expect.told is not None and told != expect.told:
            diffs.append(f"metrics collector: recorded {show(told)}, model {show(expect.told)}")
        return diffs

    def _abandon(self, failure: ProcessFailure, answered: Sequence[bytes]) -> Mispredicted:
        """The process failed with lines ahead: the answers before it checked, the rest dropped."""
        self._check(answered)
        self._failed_ahead(failure.verdict.kind)
        self.ahead.clear()
        out = Mispredicted(failure.verdict.format())
        out.__cause__ = failure
        return out

    def _failed_ahead(self, kind: str) -> None:
        if self.ahead:
            first = self.ahead[0]
            self._failed([(first.op, first.args)], 0, kind)


def _observed_diffs(expected: Observed | None, got: Any) -> list[str]:
    if expected is None or got == expected:
        return []
    (m_free, m_writable, m_cached), (p_free, p_writable, p_cached) = expected, got
    diffs = [] if m_free == p_free else [f"num_free: recorded {p_free}, model {m_free}"]
    diffs += [f"writable[{i}]: recorded {p}, model {m}"
              for i, (m, p) in enumerate(zip(m_writable, p_writable, strict=True)) if m != p]
    diffs += [f"cached[{i}]: recorded {p}, model {m}"
              for i, (m, p) in enumerate(zip(m_cached, p_cached, strict=True)) if m != p]
    return diffs


def whole_view(model: Json) -> Callable[[dict[str, Json]], list[str]]:
    """Checks of a whole observation against the model's (``check-trace``'s comparison)."""
    return lambda recorded: observation_diffs(recorded, model)


__all__ = ["FAILED_CALL_ERRORS", "KNOWN_ANSWERS", "SHORT_ANSWER", "Call", "Expect", "Observed", "Session",
           "whole_view"]
