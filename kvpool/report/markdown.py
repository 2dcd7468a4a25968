"""The report view drawn as GitHub-flavoured Markdown, for a PR comment or a terminal.

Markdown has no colour, so states carry a mark (✅ ❌ ⏭) and pictures of the pool
are text tables with ``*`` on what differs.  Document text is escaped outside
code so a message cannot break a table or smuggle live HTML into a comment;
code spans and fences grow longer than any backtick run inside them.

Headings stay plain (no status, no count): GitHub derives anchors from heading
text, and the summary links to ``#failures``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from kvpool.report import elements as e

__all__ = ["render"]

BLOCKS_PER_TEXT_ROW = 10
"""Blocks per text picture chunk: keeps Markdown pictures narrower than a terminal."""

STATUS_MARK = {"passed": "✅", "failed": "❌", "skipped": "⏭", "not run": "—", "not refuted": "❌"}
"""A mark per state word, so a state reads without colour."""


def render(report: e.Report) -> str:
    """The whole report; the first section sits directly under the report's title."""
    lead, *rest = report.sections
    parts = [f"# {_text(report.title)}", *MD.blocks(lead.blocks),
             *(part for s in rest for part in (f"## {_text(s.title)}", *MD.blocks(s.blocks)))]
    return "\n\n".join(parts).rstrip() + "\n"


# --------------------------------------------------------------------------
# Text.


def _text(s: str) -> str:
    """Plain text for a Markdown line or table cell: no table breaks, no live HTML."""
    out = s.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return out.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _ticks(text: str, least: int) -> str:
    """A backtick run longer than any inside ``text`` (and at least ``least`` long)."""
    return "`" * max(least, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)


def _code(s: str, in_table: bool = False) -> str:
    """An inline code span that survives backticks (and pipes, inside a table)."""
    text = s.replace("\r", " ").replace("\n", " ")
    if in_table:
        text = text.replace("|", "\\|")
    ticks, pad = _ticks(text, 1), " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(text: str) -> str:
    """A fenced block longer than any backtick run inside, so the text cannot close it."""
    ticks = _ticks(text, 3)
    return f"{ticks}\n{text.rstrip()}\n{ticks}"


class Markdown(e.Renderer):
    """Each element as Markdown; links become their text (GitHub has no anchors for them).

    ``in_table`` for table cells, where a pipe would end the cell.
    """

    side = "markdown"

    def __init__(self, in_table: bool = False) -> None:
        self.in_table = in_table

    def text(self, s: str) -> str:
        return _text(s)

    # Inline elements.

    def code(self, x: e.Code) -> str:
        return _code(x.text, self.in_table)

    def strong(self, x: e.Strong) -> str:
        return f"**{_text(x.text)}**"

    def status(self, x: e.Status) -> str:
        """A state with its mark; a loud one in bold, as it alone sinks the run."""
        word = f"**{_text(x.word)}**" if x.loud else _text(x.word)
        return f"{STATUS_MARK.get(x.word, '')} {word}".strip()

    def link(self, x: e.Link) -> str:
        return self.inline(x.content)

    def names(self, x: e.Names) -> str:
        return ", ".join(_code(n, self.in_table) for n in x.names)

    def swatch(self, x: e.Swatch) -> str:
        return _text(x.text)

    def tinted(self, x: e.Tinted) -> str:
        return _text(x.text)

    # Blocks; blocks are separated by a blank line.

    def para(self, block: e.Para) -> str:
        return self.inline(block.content)

    def heading(self, block: e.Heading) -> str:
        return f"### {_text(block.text)}"

    def listing(self, block: e.Listing) -> str:
        return "\n".join(f"{f'{i}.' if block.numbered else '-'} {self.inline(item)}"
                         for i, item in enumerate(block.items, 1))

    def table(self, block: e.Table) -> str:
        return _table([CELL.inline(h) for h in block.headers], (_row(row) for row in block.rows))

    def grid(self, grid: e.Grid) -> str:
        """A status matrix as a table; a note row repeats its short form, as cells cannot span."""
        headers = [_text(grid.corner), *(_text(f) for f in grid.fixed), *(_code(k, True) for k in grid.keys)]
        rows = []
        for row in grid.rows:
            label = CELL.inline(row.label)
            rows.append([label, *[_text(row.short)] * (len(headers) - 1)] if row.kind == "note" else
                        [f"*{label}*" if row.kind == "aside" else label, *(_cell(c) for c in row.cells)])
        return _table(headers, rows)

    def bars(self, block: e.Bars) -> str:
        return _table([CELL.inline(h) for h in block.headers],
                      ([_code(name, True), _text(count)] for name, count, _pct in block.items))

    def stats(self, block: e.Stats) -> str:
        return " · ".join(f"{_text(value)} {_text(label)}" for label, value in block.items)

    def panels(self, block: e.Panels) -> str:
        return "\n\n".join(part for panel in block.panels
                           for part in [f"{_text(panel.title)}:", *self.blocks(panel.blocks)])

    def verdict(self, verdict: e.Verdict) -> str:
        """The verdict line, then the settings and provenance as a short list."""
        facts = " · ".join(f"{_text(f.label)} {_code(f.value) if f.code else _text(f.value)}"
                           for f in verdict.facts)
        settings = ", ".join(f"{k}={v}" for k, v in verdict.settings) or "—"
        return (f"**{_text(verdict.word)}** · {facts}\n\n"
                f"- {_text(verdict.settings_label)}: {_code(settings)}\n- {self.inline(verdict.byline)}")

    def alerts(self, block: e.Alerts) -> str:
        see_anchor, see_title = block.see
        return (f"**{_text(block.lead)}** — see [{_text(see_title)}](#{see_anchor}):\n\n"
                + "\n".join(f"{i}. {self.inline(item)}" for i, item in enumerate(block.items, 1)))

    def prose(self, block: e.Prose) -> str:
        return _shift_headings(block.markdown, block.shift) if block.markdown else _text(block.empty)

    def failure(self, failure: e.Failure) -> str:
        """A failure in full: where, what, the details verbatim, then the trace step by step."""
        parts = [f"### {failure.number}. {_text(failure.title)}",
                 f"{_text(failure.phase)} · {_code(failure.case_id)} · {_text(failure.kind)} · "
                 f"{_text(failure.seconds)}\n\n**{_text(failure.message)}**"]
        if failure.details is not None:
            parts.append(_fence(failure.details))
        n = len(failure.steps)
        parts.append(f"Counterexample trace ({n} steps):" if n else _text(failure.no_trace))
        parts += [_step(s) for s in failure.steps]
        return "\n\n".join(parts)


