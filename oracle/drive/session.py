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

import functools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import QUERIES

from ..core.abstraction import refusal_name
from ..core.adapter import Mispredicted
from ..trace.check import Expected, outcome_diffs
from ..trace.read import Header, TraceStep
from ..trace.schema import Json, show
from . import protocol
from .process import PoolProcess, ProcessFailure, ProcessHung

SHORT_ANSWER = 120
"""Answers up to this many bytes (without an observation) are read once per operation."""
KNOWN_ANSWERS = 4096
FAILED_CALL_ERRORS = {"crash": "ProcessCrashed", "hang": "ProcessHung"}
"""The error name a trace line records for a call the process failed; ``ProtocolViolation`` else."""

QUERY_LINES = frozenset({*QUERIES, protocol.OBSERVE})
"""Lines that change nothing in the pool: its queries, and observe lines."""
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
    asks: tuple[list[int], list[Json]] | None = None
    """The questions the call line carried (``observe``: blocks, keys as sent), answered in
    ``observed`` with the call; ``observed`` is then their expected answer."""
    show: bool = False
    """The line asks for the whole pool (a process that shows it only when asked)."""
    shown: Callable[[dict[str, Json]], list[str]] | None = None
    """Checks of what such a process shows of the blocks and keys an observe line names."""


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
    """Every line answered, as exchanged: a call's trace line, an observe line as one entry (the
    trace form of the whole: :meth:`trace`)."""
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
    when_asked: bool = False
    """The process shows its pool only where a line asks, and the blocks an observe line names."""
    ahead: deque[Expect] = field(default_factory=deque, repr=False)
    """Lines sent ahead of their answers (:meth:`post`), oldest first."""
    told: dict[int, list[tuple[str, int | None]]] = field(default_factory=dict, repr=False)
    """What the collector was told during each call answered (:meth:`calls`), by its step's line,
    until the facade takes it."""
    messages: dict[int, str] = field(default_factory=dict, repr=False)
    """A refusal's ``message`` by the number of its line in :attr:`log` (from 1)."""
    _shown_at: int | None = field(default=None, repr=False)
    """Where in the log the last observation shown is (the earlier ones are dropped: memory)."""
    last_observed: Observed | None = field(default=None, repr=False)
    """The questions a call line carried, as the process answered them with the call."""
    last_shown: dict[str, Json] | None = field(default=None, repr=False)
    """What the process showed of the blocks and keys of the last observe line answered."""

    def open(self, again: bool = False) -> None:
        """Send the header and read its answer: a new pool, or (``again``) this one from scratch,
        which must be answered as the first time."""
        proc = self.process
        proc.start()
        (raw,) = proc.exchange([protocol.encode(protocol.header(self.pool))], lambda _i: "the header")
        try:
            answer = protocol.read_header_answer(protocol.decode(raw),
                                                 bool(self.pool.get("metrics_collector")),
                                                 bool(self.pool.get("show_when_asked")))
        except protocol.ProtocolError as exc:
            raise proc.fail(exc.kind, exc.what, "the header", proc.lines_read) from None
        proc.check_unasked("the header")
        got = (answer.observation, answer.fresh, answer.unsupported, answer.lacks, answer.observe,
               answer.metrics, answer.when_asked)
        if again and got != (self.shape, self.fresh, self.unsupported, self.lacks, self.observe,
                             self.metrics, self.when_asked):
            raise proc.fail("nondeterministic", "answered the same header differently", "the header",
                            proc.lines_read)
        (self.shape, self.fresh, self.unsupported, self.lacks, self.observe, self.metrics,
         self.when_asked) = got

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
        name = functools.partial(self.name, calls=calls)
        proc = self.process
        if encoded is None:
            encoded = [protocol.encode({"op": op, "args": args}) for op, args in calls]
        try:
            raws = proc.exchange(encoded, name)
        except (ProcessFailure, ProcessHung) as exc:  # the trace records the call it failed at
            done = exc.answered[:len(calls)]
            self._read(calls[:len(done)], done, name)
            self._failed(calls, len(done), exc.verdict.kind)
            raise
        steps = self._read(calls, raws, name)
        proc.check_unasked(name(len(calls) - 1))
        return steps

    def _read(self, calls: Sequence[Call], raws: Sequence[bytes],
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

    def _answer(self, op: str, args: dict[str, Json], raw: bytes, number: int,
                asks: tuple[list[int], list[Json]] | None = None, lazy: bool = False,
                show: bool = False) -> TraceStep:
        """One answer read, checked and logged (an observe line as the queries it stands for; a call
        line that asked questions as well, ``asks``, with them after it: :attr:`last_observed`,
        and what the process showed of them, :attr:`last_shown`).  ``show``: the line asked for
        the whole pool (a process that shows it when asked)."""
        shown = not self.when_asked or show
        if asks is not None:
            value = protocol.decode(raw)
            step, line = protocol.read_answer(op, args, value, self.header, number + 1, self.shape, lazy,
                                              shown)
            self._note_answer(step, value)
            self.log.append(line)
            self.last_observed = protocol.read_observed_field(value, len(asks[0]), len(asks[1]))
            self._read_shown(value.get("observed"), asks)
            self._log_observed({"blocks": asks[0], "keys": asks[1]}, self.last_observed)
            return step
        if op == protocol.OBSERVE:
            value = protocol.decode(raw)
            observed = protocol.read_observed(value, len(args["blocks"]), len(args["keys"]))
            self._read_shown(value.get("result"), (args["blocks"], args["keys"]))
            self._log_observed(args, observed)
            return TraceStep(number + 1, op, args, observed, None, [], [], None)
        known = self.answers
        seen = known.get((op, raw))
        if seen is not None:  # the same short answer to the same operation: read once
            result, error, events, fired = seen
            self.log.append({"op": op, "args": args, "result": result, "error": error, "events": events,
                             "fired": fired})
            return TraceStep(number + 1, op, args, result, error, events, fired, None)
        value = protocol.decode(raw)
        step, line = protocol.read_answer(op, args, value, self.header, number + 1, self.shape, lazy, shown)
        told, message = self._note_answer(step, value)
        if step.observation is not None:  # the log keeps the last whole pool shown, not each
            if self._shown_at is not None and self._shown_at < len(self.log):
                self.log[self._shown_at] = _unshown(self.log[self._shown_at])
            self._shown_at = len(self.log)
        self.log.append(line)
        if step.observation is None and len(raw) <= SHORT_ANSWER and not told and message is None:
            if len(known) >= KNOWN_ANSWERS:
                known.clear()
            known[op, raw] = (step.result, step.error, step.events, step.fired)
        return step

    def _read_shown(self, value: Json, asked: tuple[list[int], list[Json]]) -> None:
        """What a process that shows its pool when asked showed of an observe line's blocks."""
        self.last_shown = None
        if self.when_asked and self.shape is not None:
            self.last_shown = protocol.read_shown(value, len(asked[0]), len(asked[1]), self.shape)

    def _note_answer(self, step: TraceStep, value: Json) -> tuple[list[tuple[str, int | None]], str | None]:
        """What an answer says besides its trace line: the collector's calls, a refusal's message."""
        told = protocol.read_told(value) if self.metrics else []
        if told:
            self.told[step.line] = told
        message = protocol.message_of(value)
        if message is not None and step.error is not None:
            self.messages[step.line - 1] = message
        return told, message

    def _log_observed(self, args: dict[str, Json], observed: Observed) -> None:
        """An observe line, as exchanged (:meth:`trace` spells it as the queries it stands for)."""
        self.log.append({"op": protocol.OBSERVE, "args": args, "result": observed, "error": None,
                         "events": [], "fired": []})

    def trace(self) -> list[dict[str, Json]]:
        """The calls answered as trace lines (an observe line as its queries), then the call the
        process failed at, if it failed."""
        return [*protocol.trace_lines(self.log), *([self.failed] if self.failed is not None else [])]

    def _failed(self, calls: Sequence[Call], i: int, kind: str) -> None:
        if 0 <= i < len(calls):
            op, args = calls[i]
            if op == protocol.OBSERVE:  # the first query the line stands for, as a trace names it
                op, args = "get_num_free_blocks", {}
            self.failed = {"op": op, "args": args, "result": None,
                           "error": FAILED_CALL_ERRORS.get(kind, "ProtocolViolation"), "events": []}

    def replay(self, keep: int) -> None:
        """Make the process's pool the one after the first ``keep`` logged calls, by replaying them.

        For undoing a call (see :meth:`~.facade.DrivenPool.free_blocks`): only the calls that
        change the pool are sent again (queries change nothing), and the log stays as it was; a
        process that answers the same calls differently is a verdict.
        """
        self.settle()
        kept = self.log[:keep]
        changes = [line for line in kept if line["op"] not in QUERY_LINES]
        self.log = []
        self.open(again=True)
        if changes:
            self.calls([(str(line["op"]), dict(line["args"])) for line in changes])
        for old, new in zip(changes, self.log, strict=True):
            if _unshown(old) != _unshown(new):
                raise self.process.fail("nondeterministic", "answered a replay of the same calls "
                                        "differently", f"call {kept.index(old) + 1} ({old['op']})")
        now = next((line["observation"] for line in reversed(self.log) if "observation" in line), None)
        self.log = kept
        self._shown_at = max((i for i, line in enumerate(kept) if "observation" in line), default=None)
        last = max((i for i, line in enumerate(kept) if line["op"] != protocol.OBSERVE), default=None)
        if now is not None and last is not None and self._shown_at != last:
            # the log keeps only the last pool shown, which went with the undone call: the replay's
            # last is the pool after the kept calls
            if self._shown_at is not None:
                kept[self._shown_at] = _unshown(kept[self._shown_at])
            kept[last] = {**kept[last], "observation": now}
            self._shown_at = last

    # ------------------------------------------------------------ ahead of the answers

    def post(self, expects: Sequence[Expect], lines: Sequence[bytes]) -> None:
        """Send ``lines`` ahead of their answers, each with what it must be answered; check the
        answers that have come."""
        if not self.current:
            raise RuntimeError("this pool was replaced by a newer one in its process")
        self.ahead.extend(expects)

        def sent() -> list[bytes]:
            self.process.post(lines, self.name)
            return self.process.collect(self.name)

        self._receive(sent)

    def settle(self) -> None:
        """Wait for every answer still owed, each checked (a no-op when none is)."""
        if self.ahead:
            self._receive(lambda: self.process.wait(len(self.ahead), self.name))

    def _receive(self, answers: Callable[[], list[bytes]]) -> None:
        """Check the answers ``answers()`` brings; a process that fails meanwhile is a verdict
        (the answers that came before it checked first, when it hung)."""
        try:
            raws = answers()
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
        if expect.outcome is not None and expect.view is None and self._as_expected(expect, raw):
            return []
        lazy = not getattr(expect.view, "whole", False)  # an observation compared whole is read whole
        step = self._answer(expect.op, expect.args, raw, len(self.log) + 1, expect.asks, lazy, expect.show)
        if expect.outcome is None:  # an observe line
            diffs = _observed_diffs(expect.observed, step.result)
        else:
            diffs = outcome_diffs(step, expect.outcome, vllm_errors=self.vllm_errors)
            if expect.asks is not None:
                diffs += _observed_diffs(expect.observed, self.last_observed)
        if expect.shown is not None and self.last_shown is not None:  # only with an observe line or asks
            diffs += expect.shown(self.last_shown)
        if expect.outcome is None:
            return diffs
        if expect.view is not None and step.observation is not None:
            try:
                diffs += expect.view(step.observation)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError):  # an entry of another kind
                protocol.read_answer(expect.op, expect.args, protocol.decode(raw), self.header, step.line,
                                     self.shape)  # raises the reader's own message
                raise
        told = self.told.pop(step.line, [])
        if expect.told is not None and told != expect.told:
            diffs.append(f"metrics collector: recorded {show(told)}, model {show(expect.told)}")
        return diffs

    def _as_expected(self, expect: Expect, raw: bytes) -> bool:
        """Whether the answer is exactly what the model said, value for value and kind for kind
        (its events with every field as the model writes them): then it is a valid trace line by
        construction, and is logged without the trace reader reading it.  Anything else (an optional
        field left out, a hash as hex, a field of another kind, an answer that differs) is read in
        full."""
        outcome = expect.outcome
        if outcome is None:
            return False
        try:
            value = protocol.decode(raw)
        except protocol.ProtocolError:
            return False
        if type(value) is not dict or "observation" in value or not (
                _exactly(value.get("events"), outcome.events)
                and _exactly(value.get("fired", []), outcome.fired)):
            return False
        error, result = value.get("error", _MISSING), value.get("result", _MISSING)
        want = None if outcome.error is None else refusal_name(outcome.error)
        if error != want or type(result) is not type(outcome.result) or result != outcome.result:
            return False
        if type(result) is list and not set(map(type, result)) <= _INT:
            return False
        if self.metrics and not _exactly(value.get("told"), [list(t) for t in expect.told or ()]):
            return False
        observed, shown = None, None
        if expect.asks is not None:
            try:
                observed = protocol.read_observed_field(value, len(expect.asks[0]), len(expect.asks[1]))
            except protocol.ProtocolError:
                return False
            if observed != expect.observed:
                return False
        if expect.shown is not None:  # checked strictly by the view: no difference, nothing else to read
            shape = self.shape or frozenset()
            try:
                shown = value["observed"]["shown"]
                if (type(shown) is not dict or not all(f in shown for f in SHOWN if f in shape)
                        or expect.shown(shown)):
                    return False
            except (TypeError, ValueError, IndexError, KeyError, AttributeError):  # read in full instead
                return False
        self.log.append({"op": expect.op, "args": expect.args, "result": result, "error": error,
                         "events": value["events"], "fired": value.get("fired", [])})
        if observed is not None:
            self.last_observed, self.last_shown = observed, shown
            self._log_observed({"blocks": expect.asks[0], "keys": expect.asks[1]}, observed)  # type: ignore[index]
        return True

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


def _exactly(got: Json, want: Json) -> bool:
    """Equal, and of the same JSON kind throughout (``true`` is not 1, ``2.0`` not 2): an answer's
    events and notices written exactly as the model's need no other reading."""
    if type(got) is not type(want):
        return False
    if type(got) is list:
        return len(got) == len(want) and all(_exactly(g, w) for g, w in zip(got, want, strict=True))
    if type(got) is dict:
        return got.keys() == want.keys() and all(_exactly(got[k], want[k]) for k in got)
    return bool(got == want)


def _unshown(line: dict[str, Json]) -> dict[str, Json]:
    """A logged line but its observation (the log keeps only the last one shown)."""
    return {k: v for k, v in line.items() if k != "observation"}


_MISSING = object()
SHOWN = (*protocol.SHOWN_FIELDS, "index")
"""The fields a process that shows its pool when asked shows of what an observe line names: those
of its observation's fields."""
_INT = frozenset({int})


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


__all__ = ["FAILED_CALL_ERRORS", "KNOWN_ANSWERS", "SHORT_ANSWER", "Call", "Expect", "Observed", "Session"]
