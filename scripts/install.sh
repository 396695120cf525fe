#!/usr/bin/env bash
# Create .venv with chatbridge and its development tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check uv
fi
[ -x .venv/bin/python ] || uv venv --quiet --python "$PY" .venv
# Compiled bytecode: without it every start of chatbridge compiles its imports.
uv pip install --quiet --compile-bytecode -p .venv/bin/python -e '.[dev]'
# The claude-agent-sdk wheel (a dev dependency) carries the claude CLI: link it
# into .venv/bin so `make run` finds a claude without a separate install.
bundled=$(.venv/bin/python -c 'import claude_agent_sdk, pathlib; print(pathlib.Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")')
if [ -x "$bundled" ] && [ ! -e .venv/bin/claude ]; then
    ln -s "$bundled" .venv/bin/claude
fi
