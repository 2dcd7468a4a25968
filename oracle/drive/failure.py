"""A failure of a driven pool as a short trace file that ``kvpool check-trace`` replays.

The pool's calls were kept as trace lines as they were answered
(:class:`~.facade.Session`); the failing run's pool is the newest one whose
lines ``check-trace`` finds a difference in.  Those lines are then shrunk
against the process itself: the calls are replayed on a fresh pool, without
the queries the observation made (they change nothing), then without ever
smaller chunks of calls (delta debugging), keeping each cut after which the
replayed answers still differ from the model at the same operation.  Every
candidate is judged by ``check-trace`` on the answers the process gave to
exactly those calls, so the file written is a witness on its own: the
pool's author can replay it in their own test.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.model import QUERIES

from ..search.conform import Failure, Options, PhaseResult
from ..search.shrink import HANDS_OUT, LISTS_OF_HELD, ddmin, renamed, sources
from ..trace.check import CheckReport, check_trace
from ..trace.read import Header
from ..trace.record import Recording
from ..trace.schema import Json, show
from . import protocol
from .adapter import DriveAdapter
from .process import PoolProcess, ProcessFailure, ProcessHung
from .session import FAILED_CALL_ERRORS, Session

Phase = Callable[[Any, Options], PhaseResult]

MAX_REPLAYS = 400
"""Most replays one shrink makes (each a fresh pool and a run of calls)."""
MAX_REPLAYED_CALLS = 400_000
"""Most calls one shrink sends in all."""


@dataclass
class Capture:
    """One pool's calls, as answered: its header's pool fields and its trace lines."""

    pool: dict[str, Json]
    header: Header
    lines: list[dict[str, Json]]
    hung: bool = False

    @classmethod
    def of(cls, session: Session) -> Capture:
        hung = session.failed is not None and session.failed["error"] == FAILED_CALL_ERRORS["hang"]
        return cls(dict(session.pool), session.header, session.trace(), hung)


def write_trace(path: str | Path, pool: dict[str, Json], lines: Sequence[dict[str, Json]],
                meta: dict[str, Json] | None = None) -> None:
    """A trace file: the header of ``pool`` (with ``meta``), then ``lines``."""
    Recording(protocol.trace_header(pool, meta), list(lines), None).write(path)


def check_lines(pool: dict[str, Json], lines: Sequence[dict[str, Json]], vllm_errors: bool) -> CheckReport:
    """``check-trace`` on these lines (written to a temporary file, as an author would have them)."""
    with tempfile.TemporaryDirectory(prefix="kvpool-drive-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(path, pool, lines)
        return check_trace(path, vllm_errors=vllm_errors)


@dataclass
class Shrunk:
    """The shrink of one capture: its lines now, what they came from, and the check's verdict."""

    lines: list[dict[str, Json]]
    before: int
    report: CheckReport
    replays: int = 0
    note: str = ""
    pool: dict[str, Json] = field(default_factory=dict)
    """The pool the lines were answered by (its header's fields)."""


