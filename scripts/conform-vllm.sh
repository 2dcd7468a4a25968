#!/usr/bin/env bash
# Conformance of vLLM's own BlockPool against the model, for one vLLM release.
#
#   bash scripts/conform-vllm.sh VERSION [--venv DIR] [--out DIR] [-- EXTRA CONFORM ARGS]
#
# VERSION is a vLLM release (0.31.0, 0.33.0, ...). The model reproduces the
# release's behaviour with --reference MAJOR.MINOR (0.31 for 0.31.x, 0.33 for
# 0.33.x; set REFERENCE=... for another release once the model has a switch
# for it).
#
# 1. vLLM VERSION goes into DIR (default .venv-vllm-VERSION) with
#    scripts/install-vllm.sh, unless DIR already has that version importable
#    (pass an existing venv, e.g. --venv .venv-vllm033, to avoid reinstalling).
# 2. kvpool goes in with --no-deps (unless DIR already imports this checkout,
#    e.g. an editable install), plus hypothesis for the state machine.
# 3. kvpool conform --impl vllm.v1.core.block_pool:BlockPool --no-misuse
#    --reference R, with the budget below, writing OUT/conform-vllm-VERSION.json
#    and .xml (OUT defaults to reports/, which git ignores).
#
# Budget (environment): CONFORM_RUNS (4) campaign runs of CONFORM_STEPS (2000)
# calls, CONFORM_EXAMPLES (200) state-machine examples of CONFORM_MACHINE_STEPS
# (25) rules, CONFORM_SEED (0). Exit status: kvpool conform's (0 agrees,
# 1 diverges, 2 usage), or 1 if the install fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "conform-vllm.sh: ERROR: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: bash scripts/conform-vllm.sh VERSION [--venv DIR] [--out DIR] [-- ARGS]"
version="$1"; shift
[[ "$version" =~ ^([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || die "VERSION '$version' is not X.Y.Z"
reference="${REFERENCE:-${BASH_REMATCH[1]}.${BASH_REMATCH[2]}}"
venv="$root/.venv-vllm-$version"
out="$root/reports"
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) venv="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1'" ;;
    esac
done
py="$venv/bin/python"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd /  # so that `import kvpool` never picks up the checkout's top-level folder
quiet() { grep -v -e '^WARNING: Location' || true; }

have="$("$py" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || true)"
if [[ "$have" == "$version" ]] && "$py" -W ignore -c 'import vllm.v1.core.block_pool' 2>/dev/null; then
    echo "==> vLLM $version already in $venv"
else
    [[ -z "$have" ]] || echo "==> $venv has vLLM '$have', installing $version"
    bash "$root/scripts/install-vllm.sh" "$venv" "$version" 2>&1 | quiet
    [[ ${PIPESTATUS[0]} -eq 0 ]] || die "installing vLLM $version into $venv failed"
fi

here="$("$py" -c 'import kvpool, os; print(os.path.dirname(os.path.dirname(kvpool.__file__)))' 2>/dev/null || true)"
if [[ "$here" == "$root" ]]; then
    echo "==> kvpool imports from this checkout in $venv"
else
    echo "==> installing kvpool (--no-deps) into $venv"
    "$py" -m pip install -q --no-deps --no-warn-conflicts "$root" 2>&1 | quiet
fi
"$py" -c 'import hypothesis' 2>/dev/null \
    || "$py" -m pip install -q --no-warn-conflicts 'hypothesis>=6.100' 2>&1 | quiet

json="$out/conform-vllm-$version.json"
junit="$out/conform-vllm-$version.xml"
echo "==> kvpool conform against vLLM $version (--reference $reference)"
start=$(date +%s)
set +e
("$py" -W ignore -m kvpool conform --impl vllm.v1.core.block_pool:BlockPool --no-misuse \
    --reference "$reference" --runs "${CONFORM_RUNS:-4}" --steps "${CONFORM_STEPS:-2000}" \
    --examples "${CONFORM_EXAMPLES:-200}" --machine-steps "${CONFORM_MACHINE_STEPS:-25}" \
    --seed "${CONFORM_SEED:-0}" --json "$json" --junit "$junit" "${extra[@]}")
rc=$?
set -e
echo "==> exit $rc after $(( $(date +%s) - start )) s; results in $json and $junit"
exit $rc
