#!/usr/bin/env bash
# Install vLLM's block pool (for conformance tests and benchmarks) into a
# dedicated virtual environment on a CPU-only machine.
#
#   bash scripts/install-vllm.sh [VENV_DIR] [VLLM_VERSION]
#
# Defaults: VENV_DIR="$PWD/.venv-vllm", VLLM_VERSION=0.31.0 (0.33.0 also works).
#
# What it installs, all pinned:
#   1. torch 2.13.0, CPU build, from the wheel that lies on disk
#      (TORCH_WHEEL_DIR, default /opt/wheels), with its own dependencies pinned.
#      PyPI's torch 2.13.0 is a multi-GB CUDA build, so a missing local wheel
#      is an error, not a fallback.
#   2. vllm==VLLM_VERSION with --no-deps (its full dependency closure does not
#      install on a CPU-only machine and is not needed).
#   3. The pure-Python packages that vLLM's block-pool import chain needs,
#      each with --no-deps. Every one of them was checked to be necessary:
#      removing any single one breaks the import chain.
# Then it imports the block pool and friends and fails if anything is missing.
#
# Idempotent: re-running on an existing venv installs nothing that is already
# at the pinned version. Any failure stops the script with a non-zero exit.
#
# Environment overrides: PYTHON (default python3, must be CPython 3.11),
# TORCH_WHEEL_DIR (default /opt/wheels).

set -euo pipefail

die() {
    echo "install-vllm.sh: ERROR: $*" >&2
    exit 1
}
trap 'echo "install-vllm.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

VENV_DIR="${1:-$PWD/.venv-vllm}"
VLLM_VERSION="${2:-0.31.0}"
PYTHON="${PYTHON:-python3}"
TORCH_WHEEL_DIR="${TORCH_WHEEL_DIR:-/opt/wheels}"
TORCH_VERSION="2.13.0+cpu"

