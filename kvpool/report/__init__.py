"""The reviewer's report: a ``kvpool verify`` result document as Markdown and HTML.

``kvpool verify --report DIR`` calls :func:`write_report`.  The input is the
result document of ``kvpool/VERIFY_SCHEMA.md`` (``kvpool.verify/1``), so the
report can also be rebuilt later from a saved ``--json`` file.  It reads top
down the way a reviewer checks a run: did it pass and under what budget, what
is claimed (invariants), how it was established (proof matrix, seeded bugs,
bounded model checking, differential runs, conformance), and last, for every
failure, the counterexample as a step-by-step trace with a picture of the pool.

The HTML is one self-contained file: inline CSS, no scripts, no fonts or
images from anywhere, every document string escaped — reports are read on
machines without network, and messages can carry anything a pool printed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from kvpool.report.markup import code as _code
from kvpool.report.markup import escape as _e
from kvpool.report.markup import markdown_to_html
from kvpool.report.markup import table as _h_table

__all__ = ["markdown_to_html", "render_html", "render_markdown", "write_report"]

Doc = Mapping[str, Any]

MARK = {"proven": "✓", "counterexample": "✗", "unknown": "?"}
"""Proof statuses as one character, as ``kvpool prove`` prints them."""

SLOWEST = 5
"""How many of the slowest proofs to list: where the solver budget goes."""

BLOCKS_PER_TEXT_ROW = 10
"""Blocks per text picture chunk: keeps Markdown pictures narrower than a terminal."""


# --------------------------------------------------------------------------
# Entry point.


def write_report(doc: Doc, out_dir: Path) -> list[Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir`` (created if needed).

    An unwritable directory raises ``OSError`` as is: the caller decides how to
    report it (``kvpool verify`` turns it into exit code 2).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(render_markdown(doc), encoding="utf-8")
    page.write_text(render_html(doc), encoding="utf-8")
    return [md, page]


# --------------------------------------------------------------------------
# Reading the document (shared by both formats).


def _phase(doc: Doc, name: str) -> Mapping[str, Any] | None:
    """The phase called ``name``, or ``None`` when the run did not include it."""
    return next((p for p in doc.get("phases", []) if p.get("name") == name), None)


def _phase_state(phase: Mapping[str, Any] | None) -> str:
    """``passed``, ``failed``, ``skipped`` or ``not run``: one word per phase for the summary."""
    if phase is None:
        return "not run"
    if phase.get("skipped"):
        return "skipped"
    return "passed" if phase.get("ok") else "failed"


def _failing_cases(doc: Doc) -> list[tuple[str, Mapping[str, Any]]]:
    """Every failing case with its phase, in document order; position + 1 is its anchor number."""
    return [(p.get("name", "?"), c) for p in doc.get("phases", []) for c in p.get("cases", [])
            if not c.get("ok", True) or c.get("failure")]


def _secs(x: Any) -> str:
    """A duration a person reads at a glance: ms precision below a second, minutes above one."""
    if not isinstance(x, (int, float)):
        return "—"
    if x < 1:
        return f"{x:.3f}s"
    if x < 60:
        return f"{x:.2f}s"
    return f"{int(x // 60)}m {x % 60:04.1f}s"


def _num(x: Any) -> str:
    """A count with thousands separators (990,590 reads better than 990590)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"


def _yes(flag: Any) -> str:
    """Booleans as words in tables."""
    return "yes" if flag else "no"


def _no_trace(failure: Mapping[str, Any]) -> str:
    """What stands in for a missing trace: a z3 model is its own counterexample, a crash has none."""
    if failure.get("kind") == "counterexample":
        return "No trace: the counterexample is the solver model above."
    return "No trace recorded."


