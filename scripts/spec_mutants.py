"""The specification's mutation score: mutants of the spec, each judged by the formal side alone.

Every mutant (:mod:`spec_mutation.mutate`: one small edit of the model's actions, guards,
contracts, properties, invariants, domains or split, or of the z3 steps, invariants, step
properties or queue order) is judged in a fresh process by the checks of ``kvpool verify
--profile ci`` that run no pool (:mod:`spec_mutation.judge`): proofs, agreement, z3 samples,
BMC, domain coverage, legal corpus; cheapest first, stopping at the first concrete failure.

    python scripts/spec_mutants.py --list                       # the population, per file
    python scripts/spec_mutants.py --sample 240 --seed 38 --jobs 2 --out sample.jsonl
    python scripts/spec_mutants.py --all --jobs 2 --out all.jsonl [--shard 1/4]
    python scripts/spec_mutants.py --report sample.jsonl        # the per-file table again
    python scripts/spec_mutants.py --only model/guards.py#40    # some mutants, by id
    python scripts/spec_mutants.py --named --jobs 2             # the hand-written wrong specs

The run judges a copy of the package staged when it starts (the sources as they were then:
editing the checkout meanwhile changes nothing of it). A sample is stratified by file (each
file's share of the population, at least ``--min-per-file``) and drawn with
``random.Random(seed)``: the same seed and sources give the same mutants. Results are
appended to ``--out`` as they come (one JSON line each), and a run given the same file again
skips the mutants it already holds, so a long run can stop and go on. Before its mutants,
each file's unmutated code is judged the same way (it must pass) and its steps measured: a
mutant's step budget is ``--budget-factor`` times that, plus a million. Verdicts:
``refuted`` (a concrete failure: a counterexample, a violation, an exception on a concrete
input), ``survived``, ``equivalent`` (survived, and listed in
``spec_mutation/equivalent.tsv`` with why), ``timeout`` (the step budget), ``undecided`` (z3
gave up), ``backstop`` (the process's CPU or memory limit). Only ``refuted`` counts as
killed; the score is refuted / (mutants - equivalent).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spec_mutation.judge import default_checks
from spec_mutation.mutate import (
    FILES,
    ROOT,
    Mutant,
    apply,
    digest,
    instrumented,
    module_of,
    population,
    source,
)
from spec_mutation.named import NAMED, Named, edited

JUDGE = Path(__file__).resolve().parent / "spec_mutation" / "judge.py"
EQUIVALENT = Path(__file__).resolve().parent / "spec_mutation" / "equivalent.tsv"
CPU_BACKSTOP = 1200
"""Seconds of CPU a judge process may use (the unmutated spec needs about 60): a safety net."""
MEMORY_BACKSTOP = 4 << 30
PACKAGES = ("model", "impl", "proofs", "oracle", "bugs")
KINDS = ("refuted", "survived", "equivalent", "timeout", "undecided", "backstop")
"""The verdicts, in the table's order."""


def stage(into: Path) -> Path:
    """A copy of the package in its installed layout (``kvpool/``, ``kvpool/model``, ...); the root
    the specification's files are read from (``kvpool/``)."""
    pkg = into / "kvpool"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "kvpool", pkg, ignore=skip)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, pkg / name, ignore=skip)
    return pkg


def equivalents() -> dict[str, str]:
    """Listed equivalent mutants: key (``FILE|PLACE``: stable under edits elsewhere in the file, unlike
    the number) -> why no check can tell them apart."""
    lines = EQUIVALENT.read_text(encoding="utf-8").splitlines() if EQUIVALENT.exists() else []
    return dict(x.partition("\t")[::2] for x in lines if x.strip() and not x.startswith("#"))


def stratified(pop: dict[str, list[Mutant]], n: int, seed: int, floor: int) -> list[Mutant]:
    """``n`` mutants, each file's share proportional to its population (at least ``floor``), drawn
    with ``random.Random(seed)`` file by file in :data:`FILES` order."""
    total = sum(len(v) for v in pop.values())
    want = {f: min(len(v), max(floor, round(n * len(v) / total))) for f, v in pop.items()}
    rng = random.Random(seed)
    out: list[Mutant] = []
    for f in pop:
        out += sorted(rng.sample(pop[f], want[f]), key=lambda m: m.number)
    return out