@dataclass
class Shrinker:
    """Shrinks captured calls against one of the adapter's copies of the command, on fresh pools
    (see the module docstring)."""

    adapter: DriveAdapter
    replays: int = 0
    sent: int = 0
    process: PoolProcess | None = field(default=None, repr=False)

    def close(self) -> None:
        """Give the process back (the adapter ends it with the others)."""
        self.process = None

    def _replay(self, cap: Capture, kept: Sequence[dict[str, Json]],
                base: list[dict[str, Json]] | None = None) -> list[dict[str, Json]] | None:
        """The calls of ``kept`` on a fresh pool, all in flight at once; the trace lines answered,
        or None when the budget is spent.  A process that fails on the way ends the lines with the
        call it failed at (its error ``ProcessCrashed``, ...); it is started again next time.

        With ``base`` (the lines ``kept`` were cut from), one call at a time, each block id they
        name replaced by the one the call that handed it out hands out now: without a call, the
        blocks handed out after it shift; this keeps a later call on "the second block that
        allocation returned" rather than on an id that now means another block, or none.
        """
        if self.replays >= MAX_REPLAYS or self.sent + len(kept) > MAX_REPLAYED_CALLS:
            return None
        if self.process is None:
            self.process = self.adapter.borrow()
        self.replays += 1
        self.sent += len(kept)
        session = Session(self.process, cap.pool, cap.header, None, None)
        try:
            session.open()
            if base is None:
                if kept:
                    session.calls([(str(line["op"]), dict(line["args"])) for line in kept])
                return session.trace()
            at = {id(line): i for i, line in enumerate(base)}
            found = sources(base)
            handed: dict[int, list[int]] = {}
            for line in kept:
                i = at[id(line)]
                op = str(line["op"])
                args = renamed(dict(line["args"]), found[i], handed, droppable=op in LISTS_OF_HELD)
                (step,) = session.calls([(op, args)])
                if op in HANDS_OUT and step.error is None and isinstance(step.result, list):
                    handed[i] = step.result
        except (ProcessFailure, ProcessHung):
            pass
        return session.trace()

    def shrink(self, cap: Capture) -> Shrunk:
        """The shortest calls found that still differ from the model where ``cap`` does."""
        vllm = self.adapter.vllm_errors
        report = check_lines(cap.pool, cap.lines, vllm)
        if report.divergence is None:
            return Shrunk(cap.lines, len(cap.lines), report, note="check-trace finds no difference "
                          "in this pool's calls alone")
        target = report.divergence.op
        lines = cap.lines[:report.divergence.step]
        if cap.hung:
            return Shrunk(lines, len(cap.lines), report, note="not shrunk: the process hangs")

        def judged(answered: list[dict[str, Json]] | None) -> list[dict[str, Json]] | None:
            if answered is None:
                return None
            got = check_lines(cap.pool, answered, vllm)
            if got.divergence is None or got.divergence.op != target:
                return None
            return answered[:got.divergence.step]

        def as_sent(kept: Sequence[dict[str, Json]]) -> list[dict[str, Json]] | None:
            return judged(self._replay(cap, kept))

        if lines and lines[-1].get("error") in FAILED_CALL_ERRORS.values() and as_sent(lines) is None:
            # the process failed, but not where these calls alone make it fail: what made it fail
            # is more than them (its earlier pools, its age), and no cut of them is a witness
            return Shrunk(lines, len(cap.lines), report, self.replays, note="not shrunk: replayed on "
                          "their own, these calls do not make the process fail there")
        fewer = [line for line in lines[:-1] if line["op"] not in QUERIES] + lines[-1:]
        lines = (as_sent(fewer) if len(fewer) < len(lines) else None) or lines
        lines = ddmin(lines, as_sent)  # fast: all calls of a replay in flight at once
        if len(lines) > 2:  # then one call at a time, each block id followed to its source
            base = [lines]
            lines = ddmin(lines, lambda kept: judged(self._replay(cap, kept, base[0])), base)
        final = check_lines(cap.pool, lines, vllm)
        return Shrunk(lines, len(cap.lines), final, self.replays)


# ------------------------------------------------------------------- a run