def _unchanged(trace: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Steps whose pool looks as after the step before (queries): drawn once, not again."""
    out, prev = [], None
    for step in trace:
        pic = step.get("picture")
        out.append(pic is not None and pic == prev and step.get("pool_picture") is None)
        prev = pic
    return out


def _invariant_rows(doc: Doc, proofs: Mapping[str, Any]) -> list[str]:
    """Matrix rows: the document's invariants in registry order, then any the matrix adds."""
    names = [i.get("name", "?") for i in doc.get("invariants", [])]
    seen = set(names)
    for cells in [proofs.get("initial", {}), *proofs.get("matrix", {}).values()]:
        for name in cells:
            if name not in seen:
                names.append(name)
                seen.add(name)
    return names


def _proof_cells(proofs: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Every proof result as (column, row, result): initial, matrix and precondition checks."""
    out = [("initial", inv, r) for inv, r in proofs.get("initial", {}).items()]
    out += [(step, inv, r) for step, row in proofs.get("matrix", {}).items() for inv, r in row.items()]
    out += [(step, "precondition satisfiable", r) for step, r in proofs.get("enabled", {}).items()]
    return out


def _slowest(proofs: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """The slowest proofs first: where the solver time goes, and what a tighter budget cuts."""
    cells = _proof_cells(proofs)
    return sorted(cells, key=lambda c: -float(c[2].get("seconds") or 0))[:SLOWEST]


def _proof_counts(proofs: Mapping[str, Any]) -> tuple[int, int]:
    """(proven, total) over every proof check."""
    cells = _proof_cells(proofs)
    return sum(1 for c in cells if c[2].get("status") == "proven"), len(cells)


def _split_differs(differs: Iterable[str]) -> tuple[dict[int, set[str]], set[str]]:
    """``block 3.ref`` entries by block id, and whole-picture parts (``free``, ``index``, ...)."""
    fields: dict[int, set[str]] = {}
    parts: set[str] = set()
    for item in differs:
        m = re.fullmatch(r"block (\d+)\.(\w+)", item)
        if m:
            fields.setdefault(int(m.group(1)), set()).add(m.group(2))
        else:
            parts.add(item)
    return fields, parts


def _free_pos(block: Mapping[str, Any]) -> str:
    """Where a block stands in the eviction order, or why it is not in the queue."""
    if block.get("free_pos") is not None:
        return f"evict #{block['free_pos']}"
    if block.get("null"):
        return "never free"
    return "in use"


def _marks(block: Mapping[str, Any]) -> list[str]:
    """The block's flags worth a glance: the null block and blocks with a reuse watcher."""
    return [m for m in ("null", "watched") if block.get(m)]


def _table_of_counts(counts: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A {name: count} mapping, most frequent first, so rare operations stand out at the bottom."""
    return sorted(counts.items(), key=lambda kv: (-(kv[1] or 0), kv[0]))


# --------------------------------------------------------------------------
# Markdown.


def _md_text(s: Any) -> str:
    """Plain text for a Markdown line or table cell: no table breaks, no live HTML."""
    out = str(s).replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return out.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_code(s: Any, in_table: bool = True) -> str:
    """An inline code span that survives backticks (and pipes, inside a table)."""
    text = str(s).replace("\r", " ").replace("\n", " ")
    if in_table:
        text = text.replace("|", "\\|")
    ticks = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _md_fence(text: str, info: str = "") -> str:
    """A fenced block longer than any backtick run inside, so the text cannot close it."""
    ticks = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}"


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub table from already-escaped cells."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _md_status(state: Any) -> str:
    """A phase or case state with its mark, readable without colour."""
    word = state if isinstance(state, str) else ("passed" if state else "failed")
    mark = {"passed": "✅", "failed": "❌", "skipped": "⏭", "not run": "—"}.get(word, "")
    return f"{mark} {word}".strip()


def _md_summary(doc: Doc) -> str:
    """Verdict, exit code, budget and one line per phase: what a pipeline owner reads first."""
    verdict = "PASSED" if doc.get("ok") else "FAILED"
    budget = ", ".join(f"{k}={v}" for k, v in doc.get("budget", {}).items()) or "—"
    lines = [
        f"# kvpool verify — {verdict}", "",
        f"**{verdict}** · exit code {_md_text(doc.get('exit_code'))} · profile "
        f"{_md_code(doc.get('profile'))} · total {_secs(doc.get('seconds'))}", "",
        f"- budget: {_md_code(budget, in_table=False)}",
        f"- started {_md_text(doc.get('started'))} · kvpool {_md_text(doc.get('kvpool_version'))}"
        f" · schema {_md_code(doc.get('schema'), in_table=False)}", "",
    ]
    rows = []
    for p in doc.get("phases", []):
        cases = p.get("cases", [])
        good = sum(1 for c in cases if c.get("ok"))
        rows.append([_md_text(p.get("name")), _md_status(_phase_state(p)), f"{good}/{len(cases)}",
                     _secs(p.get("seconds"))])
    lines.append(_md_table(["phase", "status", "cases passed", "time"], rows))
    failing = _failing_cases(doc)
    if failing:
        lines += ["", f"**{len(failing)} failing case(s)** — see [Failures](#failures):", ""]
        lines += [f"{i}. {_md_text(phase)}: {_md_code(c.get('id'), in_table=False)} — "
                  f"{_md_text((c.get('failure') or {}).get('message', ''))}"
                  for i, (phase, c) in enumerate(failing, 1)]
    return "\n".join(lines)


def _md_invariants(doc: Doc) -> str:
    """What is claimed: each invariant with its docstring and whether z3 sees it."""
    rows = [[_md_code(i.get("name")), _md_text(i.get("doc", "")),
             "yes" if i.get("encoded") else "no — model/BMC only"] for i in doc.get("invariants", [])]
    return "## Invariants\n\n" + _md_table(["invariant", "meaning", "z3-encoded"], rows)


def _md_cell(r: Mapping[str, Any] | None) -> str:
    """A proof matrix cell: status mark and time."""
    if r is None:
        return "—"
    return f"{MARK.get(str(r.get('status')), '?')} {_secs(r.get('seconds'))}"


def _md_proofs(doc: Doc) -> str:
    """The action x invariant matrix, with what is not encoded and what took longest."""
    proofs = _phase(doc, "proofs")
    head = "## Proof matrix\n\n"
    if proofs is None or proofs.get("skipped"):
        return head + f"Proofs {_phase_state(proofs)}."
    steps = list(proofs.get("steps") or proofs.get("matrix", {}).keys())
    matrix, initial = proofs.get("matrix", {}), proofs.get("initial", {})
    not_encoded = proofs.get("not_encoded", {})
    rows = []
    for inv in _invariant_rows(doc, proofs):
        if inv in not_encoded and inv not in initial:
            rows.append([_md_code(inv)] + ["n/e"] * (len(steps) + 1))
            continue
        rows.append([_md_code(inv), _md_cell(initial.get(inv))]
                    + [_md_cell(matrix.get(s, {}).get(inv)) for s in steps])
    enabled = proofs.get("enabled", {})
    rows.append(["*precondition satisfiable*", ""] + [_md_cell(enabled.get(s)) for s in steps])
    proven, total = _proof_counts(proofs)
    parts = [head + f"{proven}/{total} checks proven in {_secs(proofs.get('seconds'))}. "
             "Rows are invariants, columns the initial state and each symbolic step "
             "(✓ proven, ✗ counterexample, ? unknown, n/e not encoded).",
             _md_table(["invariant", "initial", *(_md_code(s) for s in steps)], rows)]
    if not_encoded:
        parts.append("**Not encoded in z3** (checked by the model and BMC only):\n\n"
                     + "\n".join(f"- {_md_code(k, False)}: {_md_text(v)}" for k, v in not_encoded.items()))
    if proofs.get("covers"):
        parts.append("**Model actions → steps:** " + "; ".join(
            f"{_md_code(a, False)} = {' + '.join(_md_code(s, False) for s in st)}"
            for a, st in proofs["covers"].items()))
    slow = [f"{_md_code(f'{col} / {inv}', False)} {_md_cell(r)}" for col, inv, r in _slowest(proofs)]
    if slow:
        parts.append("**Slowest proofs:** " + ", ".join(slow))
    order = proofs.get("order")
    if order:
        steps = list(order.get("steps", []))
        rows = [[_md_code(p)] + [_md_cell(order.get("matrix", {}).get(s, {}).get(p)) for s in steps]
                for p in order.get("properties", [])]
        enabled = order.get("enabled", {})
        rows.append(["*precondition satisfiable*"] + [_md_cell(enabled.get(s)) for s in steps])
        parts.append("### Eviction order\n\nThe free queue as a sequence of places "
                     f"(`proofs/order.py`); initial queue well formed: {_md_cell(order.get('initial'))}.\n\n"
                     + _md_table(["property", *(_md_code(s) for s in steps)], rows))
    return "\n\n".join(parts)


def _md_seeded(doc: Doc) -> str:
    """Deliberately broken transitions, and what caught each: evidence the checks have teeth."""
    phase = _phase(doc, "seeded-bugs")
    head = "## Seeded bugs\n\n"
    if phase is None or phase.get("skipped"):
        return head + f"Seeded bugs {_phase_state(phase)}."
    rows = [[_md_code(b.get("name")), _md_text(b.get("story", "")),
             ", ".join(_md_code(r) for r in b.get("refuted_by", [])) or "❌ **not refuted**",
             _md_text(b.get("method", ""))] for b in phase.get("bugs", [])]
    return head + _md_table(["bug", "story", "refuted by", "method"], rows)


def _md_bmc(doc: Doc) -> str:
    """Each bounded run: how deep it got against its target, and how much it explored."""
    phase = _phase(doc, "bmc")
    head = "## Bounded model checking\n\n"
    if phase is None or phase.get("skipped"):
        return head + f"BMC {_phase_state(phase)}."
    rows = [[_md_code(r.get("name")), _md_status(bool(r.get("ok"))), _num(r.get("blocks")),
             _num(r.get("hash_block_size")), f"{_num(r.get('depth'))} / {_num(r.get('depth_target'))}",
             _num(r.get("states")), _num(r.get("transitions")), _yes(r.get("complete")),
             _secs(r.get("seconds"))] for r in phase.get("runs", [])]
    return head + _md_table(["run", "status", "blocks", "hbs", "depth reached / target", "states",
                             "transitions", "complete", "time"], rows)


def _md_lockstep(doc: Doc) -> str:
    """Differential statistics: how much of the API and its refusals the campaign exercised."""
    phase = _phase(doc, "lockstep")
    head = "## Differential statistics\n\n"
    if phase is None or phase.get("skipped"):
        return head + f"Lockstep {_phase_state(phase)}."
    parts = [head + f"{_md_status(_phase_state(phase))} · implementation "
             f"{_md_code(phase.get('implementation'), False)} · {_num(phase.get('runs'))} runs · "
             f"{_num(phase.get('calls'))} calls · {_num(phase.get('calls_per_second'))} calls/s · "
             f"{_secs(phase.get('seconds'))}"]
    ops = _table_of_counts(phase.get("operations", {}))
    parts.append("Operations covered:\n\n" + _md_table(
        ["operation", "calls"], [[_md_code(k), _num(v)] for k, v in ops]))
    errs = _table_of_counts(phase.get("errors", {}))
    parts.append("Errors exercised:\n\n" + (_md_table(
        ["error", "times"], [[_md_code(k), _num(v)] for k, v in errs]) if errs else "none"))
    cfgs = [[_num(c.get("seed")), _num(c.get("num_blocks")), _yes(c.get("caching")),
             _num(c.get("hash_block_size")), _yes(c.get("events"))] for c in phase.get("configs", [])]
    parts.append("Configurations:\n\n" + _md_table(
        ["seed", "blocks", "caching", "hash block size", "events"], cfgs))
    return "\n\n".join(parts)


def _md_conformance(doc: Doc) -> str:
    """Per implementation: each conformance phase, how much it executed and whether it agreed."""
    phase = _phase(doc, "conformance")
    head = "## Conformance\n\n"
    if phase is None or phase.get("skipped"):
        return head + f"Conformance {_phase_state(phase)}."
    rows = []
    for t in phase.get("targets", []):
        rows.append([f"**{_md_text(t.get('name'))}**", _md_code(t.get("spec")),
                     _md_status(bool(t.get("ok"))), "", _secs(t.get("seconds"))])
        rows += [["", f"↳ {_md_text(ph.get('name'))}", _md_status(bool(ph.get("ok"))),
                  _num(ph.get("executed")), _secs(ph.get("seconds"))] for ph in t.get("phases", [])]
    return head + (_md_table(["implementation", "spec / phase", "status", "executed", "time"], rows)
                   if rows else "No implementation given.")


def _md_traces(doc: Doc) -> str:
    """Recorded traces and event streams checked, one row each."""
    phase = _phase(doc, "traces")
    head = "## Trace and event files\n\n"
    if phase is None or phase.get("skipped") or not phase.get("files"):
        return head + (f"Traces {_phase_state(phase)}." if not phase or phase.get("skipped")
                       else "No file given.")
    rows = [[_md_code(f.get("path")), _md_text(f.get("kind")), _md_status(bool(f.get("ok"))),
             _num(f.get("steps"))] for f in phase.get("files", [])]
    return head + _md_table(["file", "kind", "status", "steps"], rows)


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


def _md_reference(doc: Doc) -> str:
    """The documented reference differences, verbatim but nested under this report."""
    text = str(doc.get("reference_differences") or "").strip()
    return "## Reference differences\n\n" + (_shift_headings(text, 2) if text else "None documented.")


def _text_picture(pic: Mapping[str, Any], differs: Sequence[str] = ()) -> str:
    """A pool picture as a text table: a row per field, a column per block; ``*`` marks differences."""
    fields, parts = _split_differs(differs)
    blocks = list(pic.get("blocks", []))
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str], str]] = [
        ("block", lambda b: str(b.get("id")), ""),
        ("ref", lambda b: str(b.get("ref")), "ref"),
        ("queue", _free_pos, "free_pos"),
        ("key", lambda b: b.get("key") or "-", "key"),
        ("tokens", lambda b: "-" if b.get("tokens") is None else str(b.get("tokens")), "tokens"),
        ("extra", lambda b: ",".join(b.get("extra_keys") or []) or "-", "extra_keys"),
        ("marks", lambda b: ",".join(_marks(b)) or "-", "watched"),
    ]
    out: list[str] = []
    for start in range(0, max(len(blocks), 1), BLOCKS_PER_TEXT_ROW):
        chunk = blocks[start:start + BLOCKS_PER_TEXT_ROW]
        table = [[label] + [show(b) + ("*" if field in fields.get(int(b.get("id", -1)), ()) else "")
                            for b in chunk] for label, show, field in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
        out.append("")
    star = {p: "*" if p in parts else "" for p in ("free", "index", "num_free", "events", "blocks")}
    index = "; ".join(f"{e.get('key')} -> {e.get('blocks')}" for e in pic.get("index", [])) or "(empty)"
    out.append(f"{'index' + star['index']:<8}{index}")
    out.append(f"{'free' + star['free']:<8}{pic.get('free')} (head = next evicted)"
               f"   num_free{star['num_free']} {pic.get('num_free')}")
    events = "(not observed)" if pic.get("events") is None else "; ".join(pic["events"]) or "(none)"
    out.append(f"{'events' + star['events']:<8}{events}")
    return "\n".join(out)


def _md_step(step: Mapping[str, Any], unchanged: bool = False) -> str:
    """One trace step: the call, its outcome, what changed, and the pool afterwards."""
    lines = [f"**Step {_md_text(step.get('index'))}.** {_md_code(step.get('call'), False)} → "
             f"{_md_code(step.get('outcome'), False)}"]
    changes = step.get("changes") or []
    if changes:
        lines.append("\n".join(f"- {_md_code(c, False)}" for c in changes))
    differs = step.get("differs") or []
    if step.get("pool_picture") is not None:
        lines.append("Model (expected), `*` = differs from the implementation:")
        lines.append(_md_fence(_text_picture(step.get("picture") or {}, differs)))
        lines.append("Implementation (actual):")
        lines.append(_md_fence(_text_picture(step["pool_picture"], differs)))
        lines.append("Differs: " + (", ".join(_md_code(d, False) for d in differs) or "nothing drawn"))
    elif unchanged:
        lines.append("*Pool unchanged.*")
    elif step.get("picture") is not None:
        lines.append(_md_fence(_text_picture(step["picture"], differs)))
    return "\n\n".join(lines)


def _md_failures(doc: Doc) -> str:
    """Every failure in full: message, details and the counterexample trace."""
    failing = _failing_cases(doc)
    if not failing:
        return "## Failures\n\n" + ("None." if doc.get("ok") else
                                    "The run failed but recorded no failing case.")
    parts = ["## Failures"]
    for i, (phase, case) in enumerate(failing, 1):
        failure = case.get("failure") or {}
        parts.append(f"### {i}. {_md_text(case.get('name'))}")
        parts.append(f"{_md_text(phase)} · {_md_code(case.get('id'), False)} · "
                     f"{_md_text(failure.get('kind', 'failed'))} · {_secs(case.get('seconds'))}\n\n"
                     f"**{_md_text(failure.get('message', 'no message'))}**")
        if failure.get("details"):
            parts.append(_md_fence(str(failure["details"])))
        trace = failure.get("trace") or []
        parts.append(f"Counterexample trace ({len(trace)} steps):" if trace else _no_trace(failure))
        parts += [_md_step(s, same) for s, same in zip(trace, _unchanged(trace), strict=True)]
    return "\n\n".join(parts)


def render_markdown(doc: Doc) -> str:
    """The report as GitHub-flavoured Markdown (for a PR comment or a terminal)."""
    sections = [_md_summary(doc), _md_invariants(doc), _md_proofs(doc), _md_seeded(doc), _md_bmc(doc),
                _md_lockstep(doc), _md_conformance(doc), _md_traces(doc), _md_reference(doc),
                _md_failures(doc)]
    return "\n\n".join(sections).rstrip() + "\n"


# --------------------------------------------------------------------------
# HTML.


def _badge(state: Any) -> str:
    """A coloured status pill: green passed, red failed, grey skipped."""
    word = state if isinstance(state, str) else ("passed" if state else "failed")
    cls = {"passed": "pass", "failed": "fail", "proven": "pass", "counterexample": "fail",
           "unknown": "warn", "not refuted": "fail"}.get(word, "skip")
    return f'<span class="badge {cls}">{_e(word)}</span>'


def _section(sid: str, title: str, body: str, state: str | None = None) -> str:
    """A report section with a stable id (tests and the browser check look for it)."""
    badge = f" {_badge(state)}" if state else ""
    return f'<section id="{sid}"><h2>{_e(title)}{badge}</h2>{body}</section>'


def _not_run(phase: Mapping[str, Any] | None) -> str | None:
    """The body of a section whose phase did not run, else ``None``."""
    if phase is None or phase.get("skipped"):
        return f'<p class="muted">This phase was {_e(_phase_state(phase))}.</p>'
    return None


def _h_summary(doc: Doc) -> str:
    """Verdict banner, budget and one row per phase, with links to every failure."""
    ok = bool(doc.get("ok"))
    verdict = "PASSED" if ok else "FAILED"
    budget = "".join(f'<span class="chip">{_e(k)}=<b>{_e(v)}</b></span>'
                     for k, v in doc.get("budget", {}).items())
    rows = []
    for p in doc.get("phases", []):
        cases = p.get("cases", [])
        good = sum(1 for c in cases if c.get("ok"))
        name = str(p.get("name"))
        rows.append([f'<a href="#{_e(_SECTION_IDS.get(name, name))}">{_e(name)}</a>',
                     _badge(_phase_state(p)), f"{good}/{len(cases)}", _e(_secs(p.get("seconds")))])
    body = (f'<div class="verdict {"pass" if ok else "fail"}"><span class="big">{verdict}</span>'
            f'<span>exit code <b>{_e(doc.get("exit_code"))}</b></span>'
            f'<span>profile <b>{_e(doc.get("profile"))}</b></span>'
            f'<span>total <b>{_e(_secs(doc.get("seconds")))}</b></span></div>'
            f'<p class="budget">budget {budget}</p>'
            f'<p class="muted">started {_e(doc.get("started"))} · kvpool {_e(doc.get("kvpool_version"))}'
            f' · schema {_code(doc.get("schema"))}</p>'
            + _h_table(["phase", "status", "cases passed", "time"], rows, "phases"))
    failing = _failing_cases(doc)
    if failing:
        items = "".join(f'<li><a href="#failure-{i}">{_e(phase)}: {_code(c.get("id"))}</a> — '
                        f'{_e((c.get("failure") or {}).get("message", ""))}</li>'
                        for i, (phase, c) in enumerate(failing, 1))
        body += f'<div class="failing-list"><b>{len(failing)} failing case(s):</b><ol>{items}</ol></div>'
    return _section("summary", "Summary", body)


_SECTION_IDS = {"proofs": "proof-matrix", "seeded-bugs": "seeded-bugs", "bmc": "bmc",
                "lockstep": "lockstep", "conformance": "conformance", "traces": "traces"}
"""Which section shows each phase (the proofs phase is the matrix)."""


def _h_invariants(doc: Doc) -> str:
    """The invariants and whether z3 proves them or only the model and BMC check them."""
    rows = [[_code(i.get("name")), _e(i.get("doc", "")),
             '<span class="yes">z3</span>' if i.get("encoded")
             else '<span class="muted">model/BMC only</span>'] for i in doc.get("invariants", [])]
    return _section("invariants", "Invariants", _h_table(["invariant", "meaning", "encoded"], rows))


def _h_cell(r: Mapping[str, Any] | None, link: str | None = None) -> str:
    """A matrix cell coloured by status; a failed one links to its counterexample."""
    if r is None:
        return '<td class="na">—</td>'
    status = str(r.get("status"))
    text = f'{_e(MARK.get(status, "?"))} <span class="t">{_e(_secs(r.get("seconds")))}</span>'
    if link:
        text = f'<a href="#{link}">{text}</a>'
    return f'<td class="st-{_e(status)}" title="{_e(status)}">{text}</td>'


def _proof_links(doc: Doc) -> dict[tuple[str, str], str]:
    """Failure anchors by (column, invariant), matched on the case id's path segments."""
    out: dict[tuple[str, str], str] = {}
    proofs = _phase(doc, "proofs") or {}
    cells = _proof_cells(proofs)
    for i, (phase, case) in enumerate(_failing_cases(doc), 1):
        if phase != "proofs":
            continue
        segs = set(str(case.get("id", "")).split("/"))
        for col, inv, _r in cells:
            if col in segs and inv in segs:
                out.setdefault((col, inv), f"failure-{i}")
    return out


def _h_matrix(doc: Doc, proofs: Mapping[str, Any]) -> str:
    """Rows invariants, columns steps; not-encoded rows span the table with their reason."""
    steps = list(proofs.get("steps") or proofs.get("matrix", {}).keys())
    matrix, initial = proofs.get("matrix", {}), proofs.get("initial", {})
    not_encoded, links = proofs.get("not_encoded", {}), _proof_links(doc)
    head = "".join(f"<th>{_e(s)}</th>" for s in ["invariant", "initial", *steps])
    rows = []
    for inv in _invariant_rows(doc, proofs):
        if inv in not_encoded and inv not in initial:
            rows.append(f'<tr class="ne"><th>{_code(inv)}</th><td colspan="{len(steps) + 1}">not encoded: '
                        f'{_e(not_encoded[inv])}</td></tr>')
            continue
        cells = _h_cell(initial.get(inv), links.get(("initial", inv))) + "".join(
            _h_cell(matrix.get(s, {}).get(inv), links.get((s, inv))) for s in steps)
        rows.append(f"<tr><th>{_code(inv)}</th>{cells}</tr>")
    enabled = proofs.get("enabled", {})
    rows.append('<tr class="enabled"><th>precondition satisfiable</th><td class="na"></td>' + "".join(
        _h_cell(enabled.get(s), links.get((s, "precondition satisfiable"))) for s in steps) + "</tr>")
    return f'<table class="matrix"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _h_proofs(doc: Doc) -> str:
    """The proof matrix section: counts, the matrix, coverage of model actions, slowest proofs."""
    proofs = _phase(doc, "proofs")
    skipped = _not_run(proofs)
    if skipped or proofs is None:
        return _section("proof-matrix", "Proof matrix", skipped or "", _phase_state(proofs))
    proven, total = _proof_counts(proofs)
    body = (f"<p>{proven}/{total} checks proven in {_e(_secs(proofs.get('seconds')))}. Rows are "
            "invariants; columns the initial state and each symbolic step. "
            '<span class="legend st-proven">✓ proven</span> '
            '<span class="legend st-counterexample">✗ counterexample</span> '
            '<span class="legend st-unknown">? unknown</span></p>'
            f'<div class="scroll">{_h_matrix(doc, proofs)}</div>')
    if proofs.get("covers"):
        body += "<p><b>Model actions → steps:</b> " + "; ".join(
            f"{_code(a)} = {' + '.join(_code(s) for s in st)}" for a, st in proofs["covers"].items()) + "</p>"
    slow = "".join(f"<li>{_code(col)} / {_code(inv)}: {_e(MARK.get(str(r.get('status')), '?'))} "
                   f"{_e(_secs(r.get('seconds')))}</li>" for col, inv, r in _slowest(proofs))
    if slow:
        body += f'<p><b>Slowest proofs</b></p><ol class="slowest">{slow}</ol>'
    order = proofs.get("order")
    if order:
        steps = list(order.get("steps", []))
        head = "".join(f"<th>{_e(x)}</th>" for x in ["property", *steps])
        rows = [f"<tr><th>{_code(p)}</th>" + "".join(
            _h_cell(order.get("matrix", {}).get(s, {}).get(p)) for s in steps) + "</tr>"
            for p in order.get("properties", [])]
        rows.append('<tr class="enabled"><th>precondition satisfiable</th>' + "".join(
            _h_cell(order.get("enabled", {}).get(s)) for s in steps) + "</tr>")
        initial = order.get("initial") or {}
        body += ('<h3 id="order-matrix">Eviction order</h3><p>The free queue as a sequence of places '
                 f"({_code('proofs/order.py')}); initial queue well formed: "
                 f"{_e(MARK.get(str(initial.get('status')), '?'))}.</p>"
                 f'<div class="scroll"><table class="matrix"><thead><tr>{head}</tr></thead>'
                 f'<tbody>{"".join(rows)}</tbody></table></div>')
    return _section("proof-matrix", "Proof matrix", body, _phase_state(proofs))


def _h_seeded(doc: Doc) -> str:
    """Seeded bugs and the invariant or property that refuted each."""
    phase = _phase(doc, "seeded-bugs")
    skipped = _not_run(phase)
    if skipped or phase is None:
        return _section("seeded-bugs", "Seeded bugs", skipped or "", _phase_state(phase))
    rows = [[_code(b.get("name")), _e(b.get("story", "")),
             " ".join(_code(r) for r in b.get("refuted_by", [])) or _badge("not refuted"),
             _e(b.get("method", ""))] for b in phase.get("bugs", [])]
    return _section("seeded-bugs", "Seeded bugs", _h_table(["bug", "story", "refuted by", "method"], rows),
                    _phase_state(phase))


def _h_bmc(doc: Doc) -> str:
    """BMC runs: depth reached against target, states, transitions, exhaustiveness."""
    phase = _phase(doc, "bmc")
    skipped = _not_run(phase)
    if skipped or phase is None:
        return _section("bmc", "Bounded model checking", skipped or "", _phase_state(phase))
    rows = [[_code(r.get("name")), _badge(bool(r.get("ok"))), _e(_num(r.get("blocks"))),
             _e(_num(r.get("hash_block_size"))),
             f'{_e(_num(r.get("depth")))} / {_e(_num(r.get("depth_target")))}',
             _e(_num(r.get("states"))), _e(_num(r.get("transitions"))), _e(_yes(r.get("complete"))),
             _e(_secs(r.get("seconds")))] for r in phase.get("runs", [])]
    table = _h_table(["run", "status", "blocks", "hbs", "depth reached / target", "states", "transitions",
                      "complete", "time"], rows, "num")
    return _section("bmc", "Bounded model checking", table, _phase_state(phase))


def _h_bars(counts: Mapping[str, Any], what: str) -> str:
    """Counts as a table with proportional bars, so skew in the workload is visible at once."""
    items = _table_of_counts(counts)
    if not items:
        return '<p class="muted">none</p>'
    top = max(float(v or 0) for _k, v in items) or 1.0
    rows = [[_code(k), _e(_num(v)),
             f'<span class="bar" style="width:{100 * float(v or 0) / top:.1f}%"></span>'] for k, v in items]
    return _h_table([what, "count", ""], rows, "bars")


def _h_lockstep(doc: Doc) -> str:
    """Differential statistics: volume, speed, coverage of operations and of refusals."""
    phase = _phase(doc, "lockstep")
    skipped = _not_run(phase)
    if skipped or phase is None:
        return _section("lockstep", "Differential statistics", skipped or "", _phase_state(phase))
    stats = "".join(f'<div class="stat"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for k, v in [
        ("runs", _num(phase.get("runs"))), ("calls", _num(phase.get("calls"))),
        ("calls/s", _num(phase.get("calls_per_second"))), ("time", _secs(phase.get("seconds")))])
    cfgs = [[_e(_num(c.get("seed"))), _e(_num(c.get("num_blocks"))), _e(_yes(c.get("caching"))),
             _e(_num(c.get("hash_block_size"))), _e(_yes(c.get("events")))] for c in phase.get("configs", [])]
    ops, errs = _h_bars(phase.get("operations", {}), "operation"), _h_bars(phase.get("errors", {}), "error")
    body = (f"<p>implementation {_code(phase.get('implementation'))}</p><div class=\"stats\">{stats}</div>"
            f'<div class="cols"><div><h3>Operations covered</h3>{ops}'
            f'</div><div><h3>Errors exercised</h3>{errs}</div>'
            f'<div><h3>Configurations</h3>'
            + _h_table(["seed", "blocks", "caching", "hbs", "events"], cfgs, "num") + "</div></div>")
    return _section("lockstep", "Differential statistics", body, _phase_state(phase))


def _h_conformance(doc: Doc) -> str:
    """One block per implementation: its spec, verdict, and each phase's executed count."""
    phase = _phase(doc, "conformance")
    skipped = _not_run(phase)
    if skipped or phase is None:
        return _section("conformance", "Conformance", skipped or "", _phase_state(phase))
    rows = []
    for t in phase.get("targets", []):
        rows.append(f'<tr class="target"><th>{_e(t.get("name"))}</th><td>{_code(t.get("spec"))}</td>'
                    f'<td>{_badge(bool(t.get("ok")))}</td><td></td><td>{_e(_secs(t.get("seconds")))}</td></tr>')
        rows += [f'<tr class="sub"><td></td><td>↳ {_e(p.get("name"))}</td>'
                 f'<td>{_badge(bool(p.get("ok")))}</td><td>{_e(_num(p.get("executed")))}</td><td>{_e(_secs(p.get("seconds")))}</td></tr>'
                 for p in t.get("phases", [])]
    head = "".join(f"<th>{h}</th>" for h in ["implementation", "spec / phase", "status", "executed", "time"])
    table = (f'<table class="conf"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
             if rows else '<p class="muted">No implementation given.</p>')
    return _section("conformance", "Conformance", table, _phase_state(phase))


def _h_traces(doc: Doc) -> str:
    """Trace and event files checked."""
    phase = _phase(doc, "traces")
    skipped = _not_run(phase)
    if skipped or phase is None:
        return _section("traces", "Trace and event files", skipped or "", _phase_state(phase))
    rows = [[_code(f.get("path")), _e(f.get("kind")), _badge(bool(f.get("ok"))), _e(_num(f.get("steps")))]
            for f in phase.get("files", [])]
    body = (_h_table(["file", "kind", "status", "steps"], rows) if rows
            else '<p class="muted">No file given.</p>')
    return _section("traces", "Trace and event files", body, _phase_state(phase))


def _h_reference(doc: Doc) -> str:
    """The documented reference differences, rendered from their Markdown."""
    text = str(doc.get("reference_differences") or "").strip()
    body = markdown_to_html(text, shift=2) if text else '<p class="muted">None documented.</p>'
    return _section("reference-differences", "Reference differences", f'<div class="prose">{body}</div>')


# Pictures of the pool.


def _field(name: str, content: str, diff: set[str]) -> str:
    """One line of a block cell, marked when this field differs between model and pool."""
    cls = f"f f-{name}" + (" diff" if name in diff else "")
    return f'<div class="{cls}">{content}</div>'


def _h_block(block: Mapping[str, Any], diff: set[str]) -> str:
    """A block as a cell: id, ref count, queue place, primary key with tokens, extra keys, marks."""
    state = "null" if block.get("null") else ("free" if block.get("free_pos") is not None else "used")
    cls = f"block-cell {state}" + (" watched" if block.get("watched") else "") + (" differs" if diff else "")
    tags = "".join(f'<span class="tag {m}{" diff" if m == "watched" and "watched" in diff else ""}">'
                   f"{m}</span>" for m in _marks(block))
    if "watched" in diff and not block.get("watched"):
        tags += '<span class="tag diff">not watched</span>'
    key = block.get("key")
    tokens = block.get("tokens")
    tok = (f'<span class="f-tokens{" diff" if "tokens" in diff else ""}">'
           f'{"" if tokens is None else _e(tokens) + " tok"}</span>')
    extra = "".join(_code(k) for k in block.get("extra_keys") or [])
    return (f'<div class="{cls}" data-block="{_e(block.get("id"))}">'
            f'<div class="bid">#{_e(block.get("id"))}{tags}</div>'
            + _field("ref", f'ref <b>{_e(block.get("ref"))}</b>', diff)
            + _field("free_pos", _e(_free_pos(block)), diff)
            + _field("key", (_code(key) if key else '<span class="muted">no key</span>') + tok, diff)
            + (_field("extra_keys", f"+ {extra}", diff) if extra or "extra_keys" in diff else "")
            + "</div>")


def _h_picture(pic: Mapping[str, Any], differs: Sequence[str] = (), side: str = "model") -> str:
    """The pool after a step: blocks in a row, the index and free queue beside them, pending events."""
    fields, parts = _split_differs(differs)
    blocks = "".join(_h_block(b, fields.get(int(b.get("id", -1)), set())) for b in pic.get("blocks", []))
    mark = {p: " diff" if p in parts else "" for p in ("free", "index", "num_free", "events", "blocks")}
    index_rows = "".join(f"<tr><td>{_code(e.get('key'))}</td><td>{_e(e.get('blocks'))}</td></tr>"
                         for e in pic.get("index", []))
    index_rows = index_rows or '<tr><td colspan="2" class="muted">empty</td></tr>'
    index = (f'<table class="pic-index{mark["index"]}"><thead><tr><th>index key</th><th>blocks</th></tr>'
             f"</thead><tbody>{index_rows}</tbody></table>")
    free = " → ".join(str(b) for b in pic.get("free", [])) or "empty"
    events = "".join(f"<li>{_code(ev)}</li>" for ev in pic.get("events") or [])
    return (f'<div class="pool-picture" data-side="{_e(side)}">'
            f'<div class="pic-blocks{mark["blocks"]}">{blocks}</div><div class="pic-side">{index}'
            f'<div class="pic-free{mark["free"]}">free queue, next evicted first: {_code(free)}</div>'
            f'<div class="pic-num-free{mark["num_free"]}">num_free <b>{_e(pic.get("num_free"))}</b></div>'
            f'<div class="pic-events{mark["events"]}">pending events: '
            + (f"<ul>{events}</ul>" if events else
               f'<span class="muted">{"not observed" if pic.get("events") is None else "none"}</span>')
            + "</div></div></div>")


def _h_step(step: Mapping[str, Any], unchanged: bool = False) -> str:
    """One trace step; the diverging one draws model and implementation side by side."""
    differs = list(step.get("differs") or [])
    changes = "".join(f"<li>{_code(c)}</li>" for c in step.get("changes") or [])
    diverging = step.get("pool_picture") is not None
    head = (f'<div class="step-head"><span class="step-no">{_e(step.get("index"))}</span>'
            f'{_code(step.get("call"))} <span class="arrow">→</span> '
            f'<code class="outcome">{_e(step.get("outcome"))}</code>'
            + (' <span class="badge fail">diverges here</span>' if diverging else "") + "</div>")
    body = f'<ul class="changes">{changes}</ul>' if changes else ""
    if diverging:
        model = _h_picture(step.get("picture") or {}, differs)
        body += ('<div class="picture-pair">'
                 f'<div class="side"><h5>model (expected)</h5>{model}</div>'
                 f'<div class="side"><h5>implementation (actual)</h5>'
                 f'{_h_picture(step["pool_picture"], differs, "implementation")}</div></div>'
                 '<p class="differs-list">differs: ' + " ".join(_code(d) for d in differs) + "</p>")
    elif unchanged:
        body += '<p class="unchanged muted">pool unchanged</p>'
    elif step.get("picture") is not None:
        body += _h_picture(step["picture"], differs)
    return f'<li class="trace-step{" diverging" if diverging else ""}">{head}{body}</li>'


def _h_failure(i: int, phase: str, case: Mapping[str, Any]) -> str:
    """A failing case in full: message, details, and its counterexample trace."""
    failure = case.get("failure") or {}
    trace = failure.get("trace") or []
    details = f'<pre class="details">{_e(failure["details"])}</pre>' if failure.get("details") else ""
    steps = (f'<p>Counterexample, {len(trace)} step(s):</p><ol class="trace">'
             + "".join(_h_step(s, same) for s, same in zip(trace, _unchanged(trace), strict=True))
             + "</ol>" if trace
             else f'<p class="muted">{_e(_no_trace(failure))}</p>')
    return (f'<article class="failure" id="failure-{i}"><h3>{i}. {_e(case.get("name"))} '
            f'<span class="badge fail">{_e(failure.get("kind", "failed"))}</span></h3>'
            f'<p class="muted">{_e(phase)} · {_code(case.get("id"))} · {_e(_secs(case.get("seconds")))}</p>'
            f'<p class="message">{_e(failure.get("message", "no message"))}</p>{details}{steps}</article>')


def _h_failures(doc: Doc) -> str:
    """Every failing case; a passing run says so."""
    failing = _failing_cases(doc)
    if not failing:
        text = "None." if doc.get("ok") else "The run failed but recorded no failing case."
        return _section("failures", "Failures", f'<p class="muted">{text}</p>', None)
    body = "".join(_h_failure(i, phase, c) for i, (phase, c) in enumerate(failing, 1))
    return _section("failures", f"Failures ({len(failing)})", body, "failed")


def _css() -> str:
    """The stylesheet, a package data file so it can be read and edited as CSS; inlined in every page."""
    return resources.files(__name__).joinpath("style.css").read_text(encoding="utf-8")


def render_html(doc: Doc) -> str:
    """The report as one self-contained HTML5 page (inline CSS, no scripts, no external resources)."""
    verdict = "PASSED" if doc.get("ok") else "FAILED"
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title in [
        ("summary", "Summary"), ("invariants", "Invariants"), ("proof-matrix", "Proofs"),
        ("seeded-bugs", "Seeded bugs"), ("bmc", "BMC"), ("lockstep", "Differential"),
        ("conformance", "Conformance"), ("traces", "Traces"),
        ("reference-differences", "Reference differences"), ("failures", "Failures")])
    sections = [_h_summary(doc), _h_invariants(doc), _h_proofs(doc), _h_seeded(doc), _h_bmc(doc),
                _h_lockstep(doc), _h_conformance(doc), _h_traces(doc), _h_reference(doc), _h_failures(doc)]
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>kvpool verify — {verdict}</title><style>\n{_css()}</style></head>"
            f'<body><header><h1>kvpool verify — {verdict}</h1><nav>{nav}</nav></header>'
            f"<main>{''.join(sections)}</main></body></html>\n")
