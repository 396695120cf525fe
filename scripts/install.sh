#!/usr/bin/env bash
# Create .venv with chatbridge and its development tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check uv
fi
[ -x .venv/bin/python ] || uv venv --quiet --python "$PY" .venv
uv pip install --quiet -p .venv/bin/python -e '.[dev]'
