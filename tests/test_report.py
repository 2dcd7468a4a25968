"""The reviewer's report (``kvpool.report``): both formats, escaping, no network, real Chromium.

The documents come from ``tests/fixtures_report.py`` (written from
``VERIFY_SCHEMA.md``): one passing run, one failing with a z3 counterexample
(no trace), a BMC violation (a trace of pictures) and a conformance divergence
(model and pool pictures side by side on the last step).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from itertools import accumulate
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvpool.report import markdown_to_html, render_html, render_markdown, write_report


def _load_fixtures() -> ModuleType:
    """The fixture module by path: tests are not a package under ``--import-mode=importlib``."""
    path = Path(__file__).with_name("fixtures_report.py")
    spec = importlib.util.spec_from_file_location("fixtures_report", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fx = _load_fixtures()

SECTION_IDS = ["summary", "invariants", "claims", "proof-matrix", "seeded-bugs", "bmc", "lockstep",
               "refinement", "conformance", "traces", "reference-differences", "failures"]


@pytest.fixture(scope="module")
def passing() -> dict[str, Any]:
    doc: dict[str, Any] = fx.passing_document()
    return doc


@pytest.fixture(scope="module")
def failing() -> dict[str, Any]:
    doc: dict[str, Any] = fx.failing_document()
    return doc


@pytest.fixture(scope="module")
def failing_html(failing: dict[str, Any]) -> str:
    return render_html(failing)


@pytest.fixture(scope="module")
def failing_md(failing: dict[str, Any]) -> str:
    return render_markdown(failing)


class _Elements(HTMLParser):
    """Every start tag with its attributes; also checks that tags nest and close properly."""

    VOID = frozenset({"meta", "br", "hr", "img", "link", "input", "col", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()


def _parse(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    parser.close()
    assert parser.stack == [], f"unclosed tags: {parser.stack}"
    return parser


def _with_class(parsed: _Elements, cls: str) -> list[dict[str, str]]:
    return [a for _t, a in parsed.tags if cls in a.get("class", "").split()]


def _failure_count(doc: dict[str, Any]) -> int:
    return sum(1 for p in doc["phases"] for c in p["cases"] if not c["ok"])


# --------------------------------------------------------------------------
# Writing.


def test_write_report_writes_both_files_into_a_new_directory(tmp_path: Path,
                                                            failing: dict[str, Any]) -> None:
    out = tmp_path / "deep" / "report"
    paths = write_report(failing, out)
    assert paths == [out / "report.md", out / "report.html"]
    assert paths[0].read_text(encoding="utf-8") == render_markdown(failing)
    assert paths[1].read_text(encoding="utf-8") == render_html(failing)


def test_write_report_raises_oserror_when_the_directory_cannot_be_made(tmp_path: Path,
                                                                       passing: dict[str, Any]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        write_report(passing, blocker / "report")


# --------------------------------------------------------------------------
# HTML.


def test_html_has_every_section_in_order(passing: dict[str, Any]) -> None:
    page = render_html(passing)
    positions = [page.index(f'id="{sid}"') for sid in SECTION_IDS]
    assert positions == sorted(positions)
    assert page.startswith("<!DOCTYPE html>")
    _parse(page)


def test_passing_html_says_passed_and_has_no_failures(passing: dict[str, Any]) -> None:
    page = render_html(passing)
    parsed = _parse(page)
    assert "kvpool verify — PASSED" in page
    assert 'class="verdict pass"' in page
    assert not _with_class(parsed, "failure")
    assert not _with_class(parsed, "pool-picture")
    assert "131/131 checks proven" in page  # 11 encoded x (initial + 10 steps) + 10 preconditions


def test_html_counts(failing: dict[str, Any], failing_html: str) -> None:
    parsed = _parse(failing_html)
    # Invariants table: one row per invariant; matrix: one row per invariant + preconditions.
    section = failing_html.split('id="invariants"')[1].split("</section>")[0]
    assert section.count("<tr>") == len(failing["invariants"]) + 1
    matrix = failing_html.split('class="matrix"')[1].split("</table>")[0]
    assert matrix.count("<tr") == len(failing["invariants"]) + 2
    assert matrix.count('class="st-proven"') == 131 - 2
    assert matrix.count('class="st-counterexample"') == 1
    assert matrix.count('class="st-unknown"') == 1
    assert matrix.count("not encoded:") == 2
    assert "129/131 checks proven" in failing_html
    assert len(_with_class(parsed, "failure")) == _failure_count(failing) == 3
    assert [a["id"] for a in _with_class(parsed, "failure")] == ["failure-1", "failure-2", "failure-3"]
    # 4 BMC steps + 3 plain conformance steps + model and pool on the diverging step.
    assert len(_with_class(parsed, "pool-picture")) == 4 + 3 + 2
    assert len(_with_class(parsed, "trace-step")) == 8
    assert len(_with_class(parsed, "picture-pair")) == 1


def test_html_summary_and_sections_show_the_numbers(failing_html: str) -> None:
    summary = failing_html.split('id="summary"')[1].split("</section>")[0]
    for text in ("FAILED", "exit code <b>1</b>", "profile <b>ci</b>", "43.80s", "bmc_depth=<b>2</b>",
                 "109/110", 'href="#failure-3"'):
        assert text in summary
    bmc = failing_html.split('id="bmc"')[1].split("</section>")[0]
    assert "4 / 6" in bmc and "230,400" in bmc
    lockstep = failing_html.split('id="lockstep"')[1].split("</section>")[0]
    assert "8,514" in lockstep and "NotEnoughFreeBlocksError" in lockstep and "2,210" in lockstep
    conformance = failing_html.split('id="conformance"')[1].split("</section>")[0]
    assert "pools.FreeHashedToHead" in conformance and "6,000" in conformance
    assert "runs/events.jsonl" in failing_html
    assert "refusal changes nothing" in failing_html


def test_counterexample_cell_links_to_its_failure(failing_html: str) -> None:
    matrix = failing_html.split('class="matrix"')[1].split("</table>")[0]
    cell = re.search(r'<td class="st-counterexample"[^>]*>(.*?)</td>', matrix)
    assert cell is not None and 'href="#failure-1"' in cell.group(1) and "0.731s" in cell.group(1)


def test_proof_failure_shows_the_z3_model_and_no_trace(failing_html: str) -> None:
    first = failing_html.split('id="failure-1"')[1].split("</article>")[0]
    assert "move does not preserve index_entries_are_sound" in first
    assert '<pre class="details">[b = 2,\n k = Key!val!0,' in first
    assert "No trace" in first and "pool-picture" not in first


def test_bmc_failure_draws_a_picture_per_step(failing_html: str) -> None:
    second = failing_html.split('id="failure-2"')[1].split("</article>")[0]
    assert second.count('class="pool-picture"') == 4
    assert second.count('class="trace-step"') == 4
    assert "get_new_blocks(3)" in second and "[2, 3, 1]" in second
    assert "r0[:2]/g0" in second and "evict #2" in second and "never free" in second
    assert "BlockRemoved" in second  # pending events are drawn


def test_divergence_draws_both_pools_and_marks_the_differing_parts(failing: dict[str, Any],
                                                                   failing_html: str) -> None:
    third = failing_html.split('id="failure-3"')[1].split("</article>")[0]
    pair = third.split('class="picture-pair"')[1]
    parsed = _parse('<div class="picture-pair"' + pair.split('<p class="differs-list">')[0])
    pictures = _with_class(parsed, "pool-picture")
    assert [p["data-side"] for p in pictures] == ["model", "implementation"]
    conformance = next(p for p in failing["phases"] if p["name"] == "conformance")
    differs = conformance["cases"][1]["failure"]["trace"][-1]["differs"]
    marked = {a["data-block"] for a in _with_class(parsed, "differs")}
    assert marked == {m.group(1) for d in differs if (m := re.fullmatch(r"block (\d+)\.\w+", d))}
    assert marked == {"1", "2", "3", "4"}
    diff_fields = [a["class"] for a in _with_class(parsed, "diff")]
    assert diff_fields.count("f f-free_pos diff") == 8  # 4 blocks, both sides
    assert diff_fields.count("pic-free diff") == 2
    assert not any("f-ref" in c or "f-key" in c for c in diff_fields)
    for d in differs:
        assert f"<code>{d}</code>" in third


def test_everything_from_the_document_is_escaped(failing_html: str) -> None:
    assert "<script" not in failing_html.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in failing_html
    assert "&lt;b&gt;tag&lt;/b&gt; &amp; an ampersand" in failing_html  # reference differences prose
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in failing_html  # ... and its code block


def test_html_needs_no_network(failing_html: str, passing: dict[str, Any]) -> None:
    for page in (failing_html, render_html(passing)):
        parsed = _parse(page)
        assert not [t for t, _a in parsed.tags if t in {"script", "link", "img", "iframe", "object", "embed"}]
        for _tag, attrs in parsed.tags:
            for name in ("src", "href", "action", "srcset", "poster"):
                value = attrs.get(name, "")
                assert not re.match(r"\s*([a-z]+:|//)", value, re.I), (name, value)
        assert not re.search(r"url\(|@import|@font-face", page, re.I)
        assert "http://" not in page and "https://" not in page


def test_reference_differences_are_rendered_as_html(failing_html: str) -> None:
    section = failing_html.split('id="reference-differences"')[1].split("</section>")[0]
    assert "<h3>Where the reference versions differ</h3>" in section
    assert "<h4>1. The null block&#x27;s counter</h4>" in section
    assert "<strong>0.31.0</strong>" in section
    assert "<pre><code>touch([null_block])" in section
    assert "<li>second item, see the docs</li>" in section  # link text, no link
    assert "<ol><li>numbered one</li><li>numbered two</li></ol>" in section
    assert "<td><code>get_new_blocks(-1)</code></td>" in section


def test_markdown_converter_escapes_and_keeps_pipes_in_cells() -> None:
    out = markdown_to_html("# T <i>\n\n| a | b |\n|---|---|\n| `x \\| y` | *e* |\n\npara\ncontinued")
    assert out.startswith("<h1>T &lt;i&gt;</h1>")
    assert "<td><code>x | y</code></td><td><em>e</em></td>" in out
    assert out.endswith("<p>para continued</p>")


def test_sparse_documents_render(passing: dict[str, Any]) -> None:
    doc = dict(passing, phases=[dict(p, skipped=True, ok=True) for p in passing["phases"][:2]],
               reference_differences="")
    page, md = render_html(doc), render_markdown(doc)
    assert page.count("This phase was skipped.") == 2 and page.count("This phase was not run.") == 5
    _parse(page)
    assert "Proofs skipped." in md and "BMC not run." in md


def test_every_format_draws_every_element() -> None:
    """Renderers find an element's method by its class name: a new element needs one in each."""
    from kvpool.report import elements
    from kvpool.report.html import Html
    from kvpool.report.markdown import Markdown

    drawn = {n for n in re.findall(r"\w+", f"{elements.Inline} {elements.Block}")
             if n[0].isupper() and n not in {"Inline", "Wording", "Layout"}}
    assert len(drawn) > 15
    for renderer in (Html, Markdown):
        assert [n for n in sorted(drawn) if not callable(getattr(renderer, n.lower(), None))] == [], renderer


