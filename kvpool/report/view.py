"""What the reviewer's report says, built once from a ``kvpool verify`` result document.

All reading of the document (``kvpool/VERIFY_SCHEMA.md``, ``kvpool.verify/1``)
and every decision about content happens here: which sections and rows, which
numbers and how they are written, what text, which failures link where, which
parts of a pool picture are marked as different.  The result is plain data
(``elements.py``) that ``markdown.py`` and ``html.py`` draw without looking at
the document again, so the two formats cannot disagree about what the run did.

The report reads top down the way a reviewer checks a run: did it pass and
under what budget, what is claimed (invariants), how it was established (proof
matrix, seeded bugs, bounded model checking, differential runs, conformance),
and last, for every failure, the counterexample as a step-by-step trace with a
picture of the pool.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from kvpool.report import elements as e

__all__ = ["Doc", "build"]

Doc = Mapping[str, Any]

MARK = {"proven": "✓", "counterexample": "✗", "unknown": "?"}
"""Proof statuses as one character, as ``kvpool prove`` prints them."""

SLOWEST = 5
"""How many of the slowest proofs to list: where the solver budget goes."""

PHASE_SECTIONS = {"proofs": ("proof-matrix", "Proof matrix", "Proofs", "Proofs"),
                  "seeded-bugs": ("seeded-bugs", "Seeded bugs", "Seeded bugs", "Seeded bugs"),
                  "bmc": ("bmc", "Bounded model checking", "BMC", "BMC"),
                  "lockstep": ("lockstep", "Differential statistics", "Differential", "Lockstep"),
                  "refinement": ("refinement", "Bounded refinement", "Refinement", "Refinement"),
                  "conformance": ("conformance", "Conformance", "Conformance", "Conformance"),
                  "traces": ("traces", "Trace and event files", "Traces", "Traces")}
"""A phase's section: its id, title and name in the contents, and how it names the phase
when the phase did not run, in the order the report shows them."""

SECTION_OF_PHASE = {"agreement": "proof-matrix", **{p: s[0] for p, s in PHASE_SECTIONS.items()}}
"""Which section shows each phase (the agreement of the encoding with the model is about the
proofs of the matrix)."""

NONE = e.Para("none", muted=True)
"""What an empty count says on the page."""

Failing = list[tuple[str, Mapping[str, Any]]]
"""Failing cases with their phase name, in document order (numbered from 1 on the page)."""

Body = Callable[[Mapping[str, Any]], Sequence[e.Block]]
"""What a phase's section shows, from the phase."""

ProofCells = list[tuple[str, str, Mapping[str, Any]]]
"""Proof results as (column, row, result)."""


def build(doc: Doc) -> e.Report:
    """The report for ``doc``; sections always appear, in this order, whatever the run included."""
    failing = _failing_cases(doc)
    bodies: dict[str, Body] = {
        "proofs": lambda p: _proofs(doc, p, failing), "seeded-bugs": _seeded, "bmc": _bmc,
        "lockstep": _lockstep, "refinement": _refinement, "conformance": _conformance, "traces": _traces}
    rest = (_invariants(doc), _claims(doc),
            *(_phase_section(doc, name, bodies[name]) for name in PHASE_SECTIONS), _reference(doc))
    failures = _failures(doc, failing)  # a failed run opens with its counterexamples, step by step
    return e.Report(f"kvpool verify — {_verdict(doc)}",
                    (_summary(doc, failing), *((failures, *rest) if failing else (*rest, failures))))


# --------------------------------------------------------------------------
# Reading the document.


def _verdict(doc: Doc) -> str:
    """The run's verdict in one word."""
    return "PASSED" if doc.get("ok") else "FAILED"


def _phase_state(phase: Mapping[str, Any] | None) -> str:
    """``passed``, ``failed``, ``skipped`` or ``not run``: one word per phase for the summary."""
    if phase is None:
        return "not run"
    if phase.get("skipped"):
        return "skipped"
    return "passed" if phase.get("ok") else "failed"


def _passed(flag: Any) -> str:
    """A run's, target's or file's ``ok`` as the same state words the phases use."""
    return "passed" if flag else "failed"


def _failing_cases(doc: Doc) -> Failing:
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
    """Booleans as words: a table of True and False reads like a dump, not a report."""
    return "yes" if flag else "no"


