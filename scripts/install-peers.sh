#!/usr/bin/env bash
# Install the real peers the tests talk to, under .peers/ (idempotent):
#   Synapse (Matrix homeserver) in its own virtualenv, and the local-slack emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SYNAPSE_VERSION=1.163.2
LOCAL_SLACK_VERSION=0.1.8
if ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check uv
fi
if ! .peers/synapse/bin/python -c "import synapse" 2>/dev/null; then
    uv venv --quiet --python "$PY" .peers/synapse
    uv pip install --quiet -p .peers/synapse/bin/python "matrix-synapse==$SYNAPSE_VERSION"
fi
if [ ! -x .peers/local-slack/node_modules/local-slack-linux-x64/bin/local-slack ]; then
    mkdir -p .peers/local-slack
    npm install --silent --no-audit --no-fund --no-save --prefix .peers/local-slack \
        "local-slack-linux-x64@$LOCAL_SLACK_VERSION"
fi
# HAProxy (Debian's package) in front of the replicas in tests/transports/slack/test_cluster.py.
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null \
            || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }
    else
        echo "haproxy missing: apt-get install -y haproxy (as root)" >&2
    fi
fi
# Debian's Chromium for the web console's browser tests (tests/web), driven by Playwright
# with executable_path: Playwright's own browser download cannot be used here.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
    else
        echo "chromium missing: apt-get install -y chromium (as root)" >&2
    fi
fi
