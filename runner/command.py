"""The command line, environment and stdin lines of one run. Pure: no I/O.

The prompt never appears in argv: every run is started streaming
(``--input-format stream-json``) and the prompt is its first user message on
stdin, so chat text stays out of process listings, no quoting question
arises, and the run can take more messages and control requests
(docs/live-runs.md). ``--allowedTools`` and
``--disallowedTools`` are variadic and would swallow a following positional
argument, so argv always ends with ``--``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from runner import mcp_server
from runner.errors import InvalidRequest
from runner.request import PromptImage, RunRequest

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
    # Streaming input, with each user message echoed when claude takes it: how the
    # runner knows a message was answered (docs/live-runs.md, the end rule).
    argv += ["--input-format", "stream-json", "--replay-user-messages"]
    if request.approve_tools:
        argv += ["--permission-prompt-tool", "stdio"]
    if request.session_id:
        # The "=" form: a session id can never be mistaken for another argument.
        argv.append(f"--resume={request.session_id}")
        if request.fork_session:
            argv.append("--fork-session")
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
    if request.send_file_max_bytes is not None:
        argv += ["--mcp-config", mcp_config()]
    if request.max_turns < 0:
        raise InvalidRequest(f"max_turns must be >= 0, not {request.max_turns}")
    if request.max_turns:
        argv += ["--max-turns", str(request.max_turns)]
    if request.max_budget_usd is not None:
        if not request.max_budget_usd > 0:  # (also NaN)
            raise InvalidRequest(f"max_budget_usd must be > 0, not {request.max_budget_usd}")
        argv += ["--max-budget-usd", repr(request.max_budget_usd)]
    argv += request.extra_args
    argv.append("--")
    return argv


def mcp_config() -> str:
    """``--mcp-config`` JSON declaring our MCP server, ``chatbridge`` (``send_file``), as an
    SDK server: claude asks its host, the run's supervisor (which has the run's cwd and
    size limit: :func:`runner.supervision.supervisor_options`), with ``mcp_message``
    control requests, so no server process starts with each claude. Another MCP server
    configured by the user still applies; only the name ``chatbridge`` is ours.
    """
    server = {"type": "sdk", "name": mcp_server.SERVER_NAME}
    return json.dumps({"mcpServers": {mcp_server.SERVER_NAME: server}}, separators=(",", ":"))


def _line(obj: Mapping[str, Any]) -> bytes:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        # A lone UTF-16 surrogate (a chat's JSON may carry half an emoji, ``"\ud83d"``)
        # has no UTF-8: escaped, it is still valid JSON, which claude (Node) reads as
        # the same string. Raising here instead failed the run, or, into a prestarted
        # claude, raised out of run_claude and left that run running.
        return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def new_uuid() -> str:
    return str(uuid.uuid4())


def user_message(text: str, message_uuid: str, images: Sequence[PromptImage] = ()) -> bytes:
    """A user message line for claude's stdin; claude echoes it with the same ``uuid``.

    With ``images`` the content is a list of blocks: the text, then each image
    (base64, the Messages API's image block), so the model sees them.
    """
    content: str | list[dict[str, Any]] = text
    if images:
        content = [{"type": "text", "text": text}]
        content += [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": i.media_type, "data": i.data},
            }
            for i in images
        ]
    return _line(
        {"type": "user", "message": {"role": "user", "content": content}, "uuid": message_uuid}
    )


def control_request(request_id: str, subtype: str, **fields: object) -> bytes:
    """A control request line (``initialize``, ``interrupt``, ``set_model``...)."""
    request = {"subtype": subtype, **fields}
    return _line({"type": "control_request", "request_id": request_id, "request": request})


def control_response(request_id: str, response: Mapping[str, Any]) -> bytes:
    """The success answer to claude's control request ``request_id`` (``can_use_tool``)."""
    return _line(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": request_id, "response": response},
        }
    )


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
