"""The report view drawn as one self-contained HTML5 page.

Reports are read on machines without network and messages carry anything a
pool printed, so the page has inline CSS only (``style.css``, package data), no
scripts, no fonts or images from anywhere, and every string from the view goes
through :func:`escape`.  Colour carries state here (badges, coloured grid cells,
outlined differences), which is why this renderer words less than Markdown.

The class names are the stylesheet's vocabulary and, with the section ids and
``data-*`` attributes, what the tests and the browser check look for: keep them.
"""

from __future__ import annotations

from importlib import resources

from kvpool.report import elements as e
from kvpool.report.markup import code, escape, markdown_to_html, table

__all__ = ["render"]

BADGE = {"passed": "pass", "failed": "fail", "proven": "pass", "counterexample": "fail", "unknown": "warn",
         "not refuted": "fail"}
"""Badge colour per state word; anything else (skipped, not run) is grey."""

ROW_CLASS = {"group": "target", "sub": "sub", "note": "ne", "aside": "enabled"}
"""Row kinds as the stylesheet's class names."""


def render(report: e.Report) -> str:
    """The page: a header with the verdict and a link per section, then the sections."""
    nav = "".join(f'<a href="#{escape(s.id)}">{escape(s.nav)}</a>' for s in report.sections)
    title = escape(report.title)
    css = resources.files("kvpool.report").joinpath("style.css").read_text(encoding="utf-8")
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title><style>\n{css}</style></head>"
            f"<body><header><h1>{title}</h1><nav>{nav}</nav></header>"
            f"<main>{''.join(_section(s) for s in report.sections)}</main></body></html>\n")


def _section(section: e.Section) -> str:
    """A section with a stable id; its title carries the count and state badge."""
    title = section.title if section.count is None else f"{section.title} ({section.count})"
    badge = f" {_badge(section.status)}" if section.status else ""
    return (f'<section id="{escape(section.id)}"><h2>{escape(title)}{badge}</h2>'
            f"{HTML.join(section.blocks)}</section>")


def _badge(word: str) -> str:
    """A coloured state pill: green passed, red failed, grey skipped."""
    return f'<span class="badge {BADGE.get(word, "skip")}">{escape(word)}</span>'