@dataclass
class DriveRun:
    """Both phases against a driven pool; each failure kept as a (shrunk) trace file.

    :meth:`phase` wraps a phase function: a hang (which passes through the
    lockstep and Hypothesis unshrunk, :class:`~.process.ProcessHung`) becomes
    the phase's failure, and a failed phase's pools are captured before the
    next phase makes its own.
    """

    adapter: DriveAdapter
    trace_dir: Path = Path(".")
    shrink: bool = True
    captured: dict[str, list[Capture]] = field(default_factory=dict)
    written: dict[str, tuple[Path, Shrunk]] = field(default_factory=dict)

    def phase(self, run: Phase) -> Phase:
        def guarded(adapter: Any, opts: Options) -> PhaseResult:
            try:
                result = run(adapter, opts)
            except (ProcessHung, ProcessFailure) as exc:  # a hang passes everything, unshrunk
                verdict = exc.verdict
                name = "campaign" if "campaign" in run.__name__ else "machine"
                result = PhaseResult(name, False, 0.0, 0, Failure(
                    "process", verdict.format().splitlines()[0], verdict.format(), [], opts.seed,
                    cause=exc))
            if not result.ok:
                self.captured[result.name] = [Capture.of(p.session) for p in reversed(self.adapter.recent)]
            return result

        guarded.__name__ = run.__name__
        return guarded

    def traces(self, meta: dict[str, Json]) -> dict[str, tuple[Path, Shrunk]]:
        """Write each failed phase's trace (shrunk unless asked not to); path and shrink by phase."""
        for name, captures in self.captured.items():
            shrinker = Shrinker(self.adapter)
            try:
                chosen = self._choose(captures, shrinker)
            finally:
                shrinker.close()
            if chosen is None:
                continue
            cap, shrunk = chosen
            shrunk.pool = cap.pool
            path = self.trace_dir / f"kvpool-drive-{name}.jsonl"
            write_trace(path, cap.pool, shrunk.lines, {**meta, "phase": name,
                                                       "calls_before_shrinking": shrunk.before})
            shrunk.report = check_trace(path, vllm_errors=self.adapter.vllm_errors)  # as written
            self.written[name] = (path, shrunk)
        return self.written

    def _choose(self, captures: list[Capture], shrinker: Shrinker) -> tuple[Capture, Shrunk] | None:
        """The newest capture check-trace finds a difference in, shrunk; else the newest as it is."""
        vllm = self.adapter.vllm_errors
        for cap in captures:
            report = check_lines(cap.pool, cap.lines, vllm) if cap.lines else None
            if report is None or report.divergence is None:
                continue
            if not self.shrink:
                return cap, Shrunk(cap.lines[:report.divergence.step], len(cap.lines), report,
                                   note="not shrunk (--no-shrink)")
            return cap, shrinker.shrink(cap)
        if captures and captures[0].lines:
            cap = captures[0]
            return cap, Shrunk(cap.lines, len(cap.lines), check_lines(cap.pool, cap.lines, vllm),
                               note="check-trace finds no difference in one pool's calls alone (the "
                                    "lockstep compared two pools at once)")
        return None


def short_line(number: int, line: dict[str, Json], model: Sequence[str] | None = None) -> str:
    """One trace line in one short line: ``3 free_blocks(block_ids=[2, 1]) -> null``, the pool's
    answer; ``model``: how the model's differs (``check-trace``'s words), shown beside it."""
    args = ", ".join(f"{k}={_short(v)}" for k, v in dict(line["args"]).items())
    outcome = f"raised {line['error']}" if line.get("error") else _short(line.get("result"))
    events = [e.get("type") for e in line.get("events") or () if isinstance(e, dict)]
    fired = line.get("fired") or []
    tail = f" -> {outcome}"
    if events:
        tail += f"; events {', '.join(str(e) for e in events)}"
    if fired:
        tail += f"; fired {_short(fired)}"
    if model:
        tail += "   <- the model differs: " + "; ".join(model)
    room = max(40, 150 - len(tail))  # the arguments give way: what came of the call stays
    return f"{number:>3} {line['op']}({args if len(args) <= room else args[:room - 3] + '...'}){tail}"


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _short(value: Json) -> str:
    if isinstance(value, dict) and "request_id" in value:
        tokens, hashes = value.get("all_token_ids") or [], value.get("block_hashes") or []
        extra = [k for k in ("lora", "mm", "cache_salt", "session_id") if value.get(k)]
        return (f"<request {value['request_id']}: {_count(len(tokens), 'token')}, "
                f"{_count(len(hashes), 'hash', 'hashes')}"
                + (f", {'+'.join(extra)}" if extra else "") + ">")
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "[" + ", ".join(str(v.get("type")) for v in value) + "]"
    if isinstance(value, str) and len(value) > 16:
        return f"…{value[-10:]}"
    return show(value)


__all__ = ["MAX_REPLAYED_CALLS", "MAX_REPLAYS", "Capture", "DriveRun", "Shrinker", "Shrunk", "check_lines",
           "short_line", "write_trace"]
