"""What ``kvpool verify`` leaves behind: the JSON document, JUnit XML, the summary it prints.

The JSON document (schema ``kvpool.verify/1``, ``kvpool/VERIFY_SCHEMA.md``) is
the one source: JUnit, the summary and the reviewer's report
(:mod:`kvpool.report`) are each written from it.
"""

from __future__ import annotations

import datetime
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from kvpool import __version__
from kvpool.claims import claims_table
from kvpool.shard import Shard

from .budget import SCHEMA, Budget
from .phases import Phase


def invariants_table() -> list[dict[str, Any]]:
    """The model's invariants and lemmas with their docstrings, and whether z3 proves them.

    A lemma lists the invariants it follows from (``derived_from``); z3 proves it from them.
    """
    # lazy: the proofs' tables (z3) and the report only when written
    from kvpool.model import INVARIANTS, LEMMAS
    from kvpool.model.invariants import DERIVED_FROM
    from kvpool.proofs.invariants import SYM_INVARIANTS, SYM_LEMMAS

    def row(name: str, fn: Any, encoded: Any) -> dict[str, Any]:
        return {"name": name, "doc": (fn.__doc__ or "").strip().splitlines()[0], "encoded": name in encoded}

    return [*(row(name, fn, SYM_INVARIANTS) for name, fn in INVARIANTS.items()),
            *({**row(name, fn, SYM_LEMMAS), "derived_from": list(DERIVED_FROM[name])}
              for name, fn in LEMMAS.items())]


def reference_differences() -> str:
    """oracle/REFERENCE_DIFFERENCES.md, shipped with the package."""
    try:
        return resources.files("kvpool.oracle").joinpath("REFERENCE_DIFFERENCES.md").read_text("utf-8")
    except OSError:
        return ""


def document(phases: Sequence[Phase], profile: str, budget: Budget, started: datetime.datetime,
             seconds: float, shard: Shard | None = None) -> dict[str, Any]:
    """The JSON result (``kvpool/VERIFY_SCHEMA.md``); ``shard``: the part of the run it is."""
    ok = all(p.ok for p in phases)
    pools = ("bmc_pools", "agreement_pools", "refinement_pools")
    budget_json = {**asdict(budget), "skip": list(budget.skip),
                   **{key: [list(p) for p in getattr(budget, key)] for key in pools}}
    doc: dict[str, Any] = {
        "schema": SCHEMA, "kvpool_version": __version__,
        "started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 3),
        "profile": profile, "budget": budget_json,
        "shard": None if shard is None or shard.whole else [shard.index, shard.count], "merged": None,
        "ok": ok, "exit_code": 0 if ok else 1,
        "invariants": invariants_table(), "reference_differences": reference_differences(),
        "phases": [p.as_json() for p in phases]}
    doc["claims"] = claims_table(doc)
    return doc


