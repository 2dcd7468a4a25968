#!/usr/bin/env bash
# Mutation testing of impl/ and model/ with mutmut; see docs/mutation.md.
#
#   bash benchmarks/mutation.sh impl|model|all              # full run, fresh copy
#   bash benchmarks/mutation.sh impl|model|all --rerun-undetected
#       # keep the last run's copy, take tests/ as they are now, re-test only the mutants
#       # that survived or had no test (after adding killers; sources must be unchanged)
#
# Installs mutmut into its own venv (.venv-mutation, ignored by git), copies the tree into
# a staging folder in the layout the package installs as, and runs mutmut there with ONE
# worker: the checkout itself is never mutated, so tests can run on it meanwhile.
# Killers (KILLERS in benchmarks/mutation_run.py): impl/ <- impl unit and impl events,
# misuse, callbacks, lockstep, hashing tests and the refusal table
# (tests/test_refusal_messages.py); model/ <- model scenarios, proofs agreement, BMC
# (kvpool.proofs.bmc explores the model and checks every invariant and step property), the
# refusal table, the impl unit and impl events tests (some of their killers run the model
# too) and the lockstep.  The `ci` Hypothesis profile; mutmut's
# per-mutant CPU limit is (duration of the tests covering the mutant + 1 s) x 8.
#
# Environment: MUTATION_VENV (default .venv-mutation), MUTATION_WORK (default
# .venv-mutation/work; one folder per target, kept for `mutmut show NAME` afterwards),
# MUTATION_PYTHON (default python3), MUTATION_MEM_KB (virtual memory cap of the mutmut run,
# default 6000000), MUTATION_WORKERS (mutmut's children, default 1), MUTATION_ONLY (mutant
# name globs, space-separated, e.g. 'kvpool.model.pool.*': a full run tests only those, and the
# report scores the checked mutants, module by module).  Exit status 0 (numbers are a report, not a gate).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-all}
mode=${2:-full}
case "$mode" in
    full|--rerun-undetected) ;;
    *) echo "usage: bash benchmarks/mutation.sh impl|model|all [--rerun-undetected]" >&2; exit 2 ;;
esac
case "$target" in
    impl) targets=(impl) ;;
    model) targets=(model) ;;
    all) targets=(impl model) ;;
    *) echo "usage: bash benchmarks/mutation.sh impl|model|all [--rerun-undetected]" >&2; exit 2 ;;
esac
venv=${MUTATION_VENV:-$root/.venv-mutation}
work=${MUTATION_WORK:-$root/.venv-mutation/work}
mutmut_version=3.8.1

if ! "$venv/bin/python" -c "import mutmut, z3, hypothesis, pytest" 2>/dev/null \
        || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mutmut"))')" != "$mutmut_version" ]; then
    "${MUTATION_PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
    # The project's runtime and test dependencies, not the project: the staged copy is imported.
    "$venv/bin/pip" install -q "mutmut==$mutmut_version" 'z3-solver>=4.12' 'hypothesis>=6.100' 'pytest>=8' \
        2>&1 | grep -v '^WARNING: Location' || true
fi

export HYPOTHESIS_PROFILE=ci PYTHONHASHSEED=0
summary=()
for t in "${targets[@]}"; do
    stage="$work/$t"
    echo "== mutmut over $t/ in $stage ($mode)"
    names=()
    if [ "$mode" = full ] || [ ! -d "$stage/mutants" ]; then
        "$venv/bin/python" "$root/benchmarks/mutation_run.py" stage "$t" "$stage"
        read -r -a names <<< "${MUTATION_ONLY:-}"
    else
        "$venv/bin/python" "$root/benchmarks/mutation_run.py" refresh-tests "$t" "$stage"
        mapfile -t names < <("$venv/bin/python" "$root/benchmarks/mutation_run.py" undetected "$t" "$stage")
        echo "re-testing ${#names[@]} mutants"
    fi
    start=$(date +%s)
    # mutmut's live progress line is long; keep the log, show its tail.
    if [ "$mode" = full ] || [ "${#names[@]}" -gt 0 ]; then
        # A mutant that loops while appending can eat all memory before its CPU limit: cap it.
        # Tests start subprocesses with python -P (no current folder on the path): they find the
        # mutated package through PYTHONPATH.  mutants/ must exist before mutmut starts: Python
        # caches "no finder" for a PYTHONPATH folder missing at start-up and never looks in it
        # again, so every test would fail to import kvpool (mutmut: "failed to run pytest").
        mkdir -p "$stage/mutants"
        (cd "$stage" && ulimit -v "${MUTATION_MEM_KB:-6000000}" \
            && PYTHONPATH="$stage/mutants${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/mutmut" run --max-children "${MUTATION_WORKERS:-1}" "${names[@]}") > "$stage/mutmut-$mode.log" 2>&1 \
            || { tail -n 40 "$stage/mutmut-$mode.log"; echo "mutmut failed on $t (log: $stage/mutmut-$mode.log)" >&2
                 exit 1; }
        tr '\r' '\n' < "$stage/mutmut-$mode.log" | grep -v '^\s*$' | tail -n 2
    fi
    end=$(date +%s)
    "$venv/bin/python" "$root/benchmarks/mutation_run.py" report "$t" "$stage" | tee "$stage/report.txt"
    echo "wall time $((end - start)) s"
    summary+=("$t: $(sed -n 3p "$stage/report.txt") in $((end - start)) s")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
