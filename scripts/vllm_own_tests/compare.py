"""Compare two JUnit files of vLLM's own tests: vLLM's pool against kvpool's.

    python compare.py VLLM.xml KVPOOL.xml REFERENCE_DIFFERENCES.md

Prints the pass counts of both runs and exits 1 if a test that passes with
vLLM's pool does not pass with kvpool's and is not listed as a deliberate
difference (a row of the table in REFERENCE_DIFFERENCES.md whose first cell is
the test id in backquotes), or if a listed test passes with both (a stale row).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        out[f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"] = (
            "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed")
    return out


def listed(doc: str) -> set[str]:
    """Test ids in the first cell of a table row: ``| `tests/...::name` | ... |``."""
    with open(doc, encoding="utf-8") as f:
        return set(re.findall(r"^\|\s*`(tests/[^`]+::[^`]+)`", f.read(), re.MULTILINE))


def counts(results: dict[str, str]) -> str:
    c = Counter(results.values())
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"


def main(vllm_xml: str, kvpool_xml: str, doc: str) -> int:
    ref, ours, known = outcomes(vllm_xml), outcomes(kvpool_xml), listed(doc)
    print(f"vLLM's own tests with vLLM's pool:   {counts(ref)}")
    print(f"vLLM's own tests with kvpool's pool: {counts(ours)}")
    lost = sorted(t for t, s in ref.items() if s == "passed" and ours.get(t) != "passed")
    unexplained = [t for t in lost if t not in known]
    stale = sorted(t for t in known if ref.get(t) == "passed" and ours.get(t) == "passed")
    gained = sorted(t for t, s in ours.items() if s == "passed" and ref.get(t) != "passed")
    print(f"pass with vLLM's pool only: {len(lost)}, each a listed deliberate difference: "
          f"{len(lost) - len(unexplained)}")
    for t in gained:
        print(f"  passes with kvpool's pool only: {t}")
    for t in unexplained:
        print(f"  NOT LISTED in {doc}: {t}")
    for t in stale:
        print(f"  listed in {doc} but passes with both pools: {t}")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
