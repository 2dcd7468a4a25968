#!/usr/bin/env bash
# vLLM's own tests of the block pool, prefix caching, KV-cache utils, single-type
# managers and the scheduler (tests/v1/core of vLLM's source distribution), run on
# CPU twice in a vLLM venv where kvpool is installed: once with vLLM's own pool
# under kvpool's shadow (VLLM_PLUGINS=kvpool KVPOOL_PLUGIN=shadow) and once with kvpool's pool,
# which vLLM's own plugin loader puts in place (VLLM_PLUGINS=kvpool), on the tests that passed
# with vLLM's. Prints both pass counts and fails if one of those does not pass with kvpool's,
# unless it is a deliberate difference listed in oracle/REFERENCE_DIFFERENCES.md.
#
#   bash scripts/vllm-own-tests.sh VLLM_VENV [VLLM_VERSION]
#
# The sdist (43 MB; the wheel has no tests) is fetched from PyPI once, checked
# against its pinned sha256, and kept in KVPOOL_CACHE (default ~/.cache/kvpool).
# Results: reports/vllm-own-tests/{vllm,kvpool}.xml and .log; the shadow's traces and totals in
# reports/vllm-own-tests/shadow/ (scripts/vllm_own_tests/shadow_report.py reads them).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:?usage: bash scripts/vllm-own-tests.sh VLLM_VENV [VLLM_VERSION]}"
version="${2:-0.31.0}"
declare -A SHA256=(
    [0.31.0]=dde46f1efbe846e5bd0c5c4ec6ec71842c42254c7ff3d9bebb2a57028715d380
)
sha="${SHA256[$version]:?no pinned sha256 for vLLM $version}"
root="$PWD"
py="$(cd "$venv" && pwd)/bin/python"
cache="${KVPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool}"
sdist="$cache/vllm-$version.tar.gz"
mkdir -p "$cache"

if ! { [ -f "$sdist" ] && echo "$sha  $sdist" | sha256sum -c --quiet; }; then
    echo "==> fetching vllm-$version.tar.gz from PyPI (cached in $cache)"
    url="$("$py" - "$version" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request("https://pypi.org/simple/vllm/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
print(next(f["url"] for f in files if f["filename"] == f"vllm-{sys.argv[1]}.tar.gz"))
PY
)"
    "$py" -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" \
        "$url" "$sdist.part"
    echo "$sha  $sdist.part" | sha256sum -c --quiet || { echo "sha256 mismatch for $url" >&2; exit 1; }
    mv "$sdist.part" "$sdist"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist" -C "$work" "vllm-$version/tests"
tests="$work/vllm-$version"
# The models the scheduler tests configure, their architecture only (config.json), in an offline
# Hugging Face cache: those tests then run here, where the hub cannot be reached.
"$py" scripts/vllm_own_tests/hf_cache.py "$work/hf" | sed 's/^/    /'

# What tests/v1/core imports beyond the pool's import chain (scripts/install-vllm.sh).
"$py" -m pip install -q --no-warn-conflicts pytest 2>&1 | grep -v '^WARNING: Location' || true
"$py" -m pip install -q --no-deps --no-warn-conflicts einops==0.8.2 httpx==0.28.1 2>&1 \
    | grep -v '^WARNING: Location' || true

out="$PWD/reports/vllm-own-tests"
mkdir -p "$out"
# tests/conftest.py needs vLLM's whole dependency closure (a GPU engine, model downloads):
# --noconftest. The hybrid hit-rate test starts an OpenAI server on a real model; the uniform-spec
# test touches no pool and fails on a busy machine (a 60 s timeout on an interpreter it starts).
# About 70 of vLLM's tests still fail here at once (multimodal models whose processors need more
# than a configuration, end-to-end tests that load weights, fixtures of tests/conftest.py);
# rendering tracebacks took most of the run (test_scheduler.py: 110 s against 32 s with
# --tb=line). The baseline run prints one line per failure (the JUnit file keeps each message);
# kvpool's run, on the tests that passed with vLLM's pool, prints short tracebacks.
run() {  # NAME VLLM_PLUGINS EXPECTED_POOL KVPOOL_PLUGIN TB; the caller's KVPOOL_RECORD_PASSED/KVPOOL_ONLY
    (cd "$tests" && KVPOOL_RECORD_PASSED="${KVPOOL_RECORD_PASSED:-}" KVPOOL_ONLY="${KVPOOL_ONLY:-}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 \
        HF_HUB_CACHE="$work/hf" HF_HOME="$work/hf-home" VLLM_TARGET_DEVICE=cpu \
        VLLM_PLUGINS="$2" KVPOOL_EXPECT_POOL="$3" KVPOOL_PLUGIN="$4" KVPOOL_SHADOW_CHECK=inline \
        KVPOOL_SHADOW_DIR="$out/shadow" PYTHONPATH="$root/scripts/vllm_own_tests" \
        "$py" -m pytest -p kvpool_vllm_loader -p no:cacheprovider -p no:warnings \
        --noconftest -q --tb="$5" tests/v1/core \
        --ignore=tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py \
        --deselect tests/v1/core/test_kv_cache_utils.py::test_is_kv_cache_spec_uniform \
        --junitxml="$out/$1.xml" >"$out/$1.log" 2>&1) || true
    tail -n 1 "$out/$1.log" | sed "s/^/    $1: /"
}
# One after the other: run side by side on 2 cores they took longer (5 min against 3.5).
# vLLM's pool runs under the shadow (KVPOOL_PLUGIN=shadow: every pool vLLM builds is compared
# with the model call by call; the engine's behaviour does not change), so that run is also the
# vLLM-pool baseline. The shadow checks on the tests' thread (KVPOOL_SHADOW_CHECK=inline), so that
# each call's footprint is compared on the live pool: a test that writes a block's ref_cnt shows at
# its next call holding the block (a checker process sees the pool only at whole-pool checks, every
# num_blocks calls, which a test of a few calls rarely reaches); KVPOOL_VLLM_PLAIN=1 adds a run without the shadow and checks that every
# test's outcome is the same. KVPOOL_SHADOW_KEEP=1 keeps every pool's trace (make_corpus.py).
echo "==> vLLM $version tests/v1/core with each pool (logs in $out)"
rm -rf "$out/shadow"
KVPOOL_RECORD_PASSED="$out/vllm-passed.txt" run vllm "kvpool" "kvpool.oracle.shadow.ShadowedBlockPool" shadow line
plain=()
if [ "${KVPOOL_VLLM_PLAIN:-0}" = 1 ]; then
    run plain "none" "vllm.v1.core.block_pool.BlockPool" replace line
    plain=("$out/plain.xml")
fi
# kvpool's pool runs the tests that passed with vLLM's (the comparison's only subject).
KVPOOL_ONLY="$out/vllm-passed.txt" run kvpool "kvpool" "kvpool.impl.pool.BlockPool" replace short
status=0
"$py" scripts/vllm_own_tests/compare.py "$out/vllm.xml" "$out/kvpool.xml" oracle/REFERENCE_DIFFERENCES.md \
    || status=1
"$py" scripts/vllm_own_tests/shadow_report.py "$out/vllm.xml" "$out/shadow" docs/vllm.md "${plain[@]}" \
    || status=1
exit "$status"
