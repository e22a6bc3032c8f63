#!/usr/bin/env bash
# mypy over agents/, producers/ and ldpstream/ as the package ldpstream.* (pyproject.toml maps
# ldpstream.agents to agents/, ...): a throw-away tree of symlinks in that shape is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
mkdir "$view/ldpstream"
for entry in ldpstream/*; do ln -s "$root/$entry" "$view/ldpstream/"; done
for dir in agents producers estimators bench; do ln -s "$root/$dir" "$view/ldpstream/$dir"; done
cd "$view"
exec "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" \
  --python-executable "$root/.venv/bin/python" --exclude 'ldpstream/(estimators|bench)/' -p ldpstream