def _joined(sep: str, parts: Iterable[e.Inline]) -> tuple[e.Inline, ...]:
    """``parts`` with ``sep`` between them, as one piece of text."""
    return tuple(x for i, part in enumerate(parts) for x in ((sep, part) if i else (part,)))


def _phase_section(doc: Doc, name: str, body: Body) -> e.Section:
    """A phase's section: ``body`` where the phase ran, else what became of it (the section stays,
    so the report's shape never changes)."""
    sid, title, nav, said = PHASE_SECTIONS[name]
    phase = next((p for p in doc.get("phases", []) if p.get("name") == name), None)
    state = _phase_state(phase)
    if phase is None or phase.get("skipped"):
        return e.Section(sid, title, nav, (e.Para(e.Wording(f"{said} {state}.", f"This phase was {state}."),
                                                  muted=True),), state)
    return e.Section(sid, title, nav, tuple(body(phase)), state)


# --------------------------------------------------------------------------
# Summary and claims.


def _summary(doc: Doc, failing: Failing) -> e.Section:
    """Verdict, exit code, budget and one row per phase: what a pipeline owner reads first."""
    verdict = e.Verdict(
        bool(doc.get("ok")), _verdict(doc),
        (e.Fact("exit code", str(doc.get("exit_code"))),
         e.Fact("profile", str(doc.get("profile")), code=True), e.Fact("total", _secs(doc.get("seconds")))),
        "budget", tuple((str(k), str(v)) for k, v in doc.get("budget", {}).items()),
        ("started ", str(doc.get("started")), " · kvpool ", str(doc.get("kvpool_version")), " · schema ",
         e.Code(str(doc.get("schema")))))
    rows = []
    for p in doc.get("phases", []):
        cases, name = p.get("cases", []), str(p.get("name"))
        rows.append(e.Row((e.Link(SECTION_OF_PHASE.get(name, name), name), e.Status(_phase_state(p)),
                           f"{sum(1 for c in cases if c.get('ok'))}/{len(cases)}", _secs(p.get("seconds")))))
    blocks: list[e.Block] = [verdict,
                             e.Table(("phase", "status", "cases passed", "time"), tuple(rows), "phases")]
    if failing:
        blocks.append(e.Alerts(f"{len(failing)} failing case(s)", ("failures", "Failures"), tuple(
            (e.Link(f"failure-{i}", (str(phase), ": ", e.Code(str(c.get("id"))))), " — ",
             str((c.get("failure") or {}).get("message", "")))
            for i, (phase, c) in enumerate(failing, 1))))
    return e.Section("summary", "Summary", "Summary", tuple(blocks))


def _invariants(doc: Doc) -> e.Section:
    """What is claimed: each invariant with its docstring and whether z3 sees it."""
    rows = tuple(e.Row((e.Code(str(i.get("name"))), str(i.get("doc", "")),
                        e.Wording("yes", e.Tinted("z3", "good")) if i.get("encoded")
                        else e.Wording("no — model/BMC only", e.Tinted("model/BMC only", "quiet"))))
                 for i in doc.get("invariants", []))
    return e.Section("invariants", "Invariants", "Invariants", (
        e.Table(("invariant", "meaning", e.Wording("z3-encoded", "encoded")), rows),))


def _claims(doc: Doc) -> e.Section:
    """How each property is known: the reviewer's one page (``kvpool claims``)."""
    claims = doc.get("claims")
    if not claims:
        return e.Section("claims", "Claims", "Claims", (
            e.Para("This document carries no claims table (kvpool claims --from FILE rebuilds it).",
                   muted=True),))
    rows = tuple(e.Row((e.Code(str(c.get("property"))), str(c.get("kind", "")), str(c.get("z3", "")),
                        str(c.get("bmc", "")),
                        ", ".join(c.get("bugs") or []) if c.get("bugs") is not None else "not run"))
                 for c in claims)
    return e.Section("claims", "Claims: what establishes each property", "Claims", (
        e.Table(("property", "kind", "z3, any pool size", "bounded model checking",
                 "seeded bugs that break it"), rows),))


# --------------------------------------------------------------------------
# Proofs.