def test_a_step_that_changes_nothing_is_not_drawn_again(failing: dict[str, Any]) -> None:
    conformance = next(p for p in failing["phases"] if p["name"] == "conformance")
    failure = conformance["cases"][1]["failure"]
    first = failure["trace"][0]
    query = dict(first, index=2, call="get_num_free_blocks()", outcome="2", changes=[])
    trace = [first, query, *failure["trace"][1:]]
    case = dict(conformance["cases"][1], failure=dict(failure, trace=trace))
    doc = dict(failing, phases=[dict(conformance, cases=[case])])
    page, md = render_html(doc), render_markdown(doc)
    assert page.count('class="trace-step') == 5 and page.count("pool unchanged") == 1
    assert len(_with_class(_parse(page), "pool-picture")) == 5  # 3 drawn steps + the pair
    assert md.count("*Pool unchanged.*") == 1


def test_a_crash_without_trace_is_reported(passing: dict[str, Any]) -> None:
    crash = {"kind": "crash", "message": "ImportError: no module named my_pool",
             "details": "Traceback (most recent call last):\n  ...", "trace": []}
    lockstep = dict(passing["phases"][3], ok=False,
                    cases=[dict(passing["phases"][3]["cases"][0], ok=False, failure=crash)])
    doc = dict(passing, ok=False, exit_code=1, phases=[lockstep])
    page, md = render_html(doc), render_markdown(doc)
    assert 'id="failure-1"' in page and "No trace recorded." in page and "solver model" not in page
    assert "ImportError: no module named my_pool" in md and "No trace recorded." in md
    _parse(page)


