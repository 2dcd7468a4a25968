"""Wrong specifications that ``kvpool verify`` must refute by itself (issue 23).

Each mutant is a small edit of the specification: of the model only, of the z3
encoding only, of both the same way, of a caller contract (too weak or too
strong), or of the BMC's call domains.  Each is applied to a copy of the package
(staged as the installed layout: ``kvpool/``, ``kvpool/model``, ...) and judged by

    kvpool verify --profile ci --skip lockstep --skip refinement

run on that copy.  A mutant is refuted when the run fails with a concrete failure
(a counterexample, a violation or a divergence); a run that passes, or fails only
for want of time, leaves it standing.  The unmutated copy must pass.

    python scripts/spec_mutants.py                 # every mutant, one run each (and the original)
    python scripts/spec_mutants.py --only NAME ... # some of them
    python scripts/spec_mutants.py --jobs 2        # runs side by side
    python scripts/spec_mutants.py --skip seeded-bugs  # a quicker judge: the seeded bugs judge the
                                                       # checks, not the specification
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "impl", "proofs", "oracle", "bugs")
JUDGE = ("verify", "--profile", "ci", "--skip", "lockstep", "--skip", "refinement", "--plain")
CONCRETE = ("counterexample", "violation", "divergence")


@dataclass(frozen=True)
class Mutant:
    """One wrong specification: edits as (file under the repository, old text, new text)."""

    name: str
    kind: str
    """``model``, ``z3``, ``both``, ``contract`` or ``domain``."""
    story: str
    edits: tuple[tuple[str, str, str], ...]


I4, I8, I12, I20 = " " * 4, " " * 8, " " * 12, " " * 20
MODEL_REVERSED_TAIL = ("model/pool.py", I4 + "s.free.push_tail(last)\n",
                       I4 + "s.free.push_tail(last[::-1])\n")
MODEL_RESET_KEEPS_WATCHERS = ("model/pool.py", I4 + "s.watchers.clear()\n", "")
MODEL_EVICT_SPARES = ("model/pool.py", I8 + 's.tell("evicted", b)\n' + I8 + "drop_hashes(s, b)\n",
                      I8 + 's.tell("evicted", b)\n' + I8 + "if s.ref[b] == 0:\n"
                      + I12 + "drop_hashes(s, b)\n")
Z3_EVICT_SPARES = ("proofs/transitions.py",
                   I4 + "return published(s, drop_hashes(s, b), entries_of(s, b), NO_ENTRIES)\n",
                   I4 + "return published(s, ite(s.ref[b] > 0, s, drop_hashes(s, b)),\n"
                   + I20 + " z3.If(s.ref[b] > 0, NO_ENTRIES, entries_of(s, b)), NO_ENTRIES)\n")
Z3_RESET_KEEPS_WATCHERS = ("proofs/transitions.py", I12 + "watched=z3.K(Block, z3.BoolVal(False)),\n"
                           + I12 + "live=z3.If(s.events, NO_ENTRIES, s.live),\n",
                           I12 + "live=z3.If(s.events, NO_ENTRIES, s.live),\n")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("model_frees_cached_to_tail_reversed", "model",
           "free_blocks appends the cached blocks it frees to the tail in reverse order",
           (MODEL_REVERSED_TAIL,)),
    Mutant("model_reset_keeps_watchers", "model",
           "reset_prefix_cache fires its reuse watchers but keeps them registered",
           (MODEL_RESET_KEEPS_WATCHERS,)),
    Mutant("model_alloc_keeps_watcher", "model",
           "get_new_blocks tells a block's watcher but leaves it registered",
           (("model/pool.py", I12 + "s.fire(s.watchers.pop(b), b)\n", I12 + "s.fire(s.watchers[b], b)\n"),)),
    Mutant("model_evict_spares_blocks_in_use", "model",
           "evict_blocks leaves the entries of a block someone holds", (MODEL_EVICT_SPARES,)),
    Mutant("z3_alloc_keeps_watcher", "z3", "the z3 alloc step keeps the block's watcher",
           (("proofs/transitions.py", I8 + "watched=z3.Store(s.watched, b, False),\n", ""),)),
    Mutant("z3_announcement_may_double", "z3",
           "the z3 event property without 'an announcement never doubles a live one'",
           (("proofs/step_properties.py",
             I4 + "return z3.Implies(z3.And(st.pre, s.events), z3.And(fresh, matches))\n",
             I4 + "return z3.Implies(z3.And(st.pre, s.events), matches)\n"),)),
    Mutant("z3_alloc_takes_any_free_block", "z3",
           "the order encoding's allocation takes any free block, not the head",
           (("proofs/order.py", I8 + "pre=z3.And(b != NULL, s.free[b],\n"
             + I8 + "           z3.ForAll([_x], z3.Implies(s.free[_x], s.pos[b] <= s.pos[_x]))),\n",
             I8 + "pre=z3.And(b != NULL, s.free[b]),\n"),)),
    Mutant("z3_soundness_on_primary_keys_only", "z3",
           "the z3 index_entries_are_sound speaks of primary keys only",
           (("proofs/invariants.py",
             "z3.Implies(s.idx[_k, _b], prefix(s.names[_k], s.holds[_b]))",
             "z3.Implies(z3.And(s.idx[_k, _b], s.prim[_b], s.pkey[_b] == _k),\n"
             + I8 + "prefix(s.names[_k], s.holds[_b]))"),)),
    Mutant("both_evict_spares_blocks_in_use", "both",
           "model and z3 alike: evicting a block in use keeps its entries",
           (MODEL_EVICT_SPARES, Z3_EVICT_SPARES)),
    Mutant("both_reset_keeps_watchers", "both",
           "model and z3 alike: a reset keeps the reuse watchers",
           (MODEL_RESET_KEEPS_WATCHERS, Z3_RESET_KEEPS_WATCHERS)),
    Mutant("contract_insert_needs_no_holder", "contract",
           "too weak, model and z3 alike: _insert_block_hash into a block nobody holds",
           (("model/contracts.py", I4 + 'written_by_a_holder(s, block_id, "copy KV into it")\n', ""),
            ("proofs/transitions.py",
             I8 + "s.ref[b] >= 1,  # writes_extend_unless_writable: a holder copies into it\n", ""))),
    Mutant("contract_one_block_per_key", "contract",
           "too strong, model and z3 alike: a key in use may not be cached again, even for its own prefix",
           (("model/contracts.py", I4 + "if s.index.get(key) and s.names.get(key, prefix) is not prefix:\n",
             I4 + "if s.index.get(key):\n"),
            ("proofs/transitions.py",
             I4 + "return z3.Or(s.names[k] == c, z3.ForAll([_x], z3.Not(s.idx[k, _x])))\n",
             I4 + "return z3.ForAll([_x], z3.Not(s.idx[k, _x]))\n"))),
    Mutant("domain_never_replaces", "domain", "the BMC never calls with replace_existing_hashes=True",
           (("model/domains.py", I20 + "for rep in (False, True):\n", I20 + "for rep in (False,):\n"),
            ("model/domains.py", I20 + "if nt == len(r.all_token_ids) and g == scope.groups[0]:\n",
             I20 + "if False:\n"))),
    Mutant("domain_touches_one_block", "domain", "the BMC touches one block per call, never two",
           (("model/operations.py", "split=split.touch, domain=domains.free_blocks, queue=touched_queue),",
             "split=split.touch, domain=domains.single_lists, queue=touched_queue),"),)),
)


def stage(into: Path, mutant: Mutant | None) -> Path:
    """A copy of the package in its installed layout, with ``mutant``'s edits applied."""
    pkg = into / "kvpool"
    shutil.copytree(ROOT / "kvpool", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for name in PACKAGES:
        shutil.copytree(ROOT / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path, old, new in (mutant.edits if mutant else ()):
        target = pkg / path if path.split("/")[0] in PACKAGES else into / path
        text = target.read_text(encoding="utf-8")
        if text.count(old) != 1:
            name = mutant.name if mutant else ""
            raise SystemExit(f"{name}: {path} has {text.count(old)} copies of {old!r}")
        target.write_text(text.replace(old, new), encoding="utf-8")
    return into


def judge(mutant: Mutant | None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the judge (and ``--skip`` each of ``skip``) on a staged copy; what failed, and how."""
    with tempfile.TemporaryDirectory(prefix="kvpool-mutant-") as scratch:
        root = stage(Path(scratch), mutant)
        out = root / "verify.json"
        env = {**os.environ, "PYTHONPATH": str(root), "CI": "true"}
        began = time.perf_counter()
        more = [arg for phase in skip for arg in ("--skip", phase)]
        done = subprocess.run([sys.executable, "-P", "-m", "kvpool", *JUDGE, *more, "--json", str(out)],
                              cwd=scratch, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - began
        if not out.exists():
            return {"name": mutant.name if mutant else "original", "exit": done.returncode, "refuted": False,
                    "seconds": round(seconds, 1), "failures": [], "error": done.stderr[-2000:]}
        doc = json.loads(out.read_text())
    failures = [{"case": c["id"], "kind": c["failure"]["kind"], "message": c["failure"]["message"][:300]}
                for p in doc["phases"] for c in p["cases"] if not c["ok"] and c["failure"]]
    return {"name": mutant.name if mutant else "original", "kind": mutant.kind if mutant else "",
            "exit": done.returncode, "seconds": round(seconds, 1), "failures": failures,
            "refuted": any(f["kind"] in CONCRETE for f in failures)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", default=None, help="mutant names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side")
    p.add_argument("--json", help="write the results to FILE")
    p.add_argument("--list", action="store_true", help="list the mutants and stop")
    p.add_argument("--skip", action="append", default=[], help="a further phase to skip (repeatable)")
    ns = p.parse_args(argv)
    if ns.list:
        for m in MUTANTS:
            print(f"{m.name:40} {m.kind:9} {m.story}")
        return 0
    chosen = [m for m in MUTANTS if ns.only is None or m.name in ns.only]
    todo: list[Mutant | None] = [None, *chosen] if ns.only is None else list(chosen)
    with ThreadPoolExecutor(max(1, ns.jobs)) as pool:
        results = list(pool.map(lambda m: judge(m, tuple(ns.skip)), todo))
    for r in results:
        verdict = ("refuted" if r["refuted"] else "STANDS") if r["name"] != "original" else (
            "passes" if r["exit"] == 0 else "FAILS")
        first = r["failures"][0] if r["failures"] else None
        shown = f"{first['case']}: {first['kind']}: {first['message'][:120]}" if first else ""
        print(f"{r['name']:40} {verdict:8} {r['seconds']:7.1f}s  {shown}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    original = next((r for r in results if r["name"] == "original"), None)
    ok = all(r["refuted"] for r in results if r["name"] != "original") and (
        original is None or original["exit"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
