"""The command line and environment of one run. Pure: no I/O.

The prompt never appears in argv (it goes to stdin), so chat text stays out
of process listings and no quoting question arises. ``--allowedTools`` and
``--disallowedTools`` are variadic and would swallow a following positional
argument, so argv always ends with ``--``.
"""

from __future__ import annotations

from collections.abc import Mapping

from runner.errors import InvalidRequest
from runner.request import RunRequest

MARKER_ENV = "CHATBRIDGE_RUN_MARKER"
"""Environment variable carrying the run id; every descendant inherits it."""

NESTED_SESSION_ENV = "CLAUDECODE"
OWN_SETTINGS_PREFIX = "CHATBRIDGE_"
"""The bridge's own settings (and secrets) in the environment; claude never gets them."""
"""Set inside Claude Code sessions; claude refuses to start nested when it sees it."""


def build_argv(request: RunRequest) -> list[str]:
    """argv for ``request``: ``claude -p --output-format stream-json --verbose ... --``.

    Raises :class:`InvalidRequest` for a tool rule that starts with ``-``
    (it would be parsed as an option) or a negative ``max_turns``.
    """
    argv = [request.claude_bin, "-p", "--output-format", "stream-json", "--verbose"]
    if request.session_id:
        # The "=" form: a session id can never be mistaken for another argument.
        argv.append(f"--resume={request.session_id}")
    if request.model:
        argv += ["--model", request.model]
    if request.permission_mode:
        argv += ["--permission-mode", request.permission_mode]
    for flag, rules in (
        ("--allowedTools", request.allowed_tools),
        ("--disallowedTools", request.disallowed_tools),
    ):
        if not rules:
            continue
        for rule in rules:
            if not rule or rule.startswith("-"):
                raise InvalidRequest(f"{flag}: invalid tool rule {rule!r}")
        argv += [flag, *rules]
    if request.append_system_prompt:
        argv += ["--append-system-prompt", request.append_system_prompt]
    if request.max_turns < 0:
        raise InvalidRequest(f"max_turns must be >= 0, not {request.max_turns}")
    if request.max_turns:
        argv += ["--max-turns", str(request.max_turns)]
    argv += request.extra_args
    argv.append("--")
    return argv


def build_env(request: RunRequest, base_env: Mapping[str, str]) -> dict[str, str]:
    """``base_env`` without ``CLAUDECODE`` and chatbridge's own settings, plus
    ``request.env``, plus the run marker.

    ``CHATBRIDGE_*`` variables configure the bridge and carry its secrets
    (chat tokens, the database password): a tool claude runs, perhaps on a
    prompt injected through chat, must not be able to post as the bot or
    reach its database. The marker is set last so no extra environment can
    hide a run's processes. Raises :class:`InvalidRequest` for an empty run id
    (it could mark nothing).
    """
    if not request.run_id:
        raise InvalidRequest("empty run id")
    env = {
        k: v
        for k, v in base_env.items()
        if k != NESTED_SESSION_ENV and not k.startswith(OWN_SETTINGS_PREFIX)
    }
    env.update(request.env)
    env.pop(NESTED_SESSION_ENV, None)
    env[MARKER_ENV] = request.run_id
    return env