def _invariant_rows(doc: Doc, proofs: Mapping[str, Any]) -> list[Any]:
    """Matrix rows: the document's invariants in registry order, then any the matrix adds."""
    documented = [i.get("name", "?") for i in doc.get("invariants", [])]
    cells = [proofs.get("initial", {}), *proofs.get("matrix", {}).values()]
    return [*documented, *dict.fromkeys(name for row in cells for name in row if name not in documented)]


def _proof_cells(proofs: Mapping[str, Any]) -> ProofCells:
    """Every proof result as (column, row, result): initial, matrix and precondition checks."""
    out = [("initial", inv, r) for inv, r in proofs.get("initial", {}).items()]
    out += [(step, inv, r) for step, row in proofs.get("matrix", {}).items() for inv, r in row.items()]
    out += [(step, "precondition satisfiable", r) for step, r in proofs.get("enabled", {}).items()]
    return out


def _proof_links(cells: ProofCells, failing: Failing) -> dict[tuple[str, str], str]:
    """Failure anchors by (column, invariant), matched on the case id's path segments."""
    out: dict[tuple[str, str], str] = {}
    for i, (phase, case) in enumerate(failing, 1):
        if phase != "proofs":
            continue
        segs = set(str(case.get("id", "")).split("/"))
        for col, inv, _r in cells:
            if col in segs and inv in segs:
                out.setdefault((col, inv), f"failure-{i}")
    return out


def _mark(r: Mapping[str, Any]) -> str:
    """A proof result's status as its one-character mark."""
    return MARK.get(str(r.get("status")), "?")


def _result(r: Mapping[str, Any] | None, link: str | None = None) -> e.Cell:
    """A grid cell for a proof result; ``None`` (not produced) stays ``None``."""
    if r is None:
        return None
    return e.Result(str(r.get("status")), _mark(r), _secs(r.get("seconds")), link)


def _mark_and_time(r: Mapping[str, Any] | None) -> str:
    """A proof result in running text: mark and time, or a dash when there is none."""
    return "—" if r is None else f"{_mark(r)} {_secs(r.get('seconds'))}"


def _proofs(doc: Doc, proofs: Mapping[str, Any], failing: Failing) -> Sequence[e.Block]:
    """The action x invariant matrix, with what is not encoded, coverage and what took longest."""
    steps = list(proofs.get("steps") or proofs.get("matrix", {}).keys())
    matrix, initial, enabled = proofs.get("matrix", {}), proofs.get("initial", {}), proofs.get("enabled", {})
    cells, not_encoded = _proof_cells(proofs), proofs.get("not_encoded", {})
    links = _proof_links(cells, failing)
    rows = [e.GridRow(e.Code(str(inv)), kind="note", short="n/e", long=f"not encoded: {not_encoded[inv]}")
            if inv in not_encoded and inv not in initial else
            e.GridRow(e.Code(str(inv)), (_result(initial.get(inv), links.get(("initial", inv))), *(
                _result(matrix.get(s, {}).get(inv), links.get((s, inv))) for s in steps)))
            for inv in _invariant_rows(doc, proofs)]
    rows.append(e.GridRow("precondition satisfiable", (e.BLANK, *(
        _result(enabled.get(s), links.get((s, "precondition satisfiable"))) for s in steps)), kind="aside"))
    proven = sum(1 for c in cells if c[2].get("status") == "proven")
    blocks: list[e.Block] = [
        e.Para((f"{proven}/{len(cells)} checks proven in {_secs(proofs.get('seconds'))}. ", e.Wording(
            "Rows are invariants, columns the initial state and each symbolic step "
            "(✓ proven, ✗ counterexample, ? unknown, n/e not encoded).",
            ("Rows are invariants; columns the initial state and each symbolic step. ",
             e.Swatch("proven", "✓ proven"), " ", e.Swatch("counterexample", "✗ counterexample"), " ",
             e.Swatch("unknown", "? unknown"))))),
        e.Grid("invariant", ("initial",), tuple(str(s) for s in steps), tuple(rows))]
    if not_encoded:  # the page says why in the matrix row itself
        blocks.append(e.Layout((
            e.Para((e.Strong("Not encoded in z3"), " (checked by the model and BMC only):")),
            e.Listing(tuple((e.Code(str(k)), ": ", str(v)) for k, v in not_encoded.items()))), ()))
    if proofs.get("covers"):
        blocks.append(e.Para((e.Strong("Model actions → steps:"), " ", *_joined("; ", (
            (e.Code(str(a)), " = ", *_joined(" + ", (e.Code(str(s)) for s in st)))
            for a, st in proofs["covers"].items())))))
    slowest = sorted(cells, key=lambda c: -float(c[2].get("seconds") or 0))[:SLOWEST]
    if slowest:
        blocks.append(e.Layout(
            (e.Para((e.Strong("Slowest proofs:"), " ", *_joined(", ", (
                (e.Code(f"{col} / {inv}"), " ", _mark_and_time(r)) for col, inv, r in slowest)))),),
            (e.Para(e.Strong("Slowest proofs")), e.Listing(tuple(
                (e.Code(str(col)), " / ", e.Code(str(inv)), ": ", _mark_and_time(r))
                for col, inv, r in slowest), numbered=True, style="slowest"))))
    if proofs.get("order"):
        blocks += _order(proofs["order"])
    return blocks


