"""A pool in another process: lines to its stdin, lines from its stdout, and no trust.

The process may crash, hang, answer garbage or too much, or log on stdout;
whatever it does, the caller gets a :class:`Verdict` that names the call and
shows the last lines of the process's stderr, within a per-call timeout, and
the process is killed (its whole process group) on a timeout, on
:meth:`PoolProcess.close`, when the Python process exits, and, on Linux, when
the Python process dies without running its exit handlers.

Both pipes are non-blocking and served by one ``selectors`` loop, so many
calls can be in flight at once (:meth:`PoolProcess.exchange`): a process that
stops reading its stdin while its answers fill stdout never deadlocks us.
stderr is drained by a thread into a bounded ring buffer, so a chatty process
never blocks on it and never fills our memory.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

STDERR_LINES = 30
"""How many of the process's last stderr lines a verdict shows."""
STDERR_LINE_CHARS = 300
MAX_LINE = 1 << 26
"""Longest answer line accepted (64 MiB): a process that never ends a line is stopped there."""
HIGH_WATER = 1 << 20
"""Bytes of posted lines that may wait to be written before a post waits for the process."""
BATCH = 1 << 15
"""Bytes of posted lines gathered before they are written: each write to the pipe wakes the
process (on a busy machine a wake-up costs more than the lines), so lines go in batches."""
GRACE = 10.0
"""Seconds a process has to exit once its stdin is closed, before it is killed: as long as the
default wait for an answer, so that a loaded machine slowing an interpreter's exit is no verdict."""


@dataclass
class Verdict:
    """What a process did wrong, readably: one line, the call it happened at, its stderr tail."""

    kind: str
    """``start``, ``crash``, ``hang``, ``garbage``, ``stdout logging``, ``version``,
    ``extra output``, ``refused``, ``nondeterministic``, ``exit``."""
    what: str
    call: str | None = None
    """``call 17 (free_blocks)``, ``the header``; None: between calls."""
    stderr: list[str] = field(default_factory=list)
    command: str = ""
    line: int | None = None
    """The line of the process's input (from 1, since it started) it happened at."""

    def format(self) -> str:
        where = f" at {self.call}" if self.call else ""
        if self.line is not None:
            where += (f" (line {self.line} of its input)" if self.call
                      else f" at line {self.line} of its input")
        said = HEADLINES.get(self.kind, f"the pool process failed ({self.kind})")
        lines = [f"{said}{where}: {self.what}", f"  the process: {self.command}"]
        if self.stderr:
            lines.append(f"  last {len(self.stderr)} line(s) of its stderr:")
            lines += [f"    | {line}" for line in self.stderr]
        else:
            lines.append("  its stderr was empty")
        return "\n".join(lines)


HEADLINES = {
    "start": "the pool process did not start", "crash": "the pool process crashed",
    "hang": "the pool process hung", "garbage": "the pool process answered garbage",
    "stdout logging": "the pool process logged on stdout",
    "version": "the pool process speaks another protocol version",
    "extra output": "the pool process wrote a line no call asked for",
    "refused": "the pool process refused to make the pool",
    "nondeterministic": "the pool process answered the same calls differently",
    "exit": "the pool process did not end cleanly",
}
"""How a verdict of each kind begins."""


