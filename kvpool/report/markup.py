"""HTML primitives and the small Markdown-to-HTML converter the report page needs.

The page embeds ``oracle/REFERENCE_DIFFERENCES.md``; converting that subset here
keeps the package free of a Markdown dependency and, more to the point, keeps
escaping in our hands: everything that is not a construct we recognise comes
out as escaped text, so a document cannot inject markup into the page.

The primitives (``escape``, ``code``, ``table``) live here rather than in
``html.py`` because the converter needs them too and ``html.py`` imports the
converter.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["code", "escape", "markdown_to_html", "table"]


def escape(s: Any) -> str:
    """Any value as HTML text or a quoted attribute: document strings can carry anything."""
    return html.escape(str(s), quote=True)


def code(s: Any) -> str:
    """Monospace for keys, calls and names."""
    return f"<code>{escape(s)}</code>"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table from already-escaped HTML cells (the class attribute is always written)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _inline(text: str) -> str:
    """Inline Markdown to HTML: code spans, bold, italics; links keep their text only (no network)."""
    out = []
    for i, piece in enumerate(re.split(r"(`+)(.+?)\1", text)):
        if i % 3 == 2:  # a code span's text (1: its backtick run, dropped)
            out.append(code(piece.strip()))
        elif i % 3 == 0:
            s = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", escape(piece))
            s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
            out.append(re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", s))
    return "".join(out)


def _table_row(line: str) -> list[str]:
    """The cells of a Markdown table row (escaped pipes stay in their cell)."""
    body = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def _block(lines: list[str], i: int, shift: int) -> tuple[str, int]:
    """Convert the block starting at ``lines[i]``; return its HTML and the next line."""
    line = lines[i]
    fence = re.match(r"\s*(`{3,}|~{3,})", line)
    if fence:
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence.group(1)):
            j += 1
        return f"<pre><code>{escape(chr(10).join(lines[i + 1:j]))}</code></pre>", j + 1
    heading = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
    if heading:
        level = min(6, len(heading.group(1)) + shift)
        return f"<h{level}>{_inline(heading.group(2))}</h{level}>", i + 1
    if (line.lstrip().startswith("|") and i + 1 < len(lines)
            and re.fullmatch(r"\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*", lines[i + 1])):
        j = i + 2
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            j += 1
        rows = [[_inline(c) for c in _table_row(r)] for r in lines[i + 2:j]]
        return table([_inline(c) for c in _table_row(line)], rows, "md"), j
    item = re.match(r"\s*([-*+]|\d+[.)])\s+", line)
    if item:
        return _list(lines, i, "ol" if item.group(1)[0].isdigit() else "ul")
    j = i
    while j < len(lines) and lines[j].strip() and not _starts_block(lines, j):
        j += 1
    return f"<p>{_inline(' '.join(x.strip() for x in lines[i:max(j, i + 1)]))}</p>", max(j, i + 1)


def _starts_block(lines: list[str], j: int) -> bool:
    """Whether ``lines[j]`` ends a paragraph by opening another block."""
    return bool(re.match(r"\s*(`{3,}|~{3,}|#{1,6}\s|[-*+]\s|\d+[.)]\s|\|)", lines[j]))


def _list(lines: list[str], i: int, tag: str) -> tuple[str, int]:
    """A flat list; indented lines continue the item above them."""
    items: list[str] = []
    marker = r"\s*\d+[.)]\s+" if tag == "ol" else r"\s*[-*+]\s+"
    j = i
    while j < len(lines) and lines[j].strip():
        m = re.match(marker, lines[j])
        if m:
            items.append(lines[j][m.end():].strip())
        elif lines[j].startswith((" ", "\t")) and items:
            items[-1] += " " + lines[j].strip()
        else:
            break
        j += 1
    return f"<{tag}>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + f"</{tag}>", j


def markdown_to_html(text: str, shift: int = 0) -> str:
    """Headings, paragraphs, fenced code, lists and tables; everything else is escaped text.

    Just enough for ``REFERENCE_DIFFERENCES.md`` without a dependency; headings
    move down ``shift`` levels to nest under the report's own.
    """
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        block, i = _block(lines, i, shift)
        out.append(block)
    return "\n".join(out)
