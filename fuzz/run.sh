#!/usr/bin/env bash
# Fuzz the two file readers (kvpool check-trace, kvpool check-events) with atheris.
#
#   bash fuzz/run.sh [SECONDS] [RUNS]
#
# Each harness of fuzz/fuzz_readers.py runs for SECONDS (default 60) or RUNS inputs
# (default: no limit), whichever ends first, with a per-input time limit of
# FUZZ_TIMEOUT seconds (default 10: an input that takes longer is a hang) and
# FUZZ_RSS_MB of memory (default 2048). Then one line per reader: runs, execs/s,
# coverage (libFuzzer's cov/ft over the instrumented kvpool modules), corpus size,
# crashes. Crashing inputs are kept as fuzz/out/READER/crash-* (hangs timeout-*,
# memory oom-*); replay one with
#   .venv-fuzz/bin/python fuzz/fuzz_readers.py replay trace fuzz/out/trace/crash-...
#
# atheris gets its own venv (FUZZ_VENV, default .venv-fuzz) with kvpool installed
# editable and without its dependencies (the readers need none). atheris 3.1.0
# ships wheels for CPython 3.12+ only and no sdist; on 3.11 pip picks 3.0.0, the
# newest with a cp311 wheel. Where atheris cannot be installed, the script says so
# and exits 0. Exit 1 if any reader crashed or hung, else 0.
# FUZZ_READERS="trace events" picks the harnesses.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${FUZZ_SECONDS:-60}}"
runs="${2:-${FUZZ_RUNS:--1}}"
venv="${FUZZ_VENV:-.venv-fuzz}"
python="${PYTHON:-python3}"
readers="${FUZZ_READERS:-trace events}"
out=fuzz/out

quiet() { grep -v -e '^WARNING: Location' -e '^$' || true; }

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" || { echo "fuzz/run.sh: cannot create $venv; not fuzzing"; exit 0; }
fi
if ! "$venv/bin/python" -c 'import atheris' 2>/dev/null; then
    if ! "$venv/bin/pip" install -q --disable-pip-version-check 'atheris>=3.0,<3.2' 2>&1 | quiet \
        || ! "$venv/bin/python" -c 'import atheris' 2>/dev/null; then
        echo "fuzz/run.sh: atheris does not install for $("$venv/bin/python" -V 2>&1) on this machine" \
             "(it needs a prebuilt wheel, or clang with libFuzzer to build one); not fuzzing."
        exit 0
    fi
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e . 2>&1 | quiet
atheris_version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("atheris"))')"
echo "== atheris $atheris_version on $("$venv/bin/python" -V 2>&1); $seconds s or $runs runs per reader"

rm -rf "$out/seeds"
"$venv/bin/python" fuzz/fuzz_readers.py seeds "$out/seeds" || exit 1

status=0
summary=()
for reader in $readers; do
    dir="$out/$reader"
    mkdir -p "$dir/corpus"
    cp "$out/seeds/$reader"/* "$dir/corpus/"
    log="$dir/fuzz.log"
    echo "== $reader: log in $log"
    touch "$dir/.start"
    start=$(date +%s)
    "$venv/bin/python" fuzz/fuzz_readers.py "$reader" \
        -max_total_time="$seconds" -runs="$runs" -timeout="${FUZZ_TIMEOUT:-10}" \
        -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -max_len=131072 -dict=fuzz/readers.dict \
        -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" >"$log" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - start ))
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    done_runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
    execs=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$last" || true)
    corp=$(grep -oE 'corp: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    crashes=$(find "$dir" -maxdepth 1 \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \) \
              -newer "$dir/.start" | wc -l)
    line="$reader: ${done_runs:-?} runs in ${elapsed} s, ${execs:-?} execs/s, ${cov:-cov ?}, corpus ${corp:-?}, crashes/hangs $crashes (exit $rc)"
    summary+=("$line")
    if [[ $rc -ne 0 || $crashes -ne 0 ]]; then
        status=1
        grep -A 30 -E 'Uncaught Python exception|ERROR: libFuzzer' "$log" | head -n 40
    fi
done
echo "== summary (atheris $atheris_version)"
printf '%s\n' "${summary[@]}"
exit $status