# --------------------------------------------------------------------------
# Markdown.


def _md_tables(md: str) -> Iterator[list[str]]:
    """The tables of a Markdown text (outside code fences), as lists of lines."""
    table: list[str] = []
    fenced = False
    for line in [*md.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            table.append(line)
        elif table:
            yield table
            table = []


def test_markdown_sections_and_counts(failing: dict[str, Any], failing_md: str) -> None:
    headings = re.findall(r"^## (.+)$", failing_md, re.M)
    # A failed run opens with its counterexamples, right after the summary.
    assert headings == ["Failures", "Invariants", "Claims", "Proof matrix", "Seeded bugs",
                        "Bounded model checking", "Differential statistics", "Bounded refinement",
                        "Conformance",
                        "Trace and event files", "Reference differences"]
    assert failing_md.startswith("# kvpool verify — FAILED")
    assert "### Where the reference versions differ" in failing_md  # nested under the report
    assert len(re.findall(r"^### \d+\. ", failing_md, re.M)) == _failure_count(failing)
    assert "129/131 checks proven" in failing_md
    header = "| invariant | initial | " + " | ".join(f"`{s}`" for s in fx.STEPS) + " |"
    assert header in failing_md and "✗ 0.731s" in failing_md and "? 30.00s" in failing_md
    for table in _md_tables(failing_md):
        widths = {len(re.findall(r"(?<!\\)\|", row)) for row in table}
        assert len(widths) == 1, table


def test_markdown_pictures_mark_the_differences(failing_md: str) -> None:
    third = failing_md.split("### 3. ")[1]
    model = third.split("Model (expected)")[1].split("Implementation (actual)")[0]
    pool = third.split("Implementation (actual)")[1]
    assert re.search(r"^queue +never free +evict #3\* +evict #2\* +evict #0\* +evict #1\*$", model, re.M)
    assert re.search(r"^queue +never free +evict #1\* +evict #0\* +evict #2\* +evict #3\*$", pool, re.M)
    assert "free*   [3, 4, 2, 1]" in model and "free*   [2, 1, 3, 4]" in pool
    assert re.search(r"^ref +0 +0 +0 +0 +0$", model, re.M)  # equal fields are not marked
    assert failing_md.split("### 2. ")[1].split("### 3. ")[0].count("\nblock   0") == 4


def test_markdown_escapes_text_outside_code(failing_md: str) -> None:
    outside = re.sub(r"```.*?```", "", failing_md, flags=re.S)
    outside = re.sub(r"`[^`]*`", "", outside)
    # Verbatim reference differences excepted, no live HTML in the report's own text.
    own = outside.split("## Reference differences")[0] + outside.split("## Failures")[1]
    assert "<script" not in own
    assert "&lt;script&gt;" in own


# --------------------------------------------------------------------------
# Real headless Chromium.


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _add_bytes(a: int, b: int) -> int:
    """Byte addition modulo 256, as PNG filters add."""
    return (a + b) & 255


def _paeth(line: bytes, prev: bytes, bpp: int, average: bool) -> bytes:
    """Undo PNG filter 3 (average) or 4 (Paeth), which depend on the byte to the left."""
    out = bytearray(line)
    for x in range(len(out)):
        a = out[x - bpp] if x >= bpp else 0
        b = prev[x]
        if average:
            out[x] = (out[x] + ((a + b) >> 1)) & 255
            continue
        c = prev[x - bpp] if x >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[x] = (out[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return bytes(out)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) rows of an 8-bit non-interlaced PNG, with zlib only (no PIL)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, ctype, _comp, _filt, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], raw[start + 1:start + 1 + stride]
        if kind == 0:
            cur = bytes(line)
        elif kind == 1:
            sub = bytearray(stride)
            for c in range(bpp):
                channel: list[int] = list(line[c::bpp])
                summed: list[int] = list(accumulate(channel, _add_bytes))
                sub[c::bpp] = bytes(summed)
            cur = bytes(sub)
        elif kind == 2:
            cur = bytes((a + b) & 255 for a, b in zip(line, prev, strict=True))
        else:
            cur = _paeth(line, prev, bpp, average=kind == 3)
        rows.append(cur)
        prev = cur
    return width, height, [bytes(b for i, b in enumerate(r) if i % bpp < 3) if bpp == 4 else r
                           for r in rows]


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=900, check=False)