def _order(order: Mapping[str, Any]) -> list[e.Block]:
    """The eviction-order proofs (``proofs/order.py``): queue steps x properties."""
    steps = list(order.get("steps", []))
    rows = [e.GridRow(e.Code(str(p)), tuple(_result(order.get("matrix", {}).get(s, {}).get(p))
                                            for s in steps)) for p in order.get("properties", [])]
    rows.append(e.GridRow("precondition satisfiable", tuple(
        _result(order.get("enabled", {}).get(s)) for s in steps), kind="aside"))
    initial = order.get("initial")
    return [e.Heading("Eviction order", "order-matrix"),
            e.Para(("The free queue as a sequence of places (", e.Code("proofs/order.py"),
                    "); initial queue well formed: ",
                    e.Wording(_mark_and_time(initial), _mark(initial or {})), ".")),
            e.Grid("property", (), tuple(str(s) for s in steps), tuple(rows))]


# --------------------------------------------------------------------------
# The other phases.


def _seeded(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Deliberately broken transitions, and what caught each: evidence the checks have teeth."""
    rows = tuple(e.Row((e.Code(str(b.get("name"))), str(b.get("story", "")),
                        e.Names(tuple(str(r) for r in b["refuted_by"])) if b.get("refuted_by")
                        else e.Status("not refuted", loud=True), str(b.get("method", ""))))
                 for b in phase.get("bugs", []))
    return [e.Table(("bug", "story", "refuted by", "method"), rows)]


def _depth(run: Mapping[str, Any]) -> str:
    """A search's depth against its target."""
    return f"{_num(run.get('depth'))} / {_num(run.get('depth_target'))}"


def _bmc(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Each bounded run: how deep it got against its target, and how much it explored."""
    rows = tuple(e.Row((e.Code(str(r.get("name"))), e.Status(_passed(r.get("ok"))), _num(r.get("blocks")),
                        _num(r.get("hash_block_size")), _depth(r), _num(r.get("states")),
                        _num(r.get("transitions")), _yes(r.get("complete")), _secs(r.get("seconds"))))
                 for r in phase.get("runs", []))
    return [e.Table(("run", "status", "blocks", "hbs", "depth reached / target", "states", "transitions",
                     "complete", "time"), rows, "num")]


def _counts(counts: Mapping[str, Any], what: str, unit: str) -> e.Bars:
    """A {name: count} mapping, most frequent first, so rare operations stand out at the bottom."""
    items = sorted(counts.items(), key=lambda kv: (-(kv[1] or 0), kv[0]))
    top = max((float(v or 0) for _k, v in items), default=0.0) or 1.0
    return e.Bars((what, e.Wording(unit, "count")),
                  tuple((str(k), _num(v), 100 * float(v or 0) / top) for k, v in items))


def _lockstep(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Differential statistics: volume, speed, and how much of the API and its refusals it exercised."""
    impl = e.Code(str(phase.get("implementation")))
    runs, calls = _num(phase.get("runs")), _num(phase.get("calls"))
    rate, secs = _num(phase.get("calls_per_second")), _secs(phase.get("seconds"))
    ops = _counts(phase.get("operations", {}), "operation", "calls")
    errs = _counts(phase.get("errors", {}), "error", "times")
    configs = tuple(e.Row((_num(c.get("seed")), _num(c.get("num_blocks")), _yes(c.get("caching")),
                           _num(c.get("hash_block_size")), _yes(c.get("events"))))
                    for c in phase.get("configs", []))
    return [
        e.Layout((e.Para((e.Status(_phase_state(phase)), " · implementation ", impl,
                          f" · {runs} runs · {calls} calls · {rate} calls/s · {secs}")),),
                 (e.Para(("implementation ", impl)),
                  e.Stats((("runs", runs), ("calls", calls), ("calls/s", rate), ("time", secs))))),
        e.Panels((
            e.Panel("Operations covered", (ops if ops.items else e.Layout((ops,), (NONE,)),)),
            e.Panel("Errors exercised", (errs if errs.items else NONE,)),
            e.Panel("Configurations", (e.Table(("seed", "blocks", "caching",
                                                e.Wording("hash block size", "hbs"), "events"),
                                               configs, "num"),)),
        ))]


def _refinement(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Each small pool: every call sequence to a depth, kvpool.impl beside the model."""
    rows = tuple(e.Row((str(r.get("name")), e.Status(_passed(r.get("ok"))), _depth(r), _num(r.get("states")),
                        _num(r.get("sequences")), _num(sum((r.get("misuse") or {}).values())),
                        _num(r.get("contract_breaches")), _yes(r.get("complete")), _secs(r.get("seconds"))))
                 for r in phase.get("runs", []))
    refusals: Counter[str] = Counter()
    for r in phase.get("runs", []):
        refusals.update({kind: int(count or 0) for kind, count in (r.get("refusals") or {}).items()})
    ops = _counts(phase.get("operations", {}), "operation", "calls")
    return [e.Table(("pool", "status", "depth reached / target", "model states", "sequences", "misuse calls",
                     "contract breaches skipped", "complete", "time"), rows, "num"),
            e.Panels((e.Panel("Operations covered", (ops if ops.items else NONE,)),
                      e.Panel("Refusals exercised",
                              (_counts(refusals, "refusal", "times") if refusals else NONE,))))]


def _conformance(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Per implementation: each conformance phase, how much it executed and whether it agreed."""
    rows = []
    for t in phase.get("targets", []):
        rows.append(e.Row((str(t.get("name")), e.Code(str(t.get("spec"))), e.Status(_passed(t.get("ok"))), "",
                           _secs(t.get("seconds"))), "group"))
        rows += [e.Row(("", f"↳ {p.get('name')}", e.Status(_passed(p.get("ok"))), _num(p.get("executed")),
                        _secs(p.get("seconds"))), "sub") for p in t.get("phases", [])]
    headers = ("implementation", "spec / phase", "status", "executed", "time")
    return [e.Table(headers, tuple(rows), "conf") if rows else e.Para("No implementation given.", muted=True),
            *_targets_described(phase.get("targets", []))]


def _targets_described(targets: Sequence[Mapping[str, Any]]) -> list[e.Block]:
    """What was checked of each pool under test: how it was observed, misuse, what it was asked."""
    out: list[e.Block] = []
    for t in targets:
        level = t.get("observation") or {}
        skipped = [n for n, how in (level.get("checks") or {}).items() if str(how).startswith("skipped")]
        seen = f"observed {level.get('level', '?')}" + (
            f" (not shown by this pool: {', '.join(skipped)})" if skipped else "")
        ops, refusals = t.get("operations") or {}, t.get("refusals") or {}
        out.append(e.Para(
            f"{t.get('name')}: {seen}; {t.get('misuse', '')}; "
            f"{sum(ops.values()):,} calls over {len(ops)} operations"
            + (f", {sum(refusals.values()):,} refused ({', '.join(sorted(refusals))})" if refusals else "")
            + "."))
    return out


def _traces(phase: Mapping[str, Any]) -> Sequence[e.Block]:
    """Recorded traces and event streams checked, one row each."""
    rows = tuple(e.Row((e.Code(str(f.get("path"))), str(f.get("kind")), e.Status(_passed(f.get("ok"))),
                        _num(f.get("steps")))) for f in phase.get("files", []))
    return [e.Table(("file", "kind", "status", "steps"), rows) if rows
            else e.Para("No file given.", muted=True)]


def _reference(doc: Doc) -> e.Section:
    """The documented reference differences, nested under this report's headings."""
    text = str(doc.get("reference_differences") or "").strip()
    return e.Section("reference-differences", "Reference differences", "Reference differences",
                     (e.Prose(text, 2, "None documented."),))


# --------------------------------------------------------------------------
# Failures, their traces and pictures of the pool.


def _failures(doc: Doc, failing: Failing) -> e.Section:
    """Every failure in full; a passing run says so."""
    if not failing:
        text = "None." if doc.get("ok") else "The run failed but recorded no failing case."
        return e.Section("failures", "Failures", "Failures", (e.Para(text, muted=True),))
    return e.Section("failures", "Failures", "Failures",
                     tuple(_failure(i, str(phase), c) for i, (phase, c) in enumerate(failing, 1)),
                     "failed", len(failing))


def _failure(i: int, phase: str, case: Mapping[str, Any]) -> e.Failure:
    """A failing case: message, details, and its counterexample trace."""
    failure = case.get("failure") or {}
    trace = failure.get("trace") or []
    no_trace = ("No trace: the counterexample is the solver model above."  # a z3 model is its own
                if failure.get("kind") == "counterexample" else "No trace recorded.")
    return e.Failure(i, f"failure-{i}", str(case.get("name")), str(failure.get("kind", "failed")), phase,
                     str(case.get("id")), _secs(case.get("seconds")),
                     str(failure.get("message", "no message")),
                     str(failure["details"]) if failure.get("details") else None,
                     tuple(_step(s, same) for s, same in zip(trace, _unchanged(trace), strict=True)),
                     no_trace)


def _unchanged(trace: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Steps whose pool looks as after the step before (queries): drawn once, not again."""
    pics = [step.get("picture") for step in trace]
    return [pic is not None and pic == prev and step.get("pool_picture") is None
            for step, pic, prev in zip(trace, pics, [None, *pics], strict=False)]


def _step(step: Mapping[str, Any], unchanged: bool) -> e.StepView:
    """One trace step; on the diverging one, the model's pool and the implementation's."""
    differs = tuple(str(d) for d in step.get("differs") or [])
    fields, parts = _split_differs(differs)
    picture, actual = step.get("picture"), step.get("pool_picture")
    if actual is not None:
        picture = picture or {}
    return e.StepView(str(step.get("index")), str(step.get("call")), str(step.get("outcome")),
                      tuple(str(c) for c in step.get("changes") or []),
                      None if picture is None else _picture(picture, fields, parts),
                      None if actual is None else _picture(actual, fields, parts), differs, unchanged)


def _split_differs(differs: Iterable[str]) -> tuple[dict[int, set[str]], frozenset[str]]:
    """``block 3.ref`` entries by block id, and whole-picture parts (``free``, ``index``, ...)."""
    fields: dict[int, set[str]] = {}
    parts: set[str] = set()
    for item in differs:
        if m := re.fullmatch(r"block (\d+)\.(\w+)", item):
            fields.setdefault(int(m.group(1)), set()).add(m.group(2))
        else:
            parts.add(item)
    return fields, frozenset(parts)


def _picture(pic: Mapping[str, Any], fields: Mapping[int, set[str]], parts: frozenset[str]) -> e.Picture:
    """A pool picture (``kvpool.pictures``) with the differing fields and parts marked."""
    free, events = pic.get("free"), pic.get("events")
    return e.Picture(
        tuple(_block(b, frozenset(fields.get(int(b.get("id", -1)), ()))) for b in pic.get("blocks", [])),
        tuple((str(x.get("key")), str(x.get("blocks"))) for x in pic.get("index") or []),
        None if free is None else tuple(str(b) for b in free), str(pic.get("num_free")),
        None if events is None else tuple(str(x) for x in events), parts)


def _block(block: Mapping[str, Any], differs: frozenset[str]) -> e.BlockCell:
    """A block: ref count, place in the eviction order, keys, and flags worth a glance."""
    free_pos, null = block.get("free_pos"), bool(block.get("null"))
    queue = f"evict #{free_pos}" if free_pos is not None else ("never free" if null else "in use")
    state: Literal["null", "free", "used"] = "null" if null else ("used" if free_pos is None else "free")
    key, tokens = block.get("key"), block.get("tokens")
    return e.BlockCell(str(block.get("id")), state, str(block.get("ref")), queue, str(key) if key else None,
                       None if tokens is None else str(tokens),
                       tuple(str(k) for k in block.get("extra_keys") or []),
                       tuple(m for m in ("null", "watched") if block.get(m)), differs)