def _judged(trees: dict[str, ast.Module], budget: int, pkg: Path | None,
            checks: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Files of the package staged at ``pkg`` (None: the installed one, the checkout's files) replaced
    by ``trees`` (path -> syntax tree), judged within ``budget`` steps by ``checks`` (default: those
    for the files) in a fresh judge process; its verdict (``backstop`` if the process was killed)."""
    modules = [(module_of(p), str((pkg or ROOT) / p), instrumented(tree)) for p, tree in trees.items()]
    with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
        pickle.dump({"modules": modules, "checks": checks or default_checks(list(trees)),
                     "step_budget": budget, "cpu_seconds": CPU_BACKSTOP, "memory_bytes": MEMORY_BACKSTOP}, f)
    began = time.perf_counter()
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if pkg is not None:
        env["PYTHONPATH"] = str(pkg.parent)
    try:
        done = subprocess.run([sys.executable, "-P", str(JUDGE), f.name], capture_output=True, text=True,
                              env=env, check=False, cwd=tempfile.gettempdir())
    finally:
        os.unlink(f.name)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        out = {"verdict": "backstop", "message": f"judge exit {done.returncode}: {done.stderr[-300:]}"}
    else:
        out = json.loads(lines[-1])
    out["wall"] = round(time.perf_counter() - began, 1)
    return out


def baseline(path: str, pkg: Path) -> dict[str, Any]:
    """The unmutated file judged as its mutants are: it must pass; its steps set their budget."""
    text = source(path, pkg)
    out = _judged({path: ast.parse(text)}, 10**12, pkg)
    return {"id": f"{path}#original", "file": path, "digest": digest(text), **out}


def judge_mutant(m: Mutant, budget: int, pkg: Path) -> dict[str, Any]:
    out = _judged({m.file: apply(m, pkg)}, budget, pkg)
    return {"id": m.id, "file": m.file, "digest": m.file_digest, "line": m.line, "operator": m.operator,
            "before": m.before, "after": m.after, "key": f"{m.file}|{m.place}", **out}


def judge_named(n: Named, budget: int, pkg: Path) -> dict[str, Any]:
    texts = edited(n, pkg)
    out = _judged({p: ast.parse(t) for p, t in texts.items()}, budget, pkg)
    return {"id": n.name, "file": "+".join(texts), "digest": digest("".join(texts.values())), "kind": n.kind,
            "story": n.story, **out}


def _done(out: Path | None) -> dict[str, dict[str, Any]]:
    lines = out.read_text(encoding="utf-8").splitlines() if out is not None and out.exists() else []
    return {(r := json.loads(x))["id"]: r for x in lines if x.strip()}


def run(pkg: Path, mutants: Sequence[Mutant], jobs: int, out: Path | None, factor: int,
        named: Sequence[Named] = ()) -> list[dict[str, Any]]:
    """Judge the files' unmutated code, then every mutant (``jobs`` at a time), all over the package
    staged at ``pkg``; rows in order.  Rows already in ``out`` for the same code are kept."""
    digests = {f: digest(source(f, pkg)) for f in {m.file for m in mutants}
               | {p for n in named for p, _o, _n in n.edits}}
    done = {i: r for i, r in _done(out).items()
            if r.get("digest") == digests.get(r["file"], r.get("digest")) or "+" in r["file"]}
    files = sorted(digests, key=lambda f: (FILES.index(f) if f in FILES else len(FILES), f))

    def record(row: dict[str, Any]) -> dict[str, Any]:
        if out is not None:
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        print(f"{row['verdict']:10} {row.get('check', ''):22} {row.get('wall', 0):6.1f}s  {row['id']}",
              flush=True)
        return row

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        todo = [f for f in files if f"{f}#original" not in done]
        for row in pool.map(lambda f: baseline(f, pkg), todo):
            done[row["id"]] = record(row)
        steps = {f: done[f"{f}#original"].get("steps", 0) for f in files}
        if bad := [f for f in files if done[f"{f}#original"]["verdict"] != "survived"]:
            raise SystemExit(f"the unmutated specification does not pass the judge: {bad}")

        def budget(paths: Iterable[str]) -> int:
            return factor * max(steps[p] for p in paths) + 1_000_000

        rows = [pool.submit(judge_mutant, m, budget([m.file]), pkg) for m in mutants if m.id not in done]
        named_rows = [pool.submit(judge_named, n, budget(p for p, _o, _n in n.edits), pkg)
                      for n in named if n.name not in done]
        for fut in [*rows, *named_rows]:
            done[fut.result()["id"]] = record(fut.result())
    return [done[m.id] for m in mutants] + [done[n.name] for n in named]


def verdict(row: dict[str, Any], listed: dict[str, str]) -> str:
    return "equivalent" if row["verdict"] == "survived" and row.get("key") in listed else str(row["verdict"])


def report(rows: Sequence[dict[str, Any]], population_sizes: dict[str, int] | None = None) -> str:
    """The per-file table: mutants judged, each verdict, the score; then every mutant not refuted."""
    listed = equivalents()
    by_file: dict[str, Counter[str]] = {}
    cpu: Counter[str] = Counter()
    for r in rows:
        by_file.setdefault(r["file"], Counter())[verdict(r, listed)] += 1
        cpu[r["file"]] += r.get("cpu", 0.0)
    sizes = population_sizes or {}
    head = "| file | population | judged | " + " | ".join(KINDS) + " | score | CPU s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    lines += [_row(f, sizes.get(f), by_file[f], cpu[f])
              for f in sorted(by_file, key=lambda x: FILES.index(x) if x in FILES else len(FILES))]
    total = sum(by_file.values(), Counter())
    lines.append(_row("**all**", sum(sizes.values()) or None, total, sum(cpu.values())))
    standing = [r for r in rows if verdict(r, listed) not in ("refuted", "equivalent")]
    if standing:
        lines += ["", "Not refuted:"]
        lines += [f"- {r['id']} [{verdict(r, listed)}] line {r.get('line', '')} {r.get('operator', '')}: "
                  f"{r.get('before', '')}  ->  {r.get('after', '')}" for r in standing]
    return "\n".join(lines)


def _percent(c: Counter[str]) -> float | None:
    """Refuted / (judged - listed equivalent) of verdict counts, in per cent (None: nothing scored)."""
    scored = sum(c.values()) - c["equivalent"]
    return 100 * c["refuted"] / scored if scored else None


def score(rows: Sequence[dict[str, Any]]) -> float | None:
    """The score of ``rows``: :func:`_percent` of their verdicts."""
    listed = equivalents()
    return _percent(Counter(verdict(r, listed) for r in rows))


def _verdict(rows: Sequence[dict[str, Any]], fail_under: float | None) -> int:
    """The exit code: 1 when the score is below ``fail_under`` (a weekly run that lost ground fails)."""
    got = score(rows)
    if fail_under is None or got is None or got >= fail_under:
        return 0
    print(f"score {got:.1f} % is below {fail_under:g} %", file=sys.stderr)
    return 1


def _row(name: str, pop: int | None, c: Counter[str], cpu: float) -> str:
    got = _percent(c)
    score = "-" if got is None else f"{got:.1f} %"
    return (f"| {name} | {pop if pop is not None else ''} | {sum(c.values())} | "
            + " | ".join(str(c[k]) for k in KINDS) + f" | {score} | {cpu:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="count (and with -v list) the population")
    what.add_argument("--sample", type=int, metavar="N", help="a stratified random sample of N mutants")
    what.add_argument("--all", action="store_true", help="every mutant")
    what.add_argument("--only", nargs="+", metavar="ID", help="these mutants (FILE#NUMBER)")
    what.add_argument("--named", action="store_true", help="the hand-written wrong specifications")
    what.add_argument("--report", metavar="FILE", help="the table of a results file")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--min-per-file", type=int, default=8)
    p.add_argument("--shard", default="1/1", help="I/N: every N-th mutant from the I-th (with --all)")
    p.add_argument("--jobs", type=int, default=1, help="judges side by side (at most the cores)")
    p.add_argument("--budget-factor", type=int, default=10)
    p.add_argument("--fail-under", type=float, metavar="PCT",
                   help="exit 1 when the score (all files) is below PCT per cent")
    p.add_argument("--out", type=Path, help="append results here (JSON lines); resume from it")
    p.add_argument("-v", "--verbose", action="store_true")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvpool-spec-") as scratch:
        return _main(ns, stage(Path(scratch)))


def _main(ns: argparse.Namespace, pkg: Path) -> int:
    pop = population(pkg)
    sizes = {f: len(v) for f, v in pop.items()}
    if ns.list:
        for f, ms in pop.items():
            print(f"{f:28} {len(ms):5}  " + ", ".join(f"{k} {v}" for k, v in
                                                    Counter(m.operator for m in ms).most_common(5)))
            if ns.verbose:
                print("\n".join("    " + m.describe() for m in ms))
        print(f"{'all':28} {sum(sizes.values()):5}")
        return 0
    if ns.report:
        rows = [r for r in _done(Path(ns.report)).values() if not r["id"].endswith("#original")]
        print(report(rows, sizes))
        return _verdict(rows, ns.fail_under)
    began = time.perf_counter()
    if ns.named:
        rows = run(pkg, [], ns.jobs, ns.out, ns.budget_factor, NAMED)
    else:
        if ns.sample:
            chosen = stratified(pop, ns.sample, ns.seed, ns.min_per_file)
        elif ns.only:
            by_id = {m.id: m for ms in pop.values() for m in ms}
            chosen = [by_id[i] for i in ns.only]
        else:
            index, count = (int(x) for x in ns.shard.split("/"))
            chosen = [m for ms in pop.values() for m in ms][index - 1::count]
        rows = run(pkg, chosen, ns.jobs, ns.out, ns.budget_factor)
    print(report(rows, sizes))
    print(f"wall {time.perf_counter() - began:,.0f} s")
    return _verdict([r for r in rows if "#" in r["id"] and not r["id"].endswith("#original")], ns.fail_under)


if __name__ == "__main__":
    raise SystemExit(main())