MD, CELL = Markdown(), Markdown(in_table=True)


def _row(row: e.Row) -> list[str]:
    """A table row's cells; a group row's first cell in bold, as text has no heading cells."""
    cells = [CELL.inline(c) for c in row.cells]
    return [f"**{cells[0]}**", *cells[1:]] if row.kind == "group" and cells else cells


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub table from already-escaped cells."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(cell: e.Cell) -> str:
    """A grid cell: status mark and time; a dash for a result the run did not produce."""
    return "—" if cell is None else "" if isinstance(cell, e.Blank) else f"{cell.mark} {cell.seconds}"


def _shift_headings(text: str, by: int) -> str:
    """Nest an embedded document under the report's headings (code blocks untouched)."""
    out, fence = [], ""
    for line in text.splitlines():
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if m and (not fence or m.group(1).startswith(fence)):
            fence = "" if fence else m.group(1)
        elif not fence and re.match(r"#{1,6}\s", line):
            line = "#" * by + line
        out.append(line)
    return "\n".join(out)


# --------------------------------------------------------------------------
# Failures, traces and pictures.


def _step(step: e.StepView) -> str:
    """One trace step: the call, its outcome, what changed, and the pool afterwards."""
    lines = [f"**Step {_text(step.index)}.** {_code(step.call)} → {_code(step.outcome)}"]
    if step.changes:
        lines.append("\n".join(f"- {_code(c)}" for c in step.changes))
    if step.actual is not None and step.picture is not None:
        lines += ["Model (expected), `*` = differs from the implementation:", _fence(_picture(step.picture)),
                  "Implementation (actual):", _fence(_picture(step.actual)),
                  "Differs: " + (", ".join(_code(d) for d in step.differs) or "nothing drawn")]
    elif step.unchanged:
        lines.append("*Pool unchanged.*")
    elif step.picture is not None:
        lines.append(_fence(_picture(step.picture)))
    return "\n\n".join(lines)


PICTURE_ROWS: list[tuple[str, Callable[[e.BlockCell], str], str]] = [
    ("block", lambda b: b.id, ""),
    ("ref", lambda b: b.ref, "ref"),
    ("queue", lambda b: b.queue, "free_pos"),
    ("key", lambda b: b.key or "-", "key"),
    ("tokens", lambda b: "-" if b.tokens is None else b.tokens, "tokens"),
    ("extra", lambda b: ",".join(b.extra_keys) or "-", "extra_keys"),
    ("marks", lambda b: ",".join(b.marks) or "-", "watched"),
]
"""A text picture's rows: label, what a block shows, and the field whose difference stars it."""


def _picture(pic: e.Picture) -> str:
    """A pool picture as a text table: a row per field, a column per block; ``*`` marks differences."""
    blocks = list(pic.blocks)
    out: list[str] = []
    for start in range(0, max(len(blocks), 1), BLOCKS_PER_TEXT_ROW):
        chunk = blocks[start:start + BLOCKS_PER_TEXT_ROW]
        table = [[label] + [show(b) + ("*" if field in b.differs else "") for b in chunk]
                 for label, show, field in PICTURE_ROWS]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
        out.append("")
    star = {p: "*" if p in pic.differs else "" for p in ("free", "index", "num_free", "events")}
    index = "; ".join(f"{key} -> {blocks_}" for key, blocks_ in pic.index) or "(empty)"
    free = "None" if pic.free is None else "[" + ", ".join(pic.free) + "]"
    events = "(not observed)" if pic.events is None else "; ".join(pic.events) or "(none)"
    out += [f"{'index' + star['index']:<8}{index}",
            f"{'free' + star['free']:<8}{free} (head = next evicted)"
            f"   num_free{star['num_free']} {pic.num_free}",
            f"{'events' + star['events']:<8}{events}"]
    return "\n".join(out)