def junit_xml(doc: dict[str, Any]) -> bytes:
    """One testsuite per phase, one testcase per case; failures carry the trace."""
    suites = ET.Element("testsuites", name="kvpool.verify",
                        tests=str(sum(len(p["cases"]) for p in doc["phases"])),
                        failures=str(sum(not c["ok"] for p in doc["phases"] for c in p["cases"])),
                        time=f"{doc['seconds']:.3f}")
    for p in doc["phases"]:
        suite = ET.SubElement(suites, "testsuite", name=f"kvpool.verify.{p['name']}",
                              tests=str(len(p["cases"])),
                              failures=str(sum(not c["ok"] for c in p["cases"])), errors="0",
                              skipped="0", time=f"{p['seconds']:.3f}")
        for c in p["cases"]:
            case = ET.SubElement(suite, "testcase", classname=f"kvpool.verify.{p['name']}",
                                 name=c["id"], time=f"{c['seconds']:.3f}")
            if (fail := c["failure"]) is not None:
                steps = [f"step {s['index']}: {s['call']} -> {s['outcome']}" for s in fail["trace"]]
                ET.SubElement(case, "failure", message=fail["message"], type=fail["kind"]).text = "\n".join(
                    [*steps, "", fail["details"]]).strip()
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def summary(doc: dict[str, Any], written: Sequence[str]) -> str:
    """The one-screen summary printed at the end."""
    part = (f", shard {doc['shard'][0]}/{doc['shard'][1]}" if doc.get("shard")
            else f", {len(doc['merged'])} shards merged" if doc.get("merged") else "")
    lines = ["", f"kvpool verify ({doc['profile']} profile{part}, {doc['seconds']:.1f}s)"]
    for p in doc["phases"]:
        bad = [c for c in p["cases"] if not c["ok"]]
        if p["skipped"]:
            where = p.get("elsewhere")
            lines.append(f"  {p['name']:<12} " + ("skipped" if where is None else
                                                  f"on shard {where}/{doc['shard'][1]}"))
            continue
        status = "ok" if not bad else "FAILED"
        lines.append(f"  {p['name']:<12} {status:<7} {len(p['cases']) - len(bad):>4}/"
                     f"{len(p['cases']):<4} cases {p['seconds']:7.1f}s  {_phase_figure(p)}")
    failed = [c for p in doc["phases"] for c in p["cases"] if not c["ok"]]
    for c in failed[:10]:
        lines.append(f"  FAILED {c['id']}: {c['failure']['message']}")
        lines += [f"      step {s['index']}: {s['call']} -> {s['outcome']}"
                  for s in c["failure"]["trace"][-5:]]
    if len(failed) > 10:
        lines.append(f"  ... and {len(failed) - 10} more failing cases")
    lines += [f"  wrote {w}" for w in written]
    verdict = "PASSED" if doc["ok"] else f"FAILED: {len(failed)} failing case(s)"
    lines.append(f"kvpool verify: {verdict} (exit {doc['exit_code']})")
    return "\n".join(lines)


def _phase_figure(p: dict[str, Any]) -> str:
    """The headline number of a phase that ran."""
    if p["name"] == "bmc":
        return "; ".join(f"{r['blocks']}b/hbs{r['hash_block_size']}: depth {r['depth']}/"
                         f"{r['depth_target']}, {r['states']} states" for r in p["runs"])
    if p["name"] == "agreement":
        pools = "; ".join(f"{r['blocks']}b/hbs{r['hash_block_size']}: depth {r['depth']}/"
                          f"{r['depth_target']}" for r in p["pools"])
        return (f"{pools}; {p['states']} states, {p['perturbed']} perturbed, "
                f"{p['transitions']} calls, {p['evaluator']['checks']} z3 checks")
    if p["name"] == "lockstep":
        return (f"{p['calls']} calls ({p['calls_per_second']}/s), {len(p['operations'])} operations, "
                f"{sum(p['errors'].values())} refusals")
    if p["name"] == "refinement":
        return "; ".join(f"{r['blocks']}b/hbs{r['hash_block_size']}"
                         f"{'' if r['caching'] else '/no-caching'}{'' if r['events'] else '/no-events'}: "
                         f"depth {r['depth']}/{r['depth_target']}, {r['states']} states, "
                         f"{r['sequences']} sequences" for r in p["runs"])
    if p["name"] == "conformance":
        return ", ".join(t["spec"] for t in p["targets"])
    if p["name"] == "seeded-bugs":
        return f"{sum(bool(b['refuted_by']) for b in p['bugs'])}/{len(p['bugs'])} refuted"
    if p["name"] == "proofs":
        order = p.get("order") or {"steps": [], "properties": []}
        return (f"{len(p['steps'])} steps x {len(p['initial'])} invariants; eviction order: "
                f"{len(order['steps'])} queue steps x {len(order['properties'])} properties")
    return ""


def write_outputs(doc: dict[str, Any], *, json_path: str | None = None, junit: str | None = None,
                  report: str | None = None,
                  junit_of: Callable[[dict[str, Any]], bytes] = junit_xml) -> list[str]:
    """The JSON document, the JUnit XML (``junit_of``'s: a merged ``kvpool conform`` document has
    its own) and the report asked for; their paths."""
    written = []
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        written.append(json_path)
    if junit:
        Path(junit).write_bytes(junit_of(doc))
        written.append(junit)
    if report:
        # lazy: the proofs' tables (z3) and the report only when written
        from kvpool.report import write_report

        written += [str(p) for p in write_report(doc, Path(report))]
    return written


__all__ = ["document", "invariants_table", "junit_xml", "reference_differences", "summary",
           "write_outputs"]