def test_decode_png_round_trip() -> None:
    """The decoder itself, on a tiny image written with filter 2 (up) and 1 (sub)."""
    rows = [b"\x02" + bytes([10, 20, 30, 1, 2, 3]), b"\x01" + bytes([5, 5, 5, 250, 250, 250])]
    ihdr = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
           + chunk(b"IEND", b""))
    assert decode_png(png) == (2, 2, [bytes([10, 20, 30, 1, 2, 3]), bytes([5, 5, 5, 255, 255, 255])])


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium)")
def test_failing_report_renders_in_headless_chromium(tmp_path: Path, failing: dict[str, Any]) -> None:
    page = write_report(failing, tmp_path / "report")[1]
    png = tmp_path / "shot.png"
    shot = _chromium([f"--screenshot={png}", "--window-size=1280,2000", page.as_uri()], tmp_path / "p1")
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    width, height, rows = decode_png(png.read_bytes())
    assert (width, height) == (1280, 2000)
    pixels = [r[x:x + 3] for r in rows[::4] for x in range(0, len(r), 12)]
    colours = set(pixels)
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert len(colours) > 100, f"only {len(colours)} colours: blank page?"
    assert non_white > len(pixels) // 10, f"{non_white}/{len(pixels)} non-white pixels"
    assert any(p[0] > 180 and p[1] < 80 and p[2] < 80 for p in pixels), "no red: failed verdict not drawn"

    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path / "p2")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Elements()
    parsed.feed(dom.stdout)
    ids = {a.get("id") for _t, a in parsed.tags}
    assert {"summary", "proof-matrix", "failures", "failure-3"} <= ids
    assert len(_with_class(parsed, "pool-picture")) == 9
    assert len(_with_class(parsed, "matrix")) == 1
    assert [t for t, _a in parsed.tags].count("table") >= 10
