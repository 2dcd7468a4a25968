#!/usr/bin/env bash
# import-linter's contracts ([tool.importlinter] in pyproject.toml) over the package as it
# installs (kvpool.model, kvpool.impl, ...): the folders map into `kvpool` only when installed,
# so stage that layout with symlinks, as scripts/typecheck.sh does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/kvpool"
for f in "$root"/kvpool/*; do ln -s "$f" "$stage/kvpool/$(basename "$f")"; done
for pkg in model impl proofs oracle bugs; do
    if [ -d "$root/$pkg" ]; then ln -s "$root/$pkg" "$stage/kvpool/$pkg"; fi
done
cd "$stage"
PYTHONPATH="$stage" lint-imports "$root/pyproject.toml" --no-cache "$@"
