#!/usr/bin/env bash
# Static checks, the same for people and CI: ruff, ruff format, mypy strict,
# and the import layers (import-linter, contracts in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
