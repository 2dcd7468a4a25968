"""What the shadow found while vLLM's own tests ran with vLLM's pool under it.

    python shadow_report.py SHADOW.xml SHADOW_DIR docs/vllm.md [PLAIN.xml]

Prints the tests run (from the JUnit file), the pools shadowed, the pool calls
checked, the divergences and broken contracts (from the ``totals-*.json`` each
process wrote to ``KVPOOL_SHADOW_DIR``), each with its test, its first
difference and its trace.  Exits 1 if a finding comes from a test that
docs/vllm.md does not explain (a row of its shadow table whose first cell is
the test id, parameters left out, in backquotes), if an explained test found
nothing (a stale row), or, given the JUnit file of a run without the shadow,
if any test's outcome differs (the shadow must change nothing).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from compare import counts, outcomes

OPTIONAL = "not every run"
"""A row saying this may find nothing: its divergence shows only if the test touches the block again
or reaches a whole-pool check, and vLLM's test runs differ in their calls from run to run."""
ROW = re.compile(r"^\|\s*`(tests/v1/core/[^`]+::[^`\[]+)`\s*\|\s*([^|]+)\|", re.MULTILINE)


def explained(doc: str) -> dict[str, str]:
    """Test id (no parameters) -> the explanation's category, from the shadow table of ``doc``."""
    text = Path(doc).read_text(encoding="utf-8")
    section = text.split("## vLLM's own tests under the shadow", 1)[-1]
    return {test: why.strip() for test, why in ROW.findall(section)}


def base(test: str | None) -> str:
    return re.sub(r"\[.*$", "", (test or "?").split(" ")[0])


def main(shadow_xml: str, shadow_dir: str, doc: str, plain_xml: str | None = None) -> int:
    results = outcomes(shadow_xml)
    totals = [json.loads(p.read_text()) for p in sorted(Path(shadow_dir).glob("totals-*.json"))]
    pools = sum(t["pools"] for t in totals)
    calls = sum(t["calls"] for t in totals)
    findings = [f for t in totals for f in t["findings"]]
    kinds = Counter(f["kind"] for f in findings)
    print(f"vLLM's own tests with vLLM's pool under the shadow: {counts(results)}")
    print(f"  {pools} pools shadowed, {calls} pool calls checked; {kinds['diverged']} divergences, "
          f"{kinds['caller broke a contract']} broken contracts, {kinds['stopped']} shadows stopped")
    known = explained(doc)
    by_test: dict[str, list[dict[str, str]]] = defaultdict(list)
    for f in findings:
        by_test[base(f["test"])].append(f)
    status = 0
    for test, found in sorted(by_test.items()):
        why = known.get(test)
        print(f"  {test}: {len(found)} ({why or 'NOT EXPLAINED in ' + doc})")
        print(f"      first: {found[0]['kind']}: {found[0]['first'][:160]}")
        print(f"      trace: {found[0]['trace']}")
        status |= why is None
    for test in sorted(set(known) - set(by_test)):
        optional = OPTIONAL in known[test]
        print(f"  explained in {doc} but found nothing{' (allowed: ' + OPTIONAL + ')' if optional else ''}: "
              f"{test}")
        status |= not optional
    if plain_xml is not None:
        plain = outcomes(plain_xml)
        changed = sorted(t for t in plain.keys() | results.keys() if plain.get(t) != results.get(t))
        print(f"  outcomes without the shadow: {counts(plain)}; differing: {len(changed)}")
        for t in changed:
            print(f"    {t}: {plain.get(t)} without the shadow, {results.get(t)} with it")
        status |= bool(changed)
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
