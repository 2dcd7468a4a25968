"""``kvpool merge``: the documents of shards ``1/N`` ... ``N/N`` joined into the document of one run.

Each phase is joined the way :mod:`.shard` split it: a whole phase is taken
from the shard that ran it; split lists (seeded bugs, lockstep runs,
refinement pools) are put back in the order of one run; a BMC run's states
and transitions are counted once however many parts reached a state
(:func:`kvpool.proofs.bmc.merge_parts`), its depth is the least every part
completed; conformance sums each target's calls and examples.  Verdicts are
joined (a case passes when it passed on every shard that ran it), the
claims table is rebuilt from the merged phases.  Seconds: the merged
document's ``seconds`` is the longest shard's (they ran side by side), a
phase's or a case's the sum over the shards (the work done).

Documents of ``kvpool conform --shard I/N`` (schema ``kvpool.conform/1``)
are joined into one ``kvpool conform`` document the same way.

Anything that is not a complete set of shards of one run (another schema,
profile, budget, version or target list; a shard missing or given twice) is
refused with :class:`MergeError`.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from kvpool.claims import claims_table

from .budget import SCHEMA
from .dead_weight import dead_weight_case
from .phases import part_from_json

CONFORM_SCHEMA = "kvpool.conform/1"
T = TypeVar("T")


class MergeError(ValueError):
    """Documents that are not the shards of one run."""


def merge(docs: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> dict[str, Any]:
    """One run's document from its shards' (``names``: where each came from, for messages)."""
    names = list(names or [f"document {i + 1}" for i in range(len(docs))])
    if not docs:
        raise MergeError("no documents to merge")
    for name, doc in zip(names, docs, strict=True):
        if not isinstance(doc, dict) or doc.get("schema") not in (SCHEMA, CONFORM_SCHEMA):
            raise MergeError(f"{name}: not a kvpool verify or kvpool conform --json result")
    schemas = {d["schema"] for d in docs}
    if len(schemas) > 1:
        raise MergeError(f"mixed documents: {', '.join(sorted(schemas))}")
    ordered = _check_shards(docs, names)
    if len(ordered) == 1:  # one shard of one: the run itself
        return {**ordered[0], "shard": None, "merged": [{"shard": [1, 1], "seconds": _seconds(ordered[0])}]}
    if docs[0]["schema"] == CONFORM_SCHEMA:
        return _merge_conform(ordered, names)
    return _merge_verify(ordered)


def _check_shards(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """The documents in shard order, after checking they are exactly shards 1..N of one run."""
    by_index: dict[int, dict[str, Any]] = {}
    shards = []
    for name, doc in zip(names, docs, strict=True):
        shard = doc.get("shard") or [1, 1]  # a run without --shard is shard 1/1
        if not (isinstance(shard, list) and len(shard) == 2 and all(isinstance(x, int) for x in shard)):
            raise MergeError(f"{name}: not a shard (run it with --shard I/N)")
        shards.append((name, doc, shard))
    counts = {shard[1] for _, _, shard in shards}
    if len(counts) > 1:
        raise MergeError(f"shards of different splits: /{', /'.join(map(str, sorted(counts)))}")
    (count,) = counts
    for name, doc, (index, _) in shards:
        if index in by_index:
            raise MergeError(f"shard {index}/{count} given twice ({name})")
        by_index[index] = doc
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in by_index]
    if missing:
        raise MergeError(f"shard {', '.join(missing)} missing")
    ordered = [by_index[i] for i in range(1, count + 1)]
    first = ordered[0]
    same = (("profile", "budget", "kvpool_version") if first["schema"] == SCHEMA
            else ("implementation",))
    for doc in ordered[1:]:
        for key in same:
            if doc.get(key) != first.get(key):
                raise MergeError(f"shard {doc['shard'][0]}/{count} has another {key} than shard 1/{count}: "
                                 f"{_short(doc.get(key))} against {_short(first.get(key))}")
    if first["schema"] == CONFORM_SCHEMA:
        for doc in ordered[1:]:  # every setting but the shard
            if {**doc["settings"], "shard": None} != {**first["settings"], "shard": None}:
                raise MergeError(f"shard {doc['shard'][0]}/{count} ran with other settings than shard "
                                 f"1/{count}")
    else:
        specs = [[t["spec"] for p in d["phases"] if p["name"] == "conformance" and not p["skipped"]
                  for t in p["targets"]] for d in ordered]
        if any(s != specs[0] for s in specs):
            raise MergeError("the shards checked different --impl/--adapter targets")
        shapes = [[(p["name"], p["skipped"] and p.get("elsewhere") is None) for p in d["phases"]]
                  for d in ordered]
        if any(s != shapes[0] for s in shapes):
            raise MergeError("the shards ran different phases (another --skip?)")
    return ordered


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


# ------------------------------------------------------------------ kvpool verify


def _merge_verify(docs: list[dict[str, Any]]) -> dict[str, Any]:
    first = docs[0]
    phases = [_merge_phase(p["name"], [d["phases"][i] for d in docs]) for i, p in enumerate(first["phases"])]
    ok = all(p["ok"] for p in phases)
    doc: dict[str, Any] = {
        **first,
        "started": min(d["started"] for d in docs),
        "seconds": max(d["seconds"] for d in docs),
        "shard": None,
        "merged": [{"shard": d["shard"], "seconds": d["seconds"]} for d in docs],
        "ok": ok, "exit_code": 0 if ok else 1, "phases": phases}
    doc["claims"] = claims_table(doc)
    return doc


def _merge_phase(name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [p for p in parts if not p["skipped"]]
    if not ran:  # left out by --skip everywhere
        return {**parts[0], "elsewhere": None}
    if len(ran) == 1 and all(p.get("elsewhere") is not None for p in parts if p["skipped"]):
        return {**ran[0], "elsewhere": None}  # a whole phase, from the shard that ran it
    if any(c["id"].endswith("/crash") for p in ran for c in p["cases"]):
        return _joined(name, ran, [c for p in ran for c in p["cases"]], {})
    merge_extra = {"seeded-bugs": _merge_bugs, "lockstep": _merge_lockstep, "refinement": _merge_refinement,
                   "bmc": _merge_bmc, "conformance": _merge_conformance}[name]
    return _joined(name, ran, *merge_extra(ran))


def _joined(name: str, ran: list[dict[str, Any]], cases: list[dict[str, Any]],
            extra: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ok": all(c["ok"] for c in cases),
            "seconds": round(sum(p["seconds"] for p in ran), 3), "skipped": False, "elsewhere": None,
            "cases": cases, **extra}


def interleave(lists: Sequence[Sequence[T]]) -> list[T]:
    """Item ``j`` of one list from item ``j // N`` of list ``j mod N`` (how shards split lists)."""
    n, total = len(lists), sum(len(x) for x in lists)
    if any(len(part) != len(range(i, total, n)) for i, part in enumerate(lists)):
        raise MergeError("a shard's part of a list is not the size its split gives")
    return [lists[j % n][j // n] for j in range(total)]


def _sum_counts(dicts: Sequence[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


def _merge_bugs(ran: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    groups = []
    for p in ran:  # one case and one bugs entry per form, in order; a bug's forms together
        pairs = list(zip(p["cases"], p["bugs"], strict=True))
        groups.append([list(g) for _, g in itertools.groupby(pairs, key=lambda cb: cb[1]["name"])])
    merged = [pair for group in interleave(groups) for pair in group]
    bugs = [b for _, b in merged]
    return [c for c, _ in merged] + [asdict(dead_weight_case(bugs))], {"bugs": bugs}


def _merge_lockstep(ran: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cases = interleave([p["cases"] for p in ran])
    calls = sum(p["calls"] for p in ran)
    seconds = sum(p["seconds"] for p in ran)
    return cases, {"implementation": ran[0]["implementation"], "runs": sum(p["runs"] for p in ran),
                   "calls": calls, "calls_per_second": round(calls / seconds) if seconds else 0,
                   "operations": _sum_counts([p["operations"] for p in ran]),
                   "errors": _sum_counts([p["errors"] for p in ran]),
                   "configs": sorted((c for p in ran for c in p["configs"]), key=lambda c: c["seed"])}


def _merge_refinement(ran: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cases = interleave([p["cases"] for p in ran])
    runs = interleave([p["runs"] for p in ran])
    return cases, {"implementation": ran[0]["implementation"], "symmetry": ran[0]["symmetry"],
                   "runs": runs, "sequences": sum(r["sequences"] for r in runs),
                   "states": sum(r["states"] for r in runs),
                   "operations": _sum_counts([p["operations"] for p in ran])}


def _merge_bmc(ran: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    # lazy: the BMC (z3) only to join BMC parts
    from kvpool.proofs.bmc import merge_parts

    cases, runs = [], []
    for i, run in enumerate(ran[0]["runs"]):
        mine = [p["runs"][i] for p in ran]
        kases = [p["cases"][i] for p in ran]
        if any(r["part"] is None for r in mine):
            raise MergeError(f"BMC run {run['name']}: a shard did not record its part of the search")
        try:
            states, transitions = merge_parts([part_from_json(r["part"]) for r in mine])
        except (ValueError, KeyError, TypeError) as exc:
            raise MergeError(f"BMC run {run['name']}: {exc}") from None
        runs.append({**run, "depth": min(r["depth"] for r in mine), "states": states,
                     "transitions": transitions, "complete": all(r["complete"] for r in mine),
                     "ok": all(r["ok"] for r in mine), "seconds": round(sum(r["seconds"] for r in mine), 3),
                     "part": None})
        cases.append(_one_case(kases))
    for i in range(len(runs), len(ran[0]["cases"])):  # cases of no run (the legal corpus): every shard's
        cases.append(_one_case([p["cases"][i] for p in ran], summed=False))
    return cases, {"runs": runs}


def _merge_conformance(ran: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cases, rows = [], []
    for i, row in enumerate(ran[0]["targets"]):
        mine = [p["targets"][i] for p in ran]
        kases = [p["cases"][i] for p in ran]
        phases = [_conform_phase([r["phases"][j] for r in mine]) for j in range(len(row["phases"]))]
        rows.append({**row, "ok": all(r["ok"] for r in mine),
                     "seconds": round(sum(r["seconds"] for r in mine), 3), "phases": phases,
                     "operations": _sum_counts([r["operations"] for r in mine]),
                     "refusals": _sum_counts([r["refusals"] for r in mine])})
        cases.append(_one_case(kases))
    return cases, {"targets": rows}


def _one_case(kases: list[dict[str, Any]], summed: bool = True) -> dict[str, Any]:
    """A case every shard ran: passed where it passed on each, else the first shard's failure;
    its seconds the shards' sum (``summed``) or the first shard's."""
    bad = next((c for c in kases if not c["ok"]), None)
    seconds = {"seconds": sum(c["seconds"] for c in kases)} if summed else {}
    return {**kases[0], "ok": bad is None, **seconds, "failure": None if bad is None else bad["failure"]}


def _conform_phase(each: list[dict[str, Any]]) -> dict[str, Any]:
    """A conformance phase every shard ran its share of: the calls and examples summed."""
    return {"name": each[0]["name"], "ok": all(e["ok"] for e in each),
            "seconds": round(sum(e["seconds"] for e in each), 3),
            "executed": sum(e["executed"] for e in each),
            "replayed": any(e.get("replayed", False) for e in each)}


# ------------------------------------------------------------------ kvpool conform


def _merge_conform(docs: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    first = docs[0]
    phases = []
    for j in range(len(first["phases"])):
        each = [d["phases"][j] for d in docs]
        bad = next((e for e in each if not e["ok"]), None)
        phases.append({**_conform_phase(each), "failure": None if bad is None else bad["failure"]})
    failures = [p["failure"] for p in phases if not p["ok"]]
    code = 0 if not failures else 3 if all(f and f["kind"] == "contract" for f in failures) else 1
    settings = {**first["settings"], "shard": [1, 1]}
    return {**first, "ok": not failures, "exit_code": code, "shard": None,
            "merged": [{"shard": d["shard"], "seconds": _seconds(d)} for d in docs], "settings": settings,
            "phases": phases}


def _seconds(doc: dict[str, Any]) -> float:
    """A document's wall time (a conform document has only its phases')."""
    return (float(doc["seconds"]) if "seconds" in doc
            else round(float(sum(p["seconds"] for p in doc["phases"])), 3))


def conform_junit(doc: dict[str, Any]) -> bytes:
    """JUnit XML of a merged ``kvpool conform`` document, as ``kvpool conform --junit`` writes it."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name="kvpool.conform", tests=str(len(doc["phases"])),
                          failures=str(sum(not p["ok"] for p in doc["phases"])), errors="0",
                          time=f"{sum(p['seconds'] for p in doc['phases']):.3f}")
    for p in doc["phases"]:
        case = ET.SubElement(suite, "testcase", classname=f"kvpool.conform.{doc['implementation']}",
                             name=p["name"], time=f"{p['seconds']:.3f}")
        if (fail := p["failure"]) is not None:
            ET.SubElement(case, "failure", message=fail["message"], type=fail["kind"]).text = "\n".join(
                [*fail["trace"], "", fail["details"]])
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True))


__all__ = ["CONFORM_SCHEMA", "MergeError", "conform_junit", "interleave", "merge"]
