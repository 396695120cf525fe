# chatbridge with the Claude Code CLI, as a non-root user.
FROM python:3.12-slim

# git and procps: what claude's tools commonly need in a working directory.
# tini: PID 1 that reaps orphans re-parented to it (chatbridge is not an init).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates procps tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 chatbridge

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bridge bridge
COPY dispatcher dispatcher
COPY runner runner
COPY transports transports
COPY migrations migrations

# The claude-agent-sdk wheel ships the native claude CLI; link it onto PATH.
RUN pip install --no-cache-dir . claude-agent-sdk \
    && ln -s "$(python -c 'import claude_agent_sdk, pathlib; print(pathlib.Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")')" /usr/local/bin/claude \
    && claude --version \
    && mkdir -p /srv/work /var/lib/chatbridge \
    && chown chatbridge:chatbridge /srv/work /var/lib/chatbridge

USER chatbridge
ENV CHATBRIDGE_CONFIG=/etc/chatbridge/chatbridge.toml \
    CHATBRIDGE_HTTP__LISTEN=0.0.0.0:8080 \
    CHATBRIDGE_CONSOLE__ENABLED=false \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/chatbridge
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
# tini as PID 1 forwards SIGTERM to chatbridge and reaps any orphan; each run's
# supervisor reaps its own tree.
ENTRYPOINT ["tini", "--", "chatbridge"]
CMD ["run"]
