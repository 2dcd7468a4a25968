"""A corpus of legal call sequences: the traces the shadow wrote while vLLM's own tests ran.

    KVPOOL_SHADOW_KEEP=1 bash scripts/vllm-own-tests.sh .venv-vllm 0.31.0
    python scripts/vllm_own_tests/make_corpus.py reports/vllm-own-tests/shadow oracle/generate/corpus/vllm

Every pool vLLM's tests built wrote its calls (``KVPOOL_SHADOW_KEEP=1``).  A
trace is kept when ``kvpool check-trace`` accepts it whole (no divergence, no
broken contract: a legal call sequence the model agrees with), it makes at least
:data:`MIN_CALLS` calls, and no kept trace has the same calls (requests named
apart); at most :data:`PER_FILE` per test file, the smallest first, each at most
:data:`MAX_BYTES`.  The header's ``meta`` keeps the test that made it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from kvpool.oracle.trace import check_trace

MIN_CALLS = 4
MAX_BYTES = 24_000
PER_FILE = 6


def calls_digest(lines: list[str]) -> str:
    """The calls, with request ids and watcher names left out: what makes two traces the same."""
    h = hashlib.sha256(lines[0].encode())
    for line in lines[1:]:
        step = json.loads(line)
        for arg in step["args"].values():
            if isinstance(arg, dict) and "request_id" in arg:
                arg["request_id"] = ""
        step["args"].pop("on_reuse", None)
        step.pop("fired", None)
        h.update(json.dumps(step, sort_keys=True).encode())
    return h.hexdigest()


def main(source: str, target: str) -> int:
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    seen: set[str] = set()
    per_file: dict[str, int] = defaultdict(int)
    candidates = []
    for path in sorted(Path(source).glob("*.jsonl")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        if len(text) > MAX_BYTES or len(lines) - 1 < MIN_CALLS:
            continue
        header = json.loads(lines[0])
        test = str((header.get("meta") or {}).get("test") or "").split(" ")[0]
        if not test.startswith("tests/"):
            continue
        candidates.append((len(text), test, path, lines, header))
    kept = 0
    for _size, test, path, lines, header in sorted(candidates, key=lambda c: (c[1].split("::")[0], c[0])):
        test_file = test.split("::")[0]
        if per_file[test_file] >= PER_FILE:
            continue
        if not check_trace(path).ok:
            continue
        header["meta"] = {"test": test, "vllm": "0.31.0", "made_by": "scripts/vllm_own_tests/make_corpus.py"}
        lines = [json.dumps(header, separators=(",", ":")), *lines[1:]]
        digest = calls_digest(lines)
        if digest in seen:
            continue
        seen.add(digest)
        per_file[test_file] += 1
        name = re.sub(r"[^A-Za-z0-9]+", "_", test.removeprefix("tests/v1/core/")).strip("_")[:80]
        (out / f"{name}_{digest[:8]}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        kept += 1
    print(f"{kept} traces kept in {out} (of {len(candidates)} small enough, from {source})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
