"""Instructions per call of each pool entry point, and where they go, from a callgrind file.

Reads the output of ``pool_profile.py`` run under ``valgrind --tool=callgrind`` (see that
script) and prints, for each method of the compiled ``BlockPool`` that was called, the
calls, the instructions per call (everything the call executed, callees included), and
its largest direct callees by share.  Instruction counts do not depend on the machine's
load, so two builds can be compared on a busy machine.

    python benchmarks/callgrind_summary.py callgrind.out.<pid> [--callees 6]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

ENTRY = re.compile(r"CPyPy_pool___BlockPool___(\w+)$")
BODY = "CPyDef_pool___BlockPool___"


def parse(path: Path) -> tuple[dict[str, list[int]], dict[str, dict[str, int]]]:
    """Per called function: [calls, inclusive Ir]; per caller: callee -> inclusive Ir."""
    names: dict[str, str] = {}
    into: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    callees: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    fn = cfn = ""
    pending = 0

    def name(spec: str) -> str:
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not m:
            return spec
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), spec)

    with path.open() as f:
        for line in f:
            if line.startswith("fn="):
                fn = name(line[3:].strip())
            elif line.startswith("cfn="):
                cfn = name(line[4:].strip())
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if pending:
                    into[cfn][0] += pending
                    into[cfn][1] += cost
                    callees[fn][cfn] += cost
                    pending = 0
                else:
                    callees[fn]["(self)"] += cost
    return into, callees


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--callees", type=int, default=6, help="direct callees shown per method")
    args = ap.parse_args(argv)
    into, callees = parse(args.file)
    entries = sorted(((m.group(1), fn) for fn in into if (m := ENTRY.search(fn))),
                     key=lambda e: -into[e[1]][1])
    total = sum(into[fn][1] for _, fn in entries)
    print(f"{'method':<28}{'calls':>9}{'Ir/call':>10}{'share':>8}  largest direct callees of the body")
    for method, fn in entries:
        calls, cost = into[fn]
        body = next((b for b in callees if b.endswith(BODY + method)), None)
        parts = []
        if body is not None:
            for callee, c in sorted(callees[body].items(), key=lambda kv: -kv[1])[:args.callees]:
                short = re.sub(r"^CPyDef_|^CPy|^pool___BlockPool___", "",
                               callee.split(":")[-1].split(" ")[0])
                parts.append(f"{short} {c / cost:.0%}")
        print(f"{method:<28}{calls:>9}{cost / max(calls, 1):>10,.0f}{cost / total:>8.1%}  {', '.join(parts)}")
    print(f"{'all':<28}{sum(into[fn][0] for _, fn in entries):>9}{'':>10}{1:>8.0%}  "
          f"{total:,} instructions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
