"""Helper of ``benchmarks/mutation.sh``: stage a copy of the tree for mutmut, then tally its results.

    python benchmarks/mutation_run.py stage TARGET STAGE_DIR   # copy the tree, write mutmut's config
    python benchmarks/mutation_run.py report TARGET STAGE_DIR  # killed / survived / timed out, score
    python benchmarks/mutation_run.py refresh-tests TARGET STAGE_DIR  # copy tests/ in again
    python benchmarks/mutation_run.py undetected TARGET STAGE_DIR  # names of survived / untested mutants
    python benchmarks/mutation_run.py equivalents TARGET STAGE_DIR  # EQUIVALENT as markdown, with diffs

``TARGET`` is ``impl`` or ``model``.  The checkout is never written to: ``stage`` copies the
files git knows (tracked, plus untracked ones that are not ignored) into ``STAGE_DIR`` in the
layout the package installs as (``kvpool/impl``, ``kvpool/model``, ...), so mutmut's module
names are the real ones (``kvpool.impl.pool``) and its ``mutants/`` folder lives in the copy.

The score counts equivalent mutants (``EQUIVALENT``, read from ``equivalent_mutants.tsv``) as
neither killed nor survived: score = killed / (mutants - equivalent).  Timeouts count as
killed, as mutmut counts them (a mutant that makes the suite hang is detected), and are
printed separately.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The killers of each target: fast tests only, run with the ``ci`` Hypothesis profile.  The
# mutation killers live in the component files (test_hashing, test_impl_pool, test_impl_block,
# test_impl_free_queue, test_impl_hash_index, test_impl_events,
# test_model_scenarios); test_refusal_messages.py runs every misuse on the pool and the model.
# Some of the pool's killers (group ids, a masked range's parent hash) also run the model, and
# the lockstep compares the model's events with the pool's, so those files kill model/ mutants
# too.  model/split.py (a call's per-block z3 steps) is run by proofs.agreement alone, so
# test_agreement.py is a killer of model/, and model/derived.py (the parts an operation's kinds
# say) is run by test_derived_parts.py.  tests/test_registry.py cannot be one: it lists
# each model module's functions, and mutmut's trampolines add a function per mutant.
KILLERS: dict[str, list[str]] = {
    "impl": ["tests/test_impl_pool.py", "tests/test_impl_block.py", "tests/test_impl_free_queue.py",
             "tests/test_impl_hash_index.py", "tests/test_impl_events.py", "tests/test_misuse.py",
             "tests/test_callbacks.py", "tests/test_lockstep.py", "tests/test_hashing.py",
             "tests/test_refusal_messages.py"],
    "model": ["tests/test_model_scenarios.py", "tests/test_proofs.py", "tests/test_agreement.py",
              "tests/test_bmc.py", "tests/test_refusal_messages.py", "tests/test_contracts.py",
              "tests/test_impl_pool.py", "tests/test_impl_events.py", "tests/test_lockstep.py",
              "tests/test_derived_parts.py"],
}

# Folders of the checkout and where they sit in the installed package (and the staged tests).
PACKAGE_DIRS = {"kvpool": "kvpool", "model": "kvpool/model", "impl": "kvpool/impl",
                "proofs": "kvpool/proofs", "oracle": "kvpool/oracle", "bugs": "kvpool/bugs", "tests": "tests"}

# Mutants that no test can kill because they do not change behaviour, by mutmut's name, with the
# reason: data, kept in equivalent_mutants.tsv beside this file (docs/mutation.md).  Names are
# stable as long as the mutated function is unchanged.
EQUIVALENT_FILE = Path(__file__).resolve().with_name("equivalent_mutants.tsv")


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """The equivalent-mutant list: one ``name<TAB>reason`` line each; ``#`` comments, a header."""
    out: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#") or line == "mutant\treason":
            continue
        name, tab, reason = line.partition("\t")
        if not tab or not name or not reason or "\t" in reason:
            raise ValueError(f"{path}:{number}: expected 'mutant<TAB>reason'")
        if name in out:
            raise ValueError(f"{path}:{number}: {name} listed twice")
        out[name] = reason
    return out


EQUIVALENT: dict[str, str] = load_equivalent()

# mutmut's exit codes.  A mutant outliving its CPU limit gets SIGXCPU (-24), then SIGKILL (-9) a
# second later; -9 also marks one that ran out of memory (the script caps each run's memory).
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout",
          255: "timeout", -9: "timeout", -11: "segfault", 37: "caught by type check"}


