# Sourced by typecheck.sh and lint-imports.sh: the package as it installs (kvpool.model,
# kvpool.impl, ...), staged with symlinks in a temporary folder ($stage, the working directory
# after this), since the folders map into `kvpool` only when installed.  $root is the checkout.
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/kvpool"
for f in "$root"/kvpool/*; do ln -s "$f" "$stage/kvpool/$(basename "$f")"; done
for pkg in model impl proofs oracle bugs; do ln -s "$root/$pkg" "$stage/kvpool/$pkg"; done
cd "$stage"