class Html(e.Renderer):
    """Each element as HTML, escaped."""

    side = "html"

    def text(self, s: str) -> str:
        return escape(s)

    def join(self, blocks: tuple[e.Block, ...]) -> str:
        """Blocks one after another."""
        return "".join(self.blocks(blocks))

    # Inline elements.

    def code(self, x: e.Code) -> str:
        return code(x.text)

    def strong(self, x: e.Strong) -> str:
        return f"<b>{escape(x.text)}</b>"

    def status(self, x: e.Status) -> str:
        return _badge(x.word)

    def link(self, x: e.Link) -> str:
        return f'<a href="#{escape(x.anchor)}">{self.inline(x.content)}</a>'

    def names(self, x: e.Names) -> str:
        return " ".join(code(n) for n in x.names)

    def swatch(self, x: e.Swatch) -> str:
        return f'<span class="legend st-{escape(x.status)}">{escape(x.text)}</span>'

    def tinted(self, x: e.Tinted) -> str:
        return f'<span class="{"yes" if x.tone == "good" else "muted"}">{escape(x.text)}</span>'

    # Blocks.

    def para(self, block: e.Para) -> str:
        cls = ' class="muted"' if block.muted else ""
        return f"<p{cls}>{self.inline(block.content)}</p>"

    def heading(self, block: e.Heading) -> str:
        anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
        return f"<h3{anchor}>{escape(block.text)}</h3>"

    def listing(self, block: e.Listing) -> str:
        tag = "ol" if block.numbered else "ul"
        cls = f' class="{escape(block.style)}"' if block.style else ""
        return f"<{tag}{cls}>" + "".join(f"<li>{self.inline(i)}</li>" for i in block.items) + f"</{tag}>"

    def table(self, block: e.Table) -> str:
        head = "".join(f"<th>{self.inline(h)}</th>" for h in block.headers)
        return (f'<table class="{escape(block.style)}"><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(self._row(r) for r in block.rows)}</tbody></table>')

    def _row(self, row: e.Row) -> str:
        """A table row; a group row's first cell is its heading."""
        cells = [self.inline(c) for c in row.cells]
        cls = f' class="{ROW_CLASS[row.kind]}"' if row.kind else ""
        first = f"<th>{cells[0]}</th>" if row.kind == "group" and cells else ""
        rest = cells[1:] if first else cells
        return f"<tr{cls}>{first}" + "".join(f"<td>{c}</td>" for c in rest) + "</tr>"

    def grid(self, grid: e.Grid) -> str:
        """A status matrix; a note row spans the table with its long form."""
        head = "".join(f"<th>{escape(c)}</th>" for c in (grid.corner, *grid.fixed, *grid.keys))
        rows = []
        for row in grid.rows:
            cls = f' class="{ROW_CLASS[row.kind]}"' if row.kind else ""
            body = (f'<td colspan="{len(grid.fixed) + len(grid.keys)}">{escape(row.long)}</td>'
                    if row.kind == "note" else "".join(_cell(c) for c in row.cells))
            rows.append(f"<tr{cls}><th>{self.inline(row.label)}</th>{body}</tr>")
        return (f'<div class="scroll"><table class="matrix"><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(rows)}</tbody></table></div>')

    def bars(self, block: e.Bars) -> str:
        return table([self.inline(h) for h in block.headers] + [""], (
            [code(name), escape(count), f'<span class="bar" style="width:{pct:.1f}%"></span>']
            for name, count, pct in block.items), "bars")

    def stats(self, block: e.Stats) -> str:
        return ('<div class="stats">' + "".join(
            f'<div class="stat"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for k, v in block.items)
            + "</div>")

    def panels(self, block: e.Panels) -> str:
        return ('<div class="cols">' + "".join(
            f"<div><h3>{escape(p.title)}</h3>{self.join(p.blocks)}</div>" for p in block.panels) + "</div>")

    def verdict(self, verdict: e.Verdict) -> str:
        """The verdict banner, the settings as chips, and where the run came from."""
        facts = "".join(f"<span>{escape(f.label)} <b>{escape(f.value)}</b></span>" for f in verdict.facts)
        chips = "".join(f'<span class="chip">{escape(k)}=<b>{escape(v)}</b></span>'
                        for k, v in verdict.settings)
        return (f'<div class="verdict {"pass" if verdict.ok else "fail"}"><span class="big">'
                f"{escape(verdict.word)}</span>{facts}</div>"
                f'<p class="budget">{escape(verdict.settings_label)} {chips}</p>'
                f'<p class="muted">{self.inline(verdict.byline)}</p>')

    def alerts(self, block: e.Alerts) -> str:
        return (f'<div class="failing-list"><b>{escape(block.lead)}:</b><ol>'
                + "".join(f"<li>{self.inline(i)}</li>" for i in block.items) + "</ol></div>")

    def prose(self, block: e.Prose) -> str:
        body = (markdown_to_html(block.markdown, shift=block.shift) if block.markdown
                else f'<p class="muted">{escape(block.empty)}</p>')
        return f'<div class="prose">{body}</div>'

    def failure(self, failure: e.Failure) -> str:
        """A failing case in full: message, details, and its counterexample trace."""
        details = (f'<pre class="details">{escape(failure.details)}</pre>' if failure.details is not None
                   else "")
        steps = (f"<p>Counterexample, {len(failure.steps)} step(s):</p>"
                 f'<ol class="trace">{"".join(_step(s) for s in failure.steps)}</ol>' if failure.steps
                 else f'<p class="muted">{escape(failure.no_trace)}</p>')
        return (f'<article class="failure" id="{escape(failure.anchor)}"><h3>{failure.number}. '
                f'{escape(failure.title)} <span class="badge fail">{escape(failure.kind)}</span></h3>'
                f'<p class="muted">{escape(failure.phase)} · {code(failure.case_id)} · '
                f"{escape(failure.seconds)}</p>"
                f'<p class="message">{escape(failure.message)}</p>{details}{steps}</article>')


HTML = Html()


def _cell(cell: e.Cell) -> str:
    """A grid cell coloured by status; a failed one links to its counterexample."""
    if cell is None or isinstance(cell, e.Blank):
        return f'<td class="na">{"—" if cell is None else ""}</td>'
    text = f'{escape(cell.mark)} <span class="t">{escape(cell.seconds)}</span>'
    if cell.link:
        text = f'<a href="#{escape(cell.link)}">{text}</a>'
    return f'<td class="st-{escape(cell.status)}" title="{escape(cell.status)}">{text}</td>'


# --------------------------------------------------------------------------
# Traces and pictures.


def _step(step: e.StepView) -> str:
    """One trace step; the diverging one draws model and implementation side by side."""
    diverging = step.actual is not None
    changes = "".join(f"<li>{code(c)}</li>" for c in step.changes)
    head = (f'<div class="step-head"><span class="step-no">{escape(step.index)}</span>'
            f'{code(step.call)} <span class="arrow">→</span> '
            f'<code class="outcome">{escape(step.outcome)}</code>'
            + (' <span class="badge fail">diverges here</span>' if diverging else "") + "</div>")
    body = f'<ul class="changes">{changes}</ul>' if changes else ""
    if step.actual is not None and step.picture is not None:
        body += ('<div class="picture-pair">'
                 f'<div class="side"><h5>model (expected)</h5>{_picture(step.picture, "model")}</div>'
                 f'<div class="side"><h5>implementation (actual)</h5>'
                 f'{_picture(step.actual, "implementation")}</div></div>'
                 '<p class="differs-list">differs: ' + " ".join(code(d) for d in step.differs) + "</p>")
    elif step.unchanged:
        body += '<p class="unchanged muted">pool unchanged</p>'
    elif step.picture is not None:
        body += _picture(step.picture, "model")
    return f'<li class="trace-step{" diverging" if diverging else ""}">{head}{body}</li>'


def _field(name: str, content: str, diff: frozenset[str]) -> str:
    """One line of a block cell, marked when this field differs between model and pool."""
    return f'<div class="f f-{name}{" diff" if name in diff else ""}">{content}</div>'


def _block_cell(block: e.BlockCell) -> str:
    """A block as a cell: id, ref count, queue place, primary key with tokens, extra keys, marks."""
    diff = block.differs
    cls = (f"block-cell {block.state}" + (" watched" if "watched" in block.marks else "")
           + (" differs" if diff else ""))
    tags = "".join(f'<span class="tag {m}{" diff" if m == "watched" and "watched" in diff else ""}">'
                   f"{escape(m)}</span>" for m in block.marks)
    if "watched" in diff and "watched" not in block.marks:
        tags += '<span class="tag diff">not watched</span>'
    tok = (f'<span class="f-tokens{" diff" if "tokens" in diff else ""}">'
           f'{"" if block.tokens is None else escape(block.tokens) + " tok"}</span>')
    extra = "".join(code(k) for k in block.extra_keys)
    key = code(block.key) if block.key else '<span class="muted">no key</span>'
    return (f'<div class="{cls}" data-block="{escape(block.id)}">'
            f'<div class="bid">#{escape(block.id)}{tags}</div>'
            + _field("ref", f"ref <b>{escape(block.ref)}</b>", diff)
            + _field("free_pos", escape(block.queue), diff)
            + _field("key", key + tok, diff)
            + (_field("extra_keys", f"+ {extra}", diff) if extra or "extra_keys" in diff else "")
            + "</div>")


def _picture(pic: e.Picture, side: str) -> str:
    """The pool after a step: blocks in a row, the index and free queue beside them, pending events."""
    mark = {p: " diff" if p in pic.differs else "" for p in ("free", "index", "num_free", "events", "blocks")}
    index_rows = "".join(f"<tr><td>{code(key)}</td><td>{escape(blocks)}</td></tr>"
                         for key, blocks in pic.index)
    index_rows = index_rows or '<tr><td colspan="2" class="muted">empty</td></tr>'
    index = (f'<table class="pic-index{mark["index"]}"><thead><tr><th>index key</th><th>blocks</th></tr>'
             f"</thead><tbody>{index_rows}</tbody></table>")
    free = " → ".join(pic.free or ()) or "empty"
    events = "".join(f"<li>{code(ev)}</li>" for ev in pic.events or ())
    return (f'<div class="pool-picture" data-side="{escape(side)}">'
            f'<div class="pic-blocks{mark["blocks"]}">{"".join(_block_cell(b) for b in pic.blocks)}</div>'
            f'<div class="pic-side">{index}'
            f'<div class="pic-free{mark["free"]}">free queue, next evicted first: {code(free)}</div>'
            f'<div class="pic-num-free{mark["num_free"]}">num_free <b>{escape(pic.num_free)}</b></div>'
            f'<div class="pic-events{mark["events"]}">pending events: '
            + (f"<ul>{events}</ul>" if events else
               f'<span class="muted">{"not observed" if pic.events is None else "none"}</span>')
            + "</div></div></div>")
