#!/usr/bin/env bash
# mypy --strict over the package as it installs (kvpool.model, kvpool.impl, ...).
set -euo pipefail
. "$(dirname "$0")/installed-layout.sh"
python -m mypy --strict --config-file "$root/pyproject.toml" -p kvpool "$@"