[[ $# -le 2 ]] || die "usage: bash scripts/install-vllm.sh [VENV_DIR] [VLLM_VERSION]"
[[ "$VLLM_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$ ]] \
    || die "VLLM_VERSION '$VLLM_VERSION' does not look like a version"

# torch pinned together with its own dependencies, so the resolver has no choice.
TORCH_PINS=(
    "torch==${TORCH_VERSION}"
    filelock==4.3.1
    fsspec==2026.9.0
    Jinja2==3.1.6
    MarkupSafe==3.0.4
    mpmath==1.3.0
    networkx==3.6.1
    setuptools==84.2.1
    sympy==1.14.0
    typing_extensions==4.16.0
)

# Needed by `from vllm.v1.core.block_pool import BlockPool` and the related
# imports checked below (vllm 0.31.0 and 0.33.0 need the same set).
# Installed with --no-deps: this list is closed under what the import needs.
VLLM_RUNTIME_PINS=(
    # vllm core / config / utils
    numpy==2.4.6
    packaging==26.4
    regex==2026.11.19
    psutil==7.2.2
    pyzmq==27.3.0
    msgspec==0.23.0
    cbor2==6.3.0
    cloudpickle==3.1.3
    py-cpuinfo==9.0.0
    prometheus_client==0.26.0
    uvloop==0.23.0
    pybase64==1.5.1
    cachetools==8.0.2
    pillow==13.0.0
    # pydantic (vllm.config)
    pydantic==2.14.4
    pydantic_core==2.50.5
    typing-inspection==0.4.5
    annotated-types==0.8.0
    # transformers (imported by vllm.config) and what it checks at import time
    transformers==5.20.2
    huggingface_hub==2.4.0
    tokenizers==0.23.3
    safetensors==0.8.0
    pyyaml==6.0.4
    tqdm==4.70.1
    httpx2==2.16.2
    httpcore2==2.16.2
    h11==0.16.0
    truststore==0.10.5
    idna==3.20
    # vllm.connections
    aiohttp==3.14.5
    multidict==7.2.1
    attrs==26.1.0
    yarl==1.25.1
    propcache==0.5.4
    aiohappyeyeballs==2.7.1
    aiosignal==1.4.0
    frozenlist==1.8.0
    requests==2.34.2
    urllib3==2.8.0
    certifi==2026.10.19.post1
    # openai / structured-output modules reached through vllm.sampling_params
    openai==3.57.0
    openai-harmony==0.0.8
    sniffio==1.3.1
    anyio==4.16.0
    xgrammar==0.2.8
    apache-tvm-ffi==0.1.11
    llguidance==1.7.6
    partial-json-parser==0.2.1.1.post7
    fastapi==0.136.3
    starlette==1.10.0
    annotated-doc==0.0.7
    # the model registry's inspection of LlamaForCausalLM (kvpool replay --engine vllm), run in a
    # subprocess whenever ~/.cache/vllm holds no answer for it: on a fresh machine, every time
    einops==0.8.2
)

# --- 1. the virtual environment ------------------------------------------------
command -v "$PYTHON" >/dev/null || die "'$PYTHON' not found"
py_ver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$py_ver" == "3.11" ]] || die "$PYTHON is Python $py_ver; the on-disk torch wheel is for CPython 3.11"

VPY="$VENV_DIR/bin/python"
if [[ -x "$VPY" ]]; then
    venv_ver="$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
        || die "existing venv $VENV_DIR has a broken interpreter; remove it and re-run"
    [[ "$venv_ver" == "3.11" ]] || die "existing venv $VENV_DIR is Python $venv_ver, need 3.11"
    echo "==> using existing venv $VENV_DIR"
else
    [[ ! -e "$VENV_DIR" ]] || [[ -z "$(ls -A "$VENV_DIR")" ]] \
        || die "$VENV_DIR exists but is not a venv; refusing to touch it"
    echo "==> creating venv $VENV_DIR"
    "$PYTHON" -m venv "$VENV_DIR"
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
PIP=("$VPY" -m pip install --no-input --quiet)

# --- 2. torch, CPU build, from disk ----------------------------------------------
shopt -s nullglob
wheels=("$TORCH_WHEEL_DIR"/torch-2.13.0+cpu-cp311-*.whl)
shopt -u nullglob
installed_torch="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [[ "$installed_torch" == "$TORCH_VERSION" ]]; then
    echo "==> torch $TORCH_VERSION already installed"
    "${PIP[@]}" "${TORCH_PINS[@]:1}"
else
    [[ ${#wheels[@]} -gt 0 ]] \
        || die "no torch 2.13.0 CPU wheel in $TORCH_WHEEL_DIR (set TORCH_WHEEL_DIR); refusing to download a CUDA build"
    [[ -z "$installed_torch" ]] || echo "==> replacing torch $installed_torch with $TORCH_VERSION"
    echo "==> installing torch $TORCH_VERSION from ${wheels[0]}"
    "${PIP[@]}" --find-links "$TORCH_WHEEL_DIR" "${TORCH_PINS[@]}"
fi
got="$("$VPY" -W ignore -c 'import torch; print(torch.__version__)')"
[[ "$got" == "$TORCH_VERSION" ]] || die "torch is $got after install, expected $TORCH_VERSION"

# --- 3. vllm without its dependency closure -------------------------------------
echo "==> installing vllm==$VLLM_VERSION (--no-deps)"
"${PIP[@]}" --no-deps "vllm==$VLLM_VERSION"

# --- 4. what the block-pool import chain needs ----------------------------------
echo "==> installing ${#VLLM_RUNTIME_PINS[@]} pinned runtime packages (--no-deps)"
"${PIP[@]}" --no-deps "${VLLM_RUNTIME_PINS[@]}"

# --- 5. check -------------------------------------------------------------------
echo "==> checking imports"
"$VPY" -W ignore - "$VLLM_VERSION" <<'EOF'
import sys
import time

t0 = time.perf_counter()
from vllm.v1.core.block_pool import BlockPool  # noqa: F401
t1 = time.perf_counter()
from vllm.v1.core.kv_cache_utils import (  # noqa: F401
    BlockHash,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: F401
from vllm.v1.request import Request  # noqa: F401
from vllm.sampling_params import SamplingParams  # noqa: F401
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector  # noqa: F401
from vllm.utils.hashing import get_hash_fn_by_name, sha256, sha256_cbor  # noqa: F401
from vllm.multimodal.utils import get_mm_features_in_window  # noqa: F401
import vllm
import torch

if vllm.__version__ != sys.argv[1]:
    sys.exit(f"vllm.__version__ is {vllm.__version__}, expected {sys.argv[1]}")
print(
    f"OK: vllm {vllm.__version__}, torch {torch.__version__}; "
    f"BlockPool import {t1 - t0:.1f}s, all imports {time.perf_counter() - t0:.1f}s"
)
EOF
echo "==> done: $VENV_DIR"