class _Failed(BaseException):
    """A process that misbehaved, with its :class:`Verdict` as the message."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.format())
        self.verdict = verdict
        self.answered: list[bytes] = []
        """The answers read before the failure, when it came amid several calls."""


class ProcessFailure(_Failed, Exception):
    """The process failed at a call (crash, garbage, ...): a failure of the pool under test.

    An ``Exception``, so the state machine shrinks it like any divergence (each
    attempt starts a fresh process).
    """


class ProcessHung(_Failed):
    """The process did not answer within the timeout: everything stops at once.

    Not an ``Exception`` on purpose: shrinking would wait out the timeout on
    every attempt, so this passes through the lockstep and Hypothesis unshrunk.
    """


class StderrTail:
    """The last lines a stream wrote, drained by a daemon thread (bounded)."""

    def __init__(self, stream: object) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._partial = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: object) -> None:
        read = getattr(stream, "read1", None) or getattr(stream, "read")  # noqa: B009
        with contextlib.suppress(OSError, ValueError):
            while True:
                chunk: bytes = read(65536)
                if not chunk:
                    break
                with self._lock:
                    *done, self._partial = (self._partial + chunk).split(b"\n")
                    self._partial = self._partial[-STDERR_LINE_CHARS * 4:]
                    for raw in done[-STDERR_LINES:]:
                        self._lines.append(_shown(raw))

    def tail(self, wait: float = 0.0) -> list[str]:
        """The last lines; ``wait`` seconds for the writer to finish first (after an exit)."""
        if wait:
            self._thread.join(wait)
        with self._lock:
            out = list(self._lines)
            if self._partial.strip():
                out.append(_shown(self._partial))
        return out[-STDERR_LINES:]


def _shown(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").rstrip("\r")
    return text if len(text) <= STDERR_LINE_CHARS else text[:STDERR_LINE_CHARS] + " [...]"


_LIVE: set[PoolProcess] = set()
"""Every process started and not yet killed (held here, so none is forgotten unkilled)."""


@atexit.register
def _kill_all() -> None:
    """No process outlives us: kill whatever is still running at exit."""
    for proc in list(_LIVE):
        proc.kill()


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up in this process: the child must not load anything between
    fork and exec (other threads may hold the loader's or the allocator's locks)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        found: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return found


_PRCTL = _prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """In the child, before exec: be killed when the parent dies, even by SIGKILL (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class PoolProcess:
    """One child process speaking in lines; see the module docstring.

    Every method that talks to the process raises :class:`ProcessFailure` or
    :class:`ProcessHung` (and kills the process) when it misbehaves.
    """

    def __init__(self, argv: Sequence[str], timeout: float = 10.0, *, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.command = " ".join(self.argv)
        self.timeout = timeout
        self.cwd, self.env = cwd, env
        self.popen: subprocess.Popen[bytes] | None = None
        self._buffer = bytearray()
        self._stderr: StderrTail | None = None
        self._poller: select.poll | None = None
        self._out = bytearray()
        """Lines posted and not yet written (the pipe was full)."""
        self._answers: collections.deque[bytes] = collections.deque()
        """Answer lines read and not yet taken."""
        self.owed = 0
        """Lines written (or waiting to be) whose answers were not taken yet."""
        self.lines_read = 0
        self.lines_sent = 0
        """Lines sent to this copy of the process (its input line count); answers taken."""
        self.total_sent = 0
        """Lines sent to every copy started, in all."""

    # ---------------------------------------------------------------- life

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        """Start the command (a no-op when running); a command that cannot start is a verdict."""
        if self.alive:
            return
        self.kill()
        try:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=self.cwd, env=self.env, start_new_session=True, bufsize=0,
                preexec_fn=_die_with_parent if _PRCTL is not None else None)
        except OSError as exc:
            self.popen = None
            raise ProcessFailure(Verdict("start", f"cannot start: {exc.strerror or exc}",
                                         command=self.command)) from None
        stdin, stdout = self.popen.stdin, self.popen.stdout
        if stdin is None or stdout is None:  # pragma: no cover - PIPE always gives both
            raise RuntimeError("subprocess without pipes")
        os.set_blocking(stdin.fileno(), False)
        os.set_blocking(stdout.fileno(), False)
        self._stderr = StderrTail(self.popen.stderr)
        self._poller = select.poll()  # stdout always; stdin while a write waits for room
        self._poller.register(stdout.fileno(), select.POLLIN)
        self._buffer.clear()
        self._out.clear()
        self._answers.clear()
        self.owed = self.lines_read = self.lines_sent = 0
        _LIVE.add(self)

    def kill(self) -> None:
        """Kill the process and its process group, at once; close the pipes."""
        popen, self.popen = self.popen, None
        if popen is None:
            return
        _LIVE.discard(self)
        if popen.returncode is None:  # unreaped: its id still names its group, and only it
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(5)
        for pipe in (popen.stdin, popen.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._poller = None

    def close(self) -> Verdict | None:
        """End of stdin: the process must exit, having written nothing more.

        Returns what it did wrong then (more output, no exit within
        :data:`GRACE` seconds, a non-zero status), or None; it is gone either way.
        """
        popen = self.popen
        if popen is None:
            return None
        with contextlib.suppress(OSError):
            if popen.stdin is not None:
                popen.stdin.close()
        deadline = time.monotonic() + GRACE
        self._split()  # answers still owed (left unread) are not extra; any line after them is
        owed_lines = max(0, self.owed - len(self._answers))
        extra = b"".join(a + b"\n" for a in list(self._answers)[self.owed:]) + bytes(self._buffer)
        fd = popen.stdout.fileno() if popen.stdout is not None else -1
        while fd >= 0 and time.monotonic() < deadline and len(extra) < 4096 + owed_lines * 4096:
            ready = selectors.DefaultSelector()
            ready.register(fd, selectors.EVENT_READ)
            events = ready.select(max(0.0, deadline - time.monotonic()))
            ready.close()
            if not events:
                break
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not chunk:
                break
            extra += chunk
        status = _exit_status(popen, max(0.0, deadline - time.monotonic()))
        if owed_lines:  # the answers still owed, as far as they came: not extra
            extra = b"\n".join(extra.split(b"\n")[owed_lines:])
        verdict = None
        if extra.strip():
            verdict = self._verdict("extra output", "after its last answer, at the end of its "
                                    f"stdin: {_shown(extra.splitlines()[0])!r}")
        elif status is None:
            verdict = self._verdict("exit", f"did not exit within {GRACE:g}s of the end of its "
                                    "stdin (killed)")
        elif status != 0:
            verdict = self._verdict("exit", f"exited with status {status} at the end of its stdin")
        self.kill()
        return verdict

    # ------------------------------------------------------------ talking

    def exchange(self, lines: Sequence[bytes], names: Callable[[int], str]) -> list[bytes]:
        """Send ``lines`` (each ending in a newline) and read one answer line for each.

        All may be in flight at once; ``names(i)`` names the ``i``-th for a
        verdict (``call 17 (free_blocks)``).  Each answer must come within the
        timeout of the one before it (of the start, for the first).  Nothing
        else may be in flight (see :meth:`post`).
        """
        if self.owed:
            raise RuntimeError("exchange with answers still owed: wait for them first")
        self.post(lines, names)
        return self.wait(len(lines), names)

    def post(self, lines: Sequence[bytes], names: Callable[[int], str]) -> None:
        """Send ``lines`` without waiting for their answers (pipelined): written as far as the pipe
        takes them now, the rest with the next :meth:`post`, :meth:`collect` or :meth:`wait`
        (a post blocks only while more than :data:`HIGH_WATER` bytes wait to be written).
        ``names(i)`` names the ``i``-th line owed an answer, oldest first."""
        if self.popen is None or self._poller is None:
            raise ProcessFailure(self._verdict("crash", "is not running", names(0)))
        if not self.owed and (self._buffer or self._poller.poll(0)):
            self._fill(names(0))
            if self._buffer:
                raise self._unasked("before it, a line no call asked for", names(0))
        self._out += b"".join(lines)
        self.owed += len(lines)
        self.lines_sent += len(lines)
        self.total_sent += len(lines)
        if len(self._out) >= BATCH:  # each write wakes the process: write many lines at once
            self._pump(names, 0, block=len(self._out) > HIGH_WATER)

    def collect(self, names: Callable[[int], str]) -> list[bytes]:
        """The answers that have come, oldest first, without waiting (and once a batch of lines
        waits, written)."""
        if len(self._out) >= BATCH or (self._poller is not None and self._poller.poll(0)):
            self._pump(names, 0, block=False)
        return self._take(min(len(self._answers), self.owed))

    def wait(self, count: int, names: Callable[[int], str]) -> list[bytes]:
        """The next ``count`` answers owed, oldest first, waiting for them (each within the
        timeout of the one before)."""
        self._pump(names, count, block=True)
        return self._take(count)

    def _take(self, count: int) -> list[bytes]:
        out = [self._answers.popleft() for _ in range(count)]
        self.owed -= count
        self.lines_read += count
        return out

    def _pump(self, names: Callable[[int], str], need: int, *, block: bool) -> None:
        """Write what waits to be written and read what has come: until ``need`` answers are in
        and at most :data:`HIGH_WATER` bytes wait (``block``, each answer within the timeout of the
        one before), or once without waiting."""
        popen, poller = self.popen, self._poller
        if popen is None or poller is None or popen.stdin is None or popen.stdout is None:
            raise ProcessFailure(self._verdict("crash", "is not running", names(len(self._answers))))
        out_fd, in_fd = popen.stdout.fileno(), popen.stdin.fileno()
        answers = self._answers
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                if self._out:
                    self._out = bytearray(self._write(in_fd, memoryview(self._out), names(len(answers))))
                if not block:
                    while poller.poll(0):
                        self._fill(names(len(answers)))
                had = len(answers)
                self._split()  # lines beyond those owed stay: the caller judges the answers first
                if len(self._buffer) > MAX_LINE:
                    raise self.fail("garbage", f"wrote more than {MAX_LINE} bytes without ending "
                                     "the line", names(len(answers)))
                if not block or (len(answers) >= need and len(self._out) <= HIGH_WATER):
                    return
                now = time.monotonic()
                if len(answers) > had:
                    deadline = now + self.timeout
                if deadline <= now:
                    raise ProcessHung(self._verdict("hang", f"gave no answer within {self.timeout:g}s "
                                                    "(killed)", names(len(answers))))
                if self._out:
                    poller.register(in_fd, select.POLLOUT)
                try:
                    events = poller.poll((deadline - now) * 1000)
                finally:
                    if self._out:
                        with contextlib.suppress(KeyError, ValueError):
                            poller.unregister(in_fd)
                for fd, _event in events:
                    if fd == out_fd:
                        self._fill(names(len(answers)))
        except _Failed as exc:
            exc.answered = list(answers)[:self.owed]  # what came before, for the trace of the failure
            answers.clear()
            raise

    def _split(self) -> None:
        """Move the complete lines read into the answers."""
        buffer = self._buffer
        while (cut := buffer.find(b"\n")) >= 0:
            self._answers.append(bytes(buffer[:cut]))
            del buffer[:cut + 1]

    def check_unasked(self, name: str) -> None:
        """Fail if a line no call asked for came in the reads that brought the answers.

        The caller checks the answers first: a log line read as an answer is reported as what it
        is, and the line after it, pushed one place on, is not what goes wrong first."""
        if len(self._answers) > self.owed or (self._buffer and not self.owed):
            raise self._unasked("more lines than calls came back", name)

    def _unasked(self, what: str, name: str) -> ProcessFailure:
        """The failure for output no call asked for, left in the buffer: its first line shown."""
        first = (self._answers[self.owed] if len(self._answers) > self.owed
                 else bytes(self._buffer).split(b"\n")[0])
        return self.fail("extra output", f"{what} (a second answer to a call, or logging on "
                          f"stdout?): {_shown(first)!r}", name)

    def _write(self, fd: int, pending: memoryview, name: str) -> memoryview:
        if not pending:
            return pending
        try:
            sent = os.write(fd, pending)
        except BlockingIOError:
            return pending
        except (BrokenPipeError, ConnectionResetError):
            raise self._exited(name) from None
        return pending[sent:]

    def _fill(self, name: str) -> None:
        popen = self.popen
        if popen is None or popen.stdout is None:
            raise self._exited(name)
        try:
            chunk = os.read(popen.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            raise self._exited(name)
        self._buffer += chunk

    # ------------------------------------------------------------ verdicts

    def _verdict(self, kind: str, what: str, call: str | None = None, line: int | None = None) -> Verdict:
        """A verdict; the process is killed first (its stream can no longer be trusted), so that
        its stderr ends and every line it wrote before is in the tail.  ``line``: the input line
        (None: the first one whose answer has not come)."""
        if line is None and self.lines_sent:
            line = min(self.lines_read + len(self._answers) + 1, self.lines_sent)
        self.kill()
        tail = self._stderr.tail(wait=1.0) if self._stderr is not None else []
        return Verdict(kind, what, call, tail, self.command, line)

    def fail(self, kind: str, what: str, call: str | None, line: int | None = None) -> ProcessFailure:
        """A verdict for the caller, as an exception (the protocol layer judges the lines too:
        ``line``, the one judged)."""
        return ProcessFailure(self._verdict(kind, what, call, line))

    def _exited(self, call: str) -> ProcessFailure:
        popen = self.popen
        status = None if popen is None else _exit_status(popen, 1.0)
        if status is None:
            what = "closed its stdout (still running: killed)"
        elif status < 0:
            what = f"was killed by signal {-status} ({_signal_name(-status)})"
        else:
            what = f"exited with status {status}"
        if self._buffer:
            what += f", leaving an unfinished line {_shown(bytes(self._buffer))!r}"
        return ProcessFailure(self._verdict("crash", what, call))


def _exit_status(popen: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit status within ``timeout`` seconds (negative: the signal), None if still running.

    The process is left unreaped, so that its id still names its process group
    when :meth:`PoolProcess.kill` ends the group (no other process can have it yet).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already
            return popen.returncode
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


__all__ = ["GRACE", "MAX_LINE", "PoolProcess", "ProcessFailure", "ProcessHung", "StderrTail", "Verdict"]
