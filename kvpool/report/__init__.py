"""The reviewer's report: a ``kvpool verify`` result document as Markdown and HTML.

``kvpool verify --report DIR`` calls :func:`write_report`.  The input is the
result document of ``kvpool/VERIFY_SCHEMA.md`` (``kvpool.verify/1``), so the
report can also be rebuilt later from a saved ``--json`` file.

The document is read once, into a view (``view.py``) of generic elements
(``elements.py``); ``markdown.py`` and ``html.py`` draw that view, so a new
section or number is written once and both formats say the same.
``markup.py`` converts the Markdown embedded in the page.
"""

from __future__ import annotations

from pathlib import Path

from kvpool.report import html, markdown
from kvpool.report.markup import markdown_to_html
from kvpool.report.view import Doc, build

__all__ = ["markdown_to_html", "render_html", "render_markdown", "write_report"]


def render_markdown(doc: Doc) -> str:
    """The report as GitHub-flavoured Markdown (for a PR comment or a terminal)."""
    return markdown.render(build(doc))


def render_html(doc: Doc) -> str:
    """The report as one self-contained HTML5 page (inline CSS, no scripts, no external resources)."""
    return html.render(build(doc))


def write_report(doc: Doc, out_dir: Path) -> list[Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir`` (created if needed).

    An unwritable directory raises ``OSError`` as is: the caller decides how to
    report it (``kvpool verify`` turns it into exit code 2).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = build(doc)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(markdown.render(report), encoding="utf-8")
    page.write_text(html.render(report), encoding="utf-8")
    return [md, page]