def _copy_tree(dest: Path, tests_only: bool = False) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in listed:
        top, _, rest = rel.partition("/")
        if not rest or top not in PACKAGE_DIRS or (tests_only and top != "tests"):
            continue
        src, out = ROOT / rel, dest / PACKAGE_DIRS[top] / rest
        if src.is_file():  # not deleted in the work tree while still in the index
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def stage(target: str, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _copy_tree(dest)
    pytest_opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    config = [  # a JSON string or list of strings (json.dumps) is a TOML one too
        "[tool.pytest.ini_options]",
        f"testpaths = {json.dumps(pytest_opts.get('testpaths', ['tests']))}",
        # The default run's tests: a slow one (a search kvpool verify makes) costs each surviving
        # mutant it covers minutes, and made a whole run of the model about ten times longer.
        '''addopts = "--import-mode=importlib -p no:cacheprovider -m 'not slow'"''',
        f"markers = {json.dumps(pytest_opts.get('markers', []))}",
        "",
        "[tool.mutmut]",
        'source_paths = ["kvpool"]',
        f'only_mutate = ["kvpool/{target}/*"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(KILLERS[target])}",
        # mutmut adds -x -q itself.  The cross-process hash test starts python -P: the child
        # cannot import the staged, trampolined package (and would report no stats if it could).
        # The domain test measures the model's branches with coverage.py, and mutmut's
        # trampolines are branches of their own: it fails on the unmutated model.
        "pytest_add_cli_args = ['--deselect', "
        "'tests/test_hashing.py::test_hash_is_stable_across_processes', '--deselect', "
        "'tests/test_bmc.py::test_the_domains_reach_every_branch_of_every_action']",
        # per-mutant CPU limit: (time of the tests that cover it + 1 s) x 4 x 2 (mutmut's default
        # factor 15 x 2 lets a hanging mutant of the pool burn 10 CPU minutes)
        "timeout_multiplier = 4.0",
        "timeout_constant = 1.0",
        "use_git_change_detection = false",
        "",
    ]
    (dest / "pyproject.toml").write_text("\n".join(config))


def tally(dest: Path) -> tuple[Counter[str], dict[str, str]]:
    status_of: dict[str, str] = {}
    for meta in sorted((dest / "mutants").rglob("*.meta")):
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            status = "not checked" if code is None else STATUS.get(code, "suspicious")
            status_of[name] = "equivalent" if name in EQUIVALENT and status == "survived" else status
    return Counter(status_of.values()), status_of


def _detected(counts: Counter[str]) -> int:
    """Mutants a test or the type checker caught (timeouts count, as mutmut counts them)."""
    return counts["killed"] + counts["timeout"] + counts["caught by type check"]


def report(target: str, dest: Path) -> int:
    counts, status_of = tally(dest)
    checked = sum(counts.values()) - counts["not checked"]
    detected = _detected(counts)
    scored = checked - counts["equivalent"]
    score = 100.0 * detected / scored if scored else 0.0
    print(f"== mutation score of {target}/ (mutmut, killers: {' '.join(KILLERS[target])})")
    other = checked - sum(counts[s] for s in ("killed", "survived", "timeout", "equivalent", "no tests"))
    print(f"mutants {checked}  killed {counts['killed']}  survived {counts['survived']}  "
          f"timed out {counts['timeout']}  equivalent {counts['equivalent']}  "
          f"no tests {counts['no tests']}  other {other}")
    print(f"score {score:.1f}% = (killed + timed out) / (mutants - equivalent) = {detected}/{scored}")
    if counts["not checked"]:
        # a run limited to some modules (MUTATION_ONLY): the score is theirs; each module's below
        print(f"not checked {counts['not checked']} (outside MUTATION_ONLY): the score is of the "
              "checked mutants only")
    by_module: dict[str, Counter[str]] = {}
    for name, status in status_of.items():
        by_module.setdefault(name.split(".x", 1)[0], Counter())[status] += 1
    for module, c in sorted(by_module.items()):
        mod_checked = sum(c.values()) - c["not checked"]
        if mod_checked:
            print(f"  {module}: {_detected(c)}/{mod_checked - c['equivalent']} "
                  f"({c['equivalent']} equivalent, {c['not checked']} not checked)")
    for name, status in sorted(status_of.items()):
        if status not in ("killed", "timeout", "equivalent", "not checked"):
            print(f"  {status}: {name}")
    stale = sorted(set(EQUIVALENT) - {n for n, s in status_of.items() if s in ("equivalent", "not checked")})
    for name in stale:
        if name.startswith(f"kvpool.{target}."):
            print(f"  listed as equivalent but {status_of.get(name, 'absent')}: {name}")
    return 0


def print_equivalents(target: str, dest: Path) -> None:
    """One markdown line per equivalent mutant of ``target``: name, the changed line, why."""
    mutmut = Path(sys.executable).parent / "mutmut"
    for name, reason in sorted(EQUIVALENT.items()):
        if not name.startswith(f"kvpool.{target}."):
            continue
        diff = subprocess.run([str(mutmut), "show", name], cwd=dest, capture_output=True, text=True).stdout
        changed = [line[1:].strip() for line in diff.splitlines()
                   if line[:1] in "-+" and not line.startswith(("---", "+++"))]
        change = " → ".join(f"`{c}`" for c in changed) or "(diff unavailable)"
        print(f"- `{name.removeprefix('kvpool.')}`: {change}. {reason}")


def main(argv: list[str]) -> int:
    commands = ("stage", "report", "refresh-tests", "undetected", "equivalents")
    if len(argv) != 3 or argv[0] not in commands or argv[1] not in KILLERS:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, target, dest = argv[0], argv[1], Path(argv[2]).resolve()
    if cmd == "stage":
        stage(target, dest)
    elif cmd == "refresh-tests":
        # the tests as they are now, in the stage and in mutmut's copy of it
        _copy_tree(dest, tests_only=True)
        if (dest / "mutants").is_dir():
            _copy_tree(dest / "mutants", tests_only=True)
            # mutmut maps each test to the functions it calls, and re-maps only tests that are
            # new: a killer added to an existing test would never run for the mutant it kills.
            (dest / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    elif cmd == "undetected":
        _, status_of = tally(dest)
        for name, status in sorted(status_of.items()):
            if status in ("survived", "no tests"):  # listed equivalents tally as "equivalent"
                print(name)
    elif cmd == "equivalents":
        print_equivalents(target, dest)
    else:
        return report(target, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
