"""What ``kvpool verify`` shows while it runs: plain lines in CI, a bar per phase on a terminal."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # a phase reports its progress; the progress only reads its figures
    from .phases import Phase


class Progress:
    """Plain progress lines: what a CI log should show."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def start(self, phase: str, total: int) -> None:
        print(f"== {phase} ({total} {'case' if total == 1 else 'cases'})", file=self.out, flush=True)

    def advance(self, note: str = "") -> None:
        if note:
            print(f"   {note}", file=self.out, flush=True)

    def done(self, phase: Phase) -> None:
        print(f"   {phase.name}: {_phase_line(phase)}", file=self.out, flush=True)

    def close(self) -> None:
        pass


class RichProgress(Progress):
    """A bar per phase on a terminal (``rich``)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        # lazy: rich only when a terminal shows progress
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bars

        self.console = Console(file=out)
        self.bars = Bars(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                         console=self.console, transient=False)
        self.bars.start()
        self.task: Any = None

    def start(self, phase: str, total: int) -> None:
        self.task = self.bars.add_task(phase, total=max(total, 1), note="")

    def advance(self, note: str = "") -> None:
        self.bars.update(self.task, advance=1, note=note[:60])

    def done(self, phase: Phase) -> None:
        self.bars.update(self.task, completed=self.bars.tasks[-1].total,
                         note=("[green]" if phase.ok else "[red]") + _phase_line(phase))

    def close(self) -> None:
        self.bars.stop()


def make_progress(out: TextIO, plain: bool | None = None) -> Progress:
    """Bars on a terminal, plain lines in CI (no TTY, or ``CI=true``) or without rich."""
    if plain is None:
        plain = not out.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not plain:
        try:
            return RichProgress(out)
        except ImportError:
            pass
    return Progress(out)


def _phase_line(phase: Phase) -> str:
    if phase.skipped:
        return "skipped"
    bad = sum(not c.ok for c in phase.cases)
    status = "ok" if not bad else f"FAILED ({bad} of {len(phase.cases)})"
    return f"{status}, {len(phase.cases)} cases in {phase.seconds:.1f}s"


__all__ = ["Progress", "RichProgress", "make_progress"]
