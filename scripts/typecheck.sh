#!/usr/bin/env bash
# mypy --strict over the package as it installs (kvpool.model, kvpool.impl, ...).
# The folders map into `kvpool` only when installed, so stage that layout with symlinks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/kvpool"
for f in "$root"/kvpool/*; do ln -s "$f" "$stage/kvpool/$(basename "$f")"; done
for pkg in model impl proofs oracle bugs; do ln -s "$root/$pkg" "$stage/kvpool/$pkg"; done
cd "$stage"
python -m mypy --strict --config-file "$root/pyproject.toml" -p kvpool "$@"
