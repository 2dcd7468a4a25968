#!/usr/bin/env bash
# import-linter's contracts ([tool.importlinter] in pyproject.toml) over the package as it
# installs (kvpool.model, kvpool.impl, ...).
set -euo pipefail
. "$(dirname "$0")/installed-layout.sh"
PYTHONPATH="$stage" lint-imports "$root/pyproject.toml" --no-cache "$@"
