#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install, check, test.
#
# 1. .venv with chatbridge and its dev tools; the real peers under .peers/.
# 2. PostgreSQL on 127.0.0.1:5432 (started if it is installed but stopped).
# 3. ruff, ruff format, mypy strict.
# 4. pytest, two suites at once: everything but Slack on TEST_WORKERS xdist
#    workers (default 2; each worker is a session of its own, with its own
#    temp directory, databases and Synapse), and alongside it the Slack suite
#    inside a private network namespace, because the local-slack emulator
#    binds every interface. The Slack suite's output is kept in a log and
#    shown after the main one's.
# In CI (CI set) a skipped test fails the run: CI must have every peer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install-peers.sh

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
export CHATBRIDGE_TEST_POSTGRES_URL=${CHATBRIDGE_TEST_POSTGRES_URL:-postgresql+asyncpg://root@127.0.0.1:5432/postgres}

bash scripts/check.sh

results=.test-results
rm -rf "$results" && mkdir -p "$results"
status=0
slack_pid=
if [ "$(id -u)" = 0 ]; then
    unshare -n bash -c 'ip link set lo up && exec "$0" -m pytest tests/transports/slack -m slack --junitxml="$1"' \
        .venv/bin/python "$results/slack.xml" >"$results/slack.log" 2>&1 &
    slack_pid=$!
    # Stopped with the main suite if this script ends early (Ctrl-C, an error).
    trap 'kill "$slack_pid" 2>/dev/null || true' EXIT
else
    echo "not root: cannot make a private network namespace for the Slack suite" >&2
    [ -z "${CI:-}" ] || status=1
fi
.venv/bin/python -m pytest -m "not slack" -n "${TEST_WORKERS:-2}" --junitxml="$results/main.xml" "$@" || status=$?
if [ -n "$slack_pid" ]; then
    wait "$slack_pid" || status=$?
    echo "--- Slack suite (private network namespace) ---"
    cat "$results/slack.log"
fi
.venv/bin/python scripts/summarize.py "$results"/*.xml || status=$?
exit "$status"
