#!/usr/bin/env python3
"""A fake ``claude`` CLI for tests: print mode with stream-json, both ways, no network.

Faithful to /work/shared/claude-cli.md where the runner can tell: same flags,
same stream-json lines, same exit codes and stderr messages, prompt from
stdin and/or argv, ``--resume`` of an unknown session failing like the real
one. Standard library only.

Usage from a test::

    from tests.fakes.fake_claude import FAKE_CLAUDE, install
    claude = install(tmp_path)      # tmp_path/claude: runs this script with this
                                    # interpreter (skips a slow pyenv shim);
                                    # str(FAKE_CLAUDE) works too
    RunRequest(run_id=..., claude_bin=str(claude), cwd=tmp_path,
               prompt="hi", session_id=None,
               env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_RECORD": str(tmp_path / "rec.json")})

By default one run prints: ``system/init``, an assistant text, a ``Bash``
tool_use (``echo hello``; nothing is executed), its tool_result, the final
assistant text and a ``success`` result whose text is ``FAKE_CLAUDE_RESULT``
(default ``Done.``), then exits 0. The session id is a new uuid, or the
resumed one.

Behaviour switches (environment variables; unset or empty means off):

``FAKE_CLAUDE_ECHO=1``
    The result text is exactly the prompt claude received.
``FAKE_CLAUDE_RESULT=TEXT``
    The result text (when not echoing).
``FAKE_CLAUDE_CUT_EMOJI=1``
    The result text ends in half an emoji: a lone UTF-16 surrogate, which
    JSON carries as ``"\ud83d"`` (the real CLI emits that when Node's
    ``JSON.stringify`` gets a string cut inside an emoji).
``FAKE_CLAUDE_DEAF_TO=SUBTYPE,...``
    Never answer control requests of these subtypes (``set_model``...): a claude
    that is hung, stopped or swapping, as the host sees it.
``FAKE_CLAUDE_RECORD=PATH``
    Write ``{"argv", "cwd", "env", "prompt", "pid", "children", "escaped"}`` as JSON to
    PATH (written before any output, after children are started).
``FAKE_CLAUDE_SESSIONS_DIR=DIR``
    (``--fork-session`` with ``--resume`` continues a copy under a new id.)
    Keep sessions as files under DIR, per cwd like the real CLI (a resume from
    another cwd finds nothing). Then ``--resume`` of an unknown id prints a
    zeroed ``error_during_execution`` result, ``No conversation found with
    session ID: <id>`` on stderr and exits 1. Without it any resume succeeds.
    The result of a resumed run reports ``num_turns`` = prompts in the session.
``FAKE_CLAUDE_TOOL_COMMAND=CMD``
    The command shown in the tool_use (default ``echo hello``);
    ``FAKE_CLAUDE_NO_TOOL=1`` skips the tool_use/tool_result pair.
``FAKE_CLAUDE_TOOL_FIELDS=JSON``
    More fields of that Bash input (``{"run_in_background": true}``).
``FAKE_CLAUDE_SLEEP=SECONDS``
    Print nothing for this long after the tool_result, before the result
    (for stop, stall and timeout tests).
``FAKE_CLAUDE_SLEEP_BEFORE_INIT=SECONDS``
    Print nothing at all for this long first.
``FAKE_CLAUDE_HUGE=N``
    Print an assistant text line whose text is N bytes of ``x``.
``FAKE_CLAUDE_GARBAGE=1``
    Print a line that is not JSON (then carry on).
``FAKE_CLAUDE_UNKNOWN=1``
    Print lines of types and subtypes the runner does not know.
``FAKE_CLAUDE_IGNORE_TERM=1``
    Ignore SIGTERM (only SIGKILL stops it). By default SIGTERM exits with 143
    and no result line, as the real one does; children are left running.
``FAKE_CLAUDE_IGNORE_INT=1``
    Ignore SIGINT (the supervisor's interrupt at a time limit): a claude that does
    not end its turn when asked.
``FAKE_CLAUDE_GRANDCHILD=1``
    Start ``sh -c 'sleep 300 & wait'`` in its own session (setsid) with stdio
    on /dev/null, like the real Bash tool: a grandchild outside claude's
    process group.
``FAKE_CLAUDE_BACKGROUND=1``
    Start a ``sleep 300`` child in claude's own group that inherits stdout and
    stderr (holding the pipes open after claude exits), like ``cmd &``.
``FAKE_CLAUDE_WRITE_AFTER_EXIT=N``
    Start a child in claude's group that ignores SIGTERM, inherits stdout and,
    once claude exited, writes N bytes of ``y`` to it and sleeps (a background
    tool that keeps printing after the result).
``FAKE_CLAUDE_ESCAPE=DIR``
    Start three tool processes that no environment marker finds, each running
    ``sleep 300`` and writing its pid to a file in DIR before the first line
    is printed: ``env-i.pid``, put in the background by a shell in its own
    session with ``env -i`` (the shell exits at once, like ``env -i cmd &`` in
    a Bash tool command); ``double-fork.pid``, a process that forks, calls
    setsid, forks again with an empty environment and lets the middle one
    exit (a daemon); ``background.pid``, a child of claude itself in its group,
    started with ``env -i`` and never waited for (outlives claude's exit).
    Their pids are listed as ``escaped`` in the record file.
``FAKE_CLAUDE_EXIT=N``
    Print ``fake claude failure`` on stderr and exit N after the tool events,
    with no result line.
``FAKE_CLAUDE_IS_ERROR=1``
    The result is ``error_during_execution`` with ``is_error`` true; exit 1.
``FAKE_CLAUDE_WAIT_FOR=PATH``
    Print nothing after the tool events until PATH exists (a trigger shared
    by several runs: the test or benchmark creates the file).
``FAKE_CLAUDE_THEN_TOOL=CMD``
    Once ``FAKE_CLAUDE_WAIT_FOR`` is there, run a second Bash tool showing CMD,
    then wait again until ``FAKE_CLAUDE_WAIT_FOR`` + ``.2`` exists (progress
    after a restart, step by step).
``FAKE_CLAUDE_THEN_SEND_FILE=JSON``
    Once ``FAKE_CLAUDE_WAIT_FOR`` is there, call ``send_file`` with this input (as
    ``FAKE_CLAUDE_SEND_FILE``): a tool used while the bridge may be away.
``FAKE_CLAUDE_TIMES=PATH``
    Append one JSON line to PATH at exit: ``{"prompt", "start", "result", "exit"}``,
    the ``time.monotonic()`` (system-wide on Linux) once this script's imports
    are done, just after the result line was flushed and just before exiting.
``FAKE_CLAUDE_READ_LOG=PATH``
    Append ``{"text"}`` to PATH for each user message read from stdin (before the
    turn takes it): a test waits on it for claude to have a message it sent.
``FAKE_CLAUDE_RUN_LOG=PATH``
    Append JSON lines to PATH, one ``write`` each (whole lines even with many
    processes appending), each with ``pid`` and ``t`` (``time.time()``):
    ``{"event": "start", "cwd", "overlap", "tag", "run"}`` when the process
    starts (``tag``: ``FAKE_CLAUDE_RUN_TAG``; ``run``: the runner's
    ``CHATBRIDGE_RUN_MARKER``), ``{"event": "prompt", "text"}`` for each user
    message it takes (the prompt in print mode) and ``{"event": "end",
    "how"}`` when it exits (``how``: ``exit``, ``sigterm`` or ``sigint``; a
    SIGKILL leaves no end line). While alive the process holds an exclusive
    ``flock`` on ``PATH.locks/<cwd>/<pid>`` (released by the kernel however it
    dies): ``overlap`` is true when another run of the same working directory
    still held its own at this one's start, so the test learns of two
    concurrent runs of one conversation without trusting the end lines.
``FAKE_CLAUDE_LINGER=SECONDS``
    Stay alive this long after printing the result line.
``FAKE_CLAUDE_STDERR=TEXT``
    Write TEXT to stderr at start.
``FAKE_CLAUDE_COST=USD``
    What each turn costs (default 0.0123). As the real one's, a result's
    ``total_cost_usd`` is the process's sum so far (a second turn's says 0.0246),
    and a turn whose sum reaches ``--max-budget-usd`` ends as the real one does at
    its budget: an ``error_max_budget_usd`` result with the cost and
    ``Reached maximum budget ($X)`` in ``errors``; exit 1.
``FAKE_CLAUDE_USAGE_LIMIT=SECONDS``
    (Streaming input.) Each turn hits a subscription's usage limit that resets
    SECONDS from now, as claude 2.1.332 reports it (observed against a model
    server answering 429 with the ``anthropic-ratelimit-unified-*`` headers,
    logged in with an OAuth token): a ``rate_limit_event`` with
    ``status: "rejected"``, ``resetsAt`` (whole epoch seconds) and
    ``rateLimitType``; a synthetic assistant text ``You've hit your 5-hour
    limit · resets 5:56pm (UTC)`` with ``error: "rate_limit"``; a result of
    subtype ``success`` with ``is_error`` true, ``terminal_reason:
    "api_error"``, cost 0 and that text; exit 1. With an API key instead, the
    real CLI prints no ``rate_limit_event`` and no reset time for a 429.
``FAKE_CLAUDE_USAGE_LIMIT_ONCE=PATH``
    Only the first turn (the one that creates PATH) hits the limit.

Children started by the switches above are listed in the record file.
SIGINT prints an interrupted ``error_during_execution`` result and exits 0.

Two-way protocol (``--input-format stream-json``), as docs/live-runs.md
describes the real CLI: nothing is printed before the first stdin line.
Control requests are answered at once, even mid-turn: ``initialize``,
``interrupt`` (``{"still_queued": []}``), ``set_model`` (``{"model"}``; none
given: back to the default) and ``set_permission_mode`` (``{"mode"}`` and a
``system/status`` line; an unknown mode is an error); any other subtype gets
``Unsupported control request subtype: X``. Each user message (given a uuid
if it has none) prints ``command_lifecycle`` ``queued`` when read,
``started`` when taken and ``completed`` after its turn's result; with
``--replay-user-messages`` it is echoed (same uuid, ``isReplay``) when taken.
A message read while idle starts a turn: ``init`` (current model and mode),
then the print-mode steps above, ending in a result with
``terminal_reason: "completed"``. A message read during a turn is taken
after the turn's next tool_result and folded into it (one result). With
``--permission-prompt-tool stdio`` each tool use asks the host
(``can_use_tool``) unless the mode is ``bypassPermissions`` or
``--allowedTools`` names the tool; ``allow`` runs it with ``updatedInput``,
``deny`` makes an ``is_error`` tool_result of the message (listed in
``permission_denials``) and the turn goes on; stdin closing while it asks
refuses the tool the same way. Control responses are echoed when replaying.
``interrupt`` during a turn withdraws a pending question
(``control_cancel_request``), abandons the tool (a rejected tool_result and
``[Request interrupted by user for tool use]``) and ends the turn with an
``error_during_execution`` result, ``terminal_reason`` ``aborted_tools``
(``aborted_streaming`` during ``FAKE_CLAUDE_SLEEP`` / ``WAIT_FOR``, the model's
time); a message that came meanwhile waits for the next turn. At stdin's EOF,
once no turn runs, it exits 1 if the last result was an error, else 0
(after ``FAKE_CLAUDE_LINGER``). ``FAKE_CLAUDE_EXIT`` exits at the first
turn's end; ``FAKE_CLAUDE_RECORD`` is written when the first message
arrives (``prompt`` is its text); ``FAKE_CLAUDE_ECHO`` answers the turn's
messages joined by newlines. The extra knobs:

``FAKE_CLAUDE_TOOL_SECONDS=SECONDS``
    The simulated tool runs this long (an interrupt cuts it short).
``FAKE_CLAUDE_TOOL_WAIT_FOR=PATH``
    The simulated tool runs until PATH exists (a gate the test opens).
``FAKE_CLAUDE_TOOL_UNTIL_MESSAGE=1``
    The simulated tool runs until a user message arrives (which the turn then
    takes: a message sent during a tool, with no race against a gate).
``FAKE_CLAUDE_TOOL_OUTPUT=TEXT``
    The tool_result's content (default ``hello``); nothing is executed.
``FAKE_CLAUDE_TOOL_LOG=PATH``
    Append the input each tool use ran with (after approval) as a JSON line.
``FAKE_CLAUDE_TOOL_TURNS=N``
    Only the first N turns use the tool; later ones answer in text.
``FAKE_CLAUDE_QUESTION=JSON``
    Before the Bash tool, call ``AskUserQuestion`` with this input
    (``{"questions": [...]}``), asked of the host with ``--permission-prompt-tool
    stdio`` (``can_use_tool``, the model's input as it is); the answers of the
    allow's ``updatedInput`` become the tool_result (``Your questions have been
    answered: "Q"="A"``, or ``The user did not answer the questions`` without
    them), and the input it ran with goes to ``FAKE_CLAUDE_TOOL_LOG``.

``--mcp-config JSON`` (JSON text, variadic like the real flag): each stdio server in
``mcpServers`` is started at start-up, before stdin is read (the real CLI has them
up before it answers ``initialize`` or takes a message), sent ``initialize``,
``notifications/initialized`` and ``tools/list``; its tools join ``init``'s
``tools`` as ``mcp__<server>__<tool>`` and ``mcp_servers`` lists it
``connected``. Its stdin is closed at exit. An SDK server (``"type": "sdk"``)
has no process: the same messages go to the host as ``mcp_message`` control
requests on stdout (``server_name``, ``message``; a notification too), right
after the stdio servers, and its answers are the ``mcp_response`` of the
host's ``control_response`` lines (echoed with ``--replay-user-messages``, as
every control response is), as the real CLI does; its tool calls go the same way.

``FAKE_CLAUDE_SEND_FILE=JSON``
    After the Bash tool, call ``mcp__chatbridge__send_file`` with this input (an
    object, or a list of them, one call each), through the real MCP server:
    a tool_use, then a tool_result as the real CLI prints it for an MCP tool: on
    success the server's content blocks and no ``is_error`` key; on ``isError``
    their texts joined into a string, ``is_error`` true. Not allowed by ``--allowedTools`` (or
    bypassPermissions) it is asked for with ``--permission-prompt-tool stdio``
    (``can_use_tool`` as the real CLI asks for an MCP tool: ``mcp_server``, a
    rule for the whole tool), else refused as the real CLI refuses in print
    mode; with no such server, ``No such tool available``.

Unlike the real CLI, the fake asks for every Bash command: the real one runs
read-only commands (``echo``, ``cat``, ``sleep``) without asking.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn, Protocol

    class _Host(Protocol):
        """Who answers for an SDK MCP server: the fake's host (its stdin and stdout)."""

        def mcp_message(self, server: str, message: dict[str, Any]) -> dict[str, Any] | None: ...


# Python's own start-up is over here: what a run's breakdown calls "claude started".
# (subprocess is imported where a child is started: most runs start none, and the
# ping benchmarks count this fake's start-up as the run's.)
_STARTED = time.monotonic()

FAKE_CLAUDE = Path(__file__).resolve()
"""This script, to use as ``RunRequest.claude_bin``."""


_LAUNCH = (
    "import sys; sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rpartition('/')[0]); "
    "import fake_claude; fake_claude.main()"
)
"""Runs this file as a module (its compiled form cached, not compiled at every start)."""


def install(directory: Path, python: str = sys.executable) -> Path:
    """Write an executable ``claude`` into ``directory`` that runs this fake with ``python``.

    Faster to start than the ``env python3`` shebang (where ``python3`` is a
    shim, and the script is compiled at every start): a bare interpreter (the
    fake needs the standard library only) imports it as a module. Usable by
    name with ``directory`` on PATH. Returns its path.
    """
    launcher = directory / "claude"
    launcher.write_text(f'#!/bin/sh\nexec "{python}" -I -S -c "{_LAUNCH}" "{FAKE_CLAUDE}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


def tool_log(directory: Path) -> list[dict[str, Any]]:
    """The tool calls logged to ``directory/tools.jsonl`` (the tests' ``FAKE_CLAUDE_TOOL_LOG``),
    in the order they ran; none while the file does not exist."""
    path = directory / "tools.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _uuid4() -> str:
    """A random (version 4) UUID as text, as ``str(uuid.uuid4())``, without importing uuid."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


MODEL = "claude-fake-1"
TOOLS = ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]
_VALUE_FLAGS = {
    "--output-format",
    "--model",
    "--permission-mode",
    "--max-turns",
    "--append-system-prompt",
    "--system-prompt",
    "--fallback-model",
    "--session-id",
    "--max-budget-usd",
    "--input-format",
    "--settings",
    "--permission-prompt-tool",
}
_VARIADIC_FLAGS = {
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--mcp-config",
}
_BOOL_FLAGS = {
    "-p",
    "--print",
    "--verbose",
    "--continue",
    "-c",
    "--fork-session",
    "--include-partial-messages",
    "--dangerously-skip-permissions",
    "--replay-user-messages",
}


def _fail(message: str, code: int = 1) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def _env(name: str) -> str:
    return os.environ.get(name, "")


def _parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse like commander: variadic tool lists swallow following non-options."""
    opts: dict[str, Any] = {"allowed": [], "disallowed": [], "mcp": []}
    positional: list[str] = []
    i = 0
    variadic: str | None = None
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            positional += argv[i:]
            break
        if variadic and not arg.startswith("-"):
            opts[variadic].append(arg)
            continue
        variadic = None
        name, eq, inline = arg.partition("=")
        if name in ("--resume", "-r"):
            if eq:
                opts["resume"] = inline
            else:
                if i >= len(argv):
                    _fail(f"error: option '{name}' argument missing")
                opts["resume"] = argv[i]
                i += 1
        elif name in _VALUE_FLAGS:
            if eq:
                opts[name] = inline
            else:
                if i >= len(argv):
                    _fail(f"error: option '{name} <value>' argument missing")
                opts[name] = argv[i]
                i += 1
        elif name in _VARIADIC_FLAGS:
            key = (
                "mcp"
                if name == "--mcp-config"
                else "allowed"
                if name.startswith("--allowed")
                else "disallowed"
            )
            if eq:
                opts[key].append(inline)
            else:
                variadic = key
        elif arg in _BOOL_FLAGS:
            opts[arg] = True
        elif arg.startswith("-"):
            _fail(f"error: unknown option '{arg}'")
        else:
            positional.append(arg)
    return opts, positional


def _read_prompt(positional: list[str]) -> str:
    stdin_text = "" if sys.stdin.isatty() else sys.stdin.read()
    parts = [" ".join(positional)] if positional else []
    if stdin_text:
        parts.append(stdin_text)
    prompt = "\n".join(parts)
    if not prompt:
        _fail(
            "Error: Input must be provided either through stdin or as a prompt argument "
            "when using --print"
        )
    return prompt


def _keep(sessions: Path | None, cwd: str, session_id: str, prompt: str) -> None:
    """Add a prompt to the session's file (with FAKE_CLAUDE_SESSIONS_DIR)."""
    if sessions is None:
        return
    project = _project_dir(sessions, cwd)
    project.mkdir(parents=True, exist_ok=True)
    with (project / f"{session_id}.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": prompt}) + "\n")


def _project_dir(sessions: Path, cwd: str) -> Path:
    return sessions / cwd.replace("/", "-")


_OUT = threading.Lock()
"""Held for each line: with stream-json input, stdin's reader thread writes too."""


def _line(obj: dict[str, Any]) -> None:
    with _OUT:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def _cost() -> float:
    return float(_env("FAKE_CLAUDE_COST") or 0.0123)


def _usage_limited() -> bool:
    """Whether this turn hits the usage limit (``FAKE_CLAUDE_USAGE_LIMIT``)."""
    if not _env("FAKE_CLAUDE_USAGE_LIMIT"):
        return False
    once = _env("FAKE_CLAUDE_USAGE_LIMIT_ONCE")
    if not once:
        return True
    try:
        Path(once).touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def _usage_limit(session_id: str, end: Any) -> dict[str, Any]:
    """Print what claude 2.1.332 prints when a subscription's usage limit refuses the
    turn's model call; return the turn's result line (an error, for ``end``)."""
    resets_at = int(time.time() + float(_env("FAKE_CLAUDE_USAGE_LIMIT"))) + 1
    info = {
        "status": "rejected",
        "resetsAt": resets_at,
        "rateLimitType": "five_hour",
        "isUsingOverage": False,
    }
    windows = {"five_hour": {"utilization": 1, "resetsAt": resets_at, "status": "rejected"}}
    _line(
        {
            "type": "rate_limit_event",
            "rate_limit_info": {**info, "unifiedWindows": windows},
            "uuid": _uuid4(),
            "session_id": session_id,
        }
    )
    when = time.strftime("%-I:%M%p", time.gmtime(resets_at)).lower()
    text = f"You've hit your 5-hour limit \u00b7 resets {when} (UTC)"
    assistant = _assistant(session_id, {"type": "text", "text": text})
    assistant["message"]["model"] = "<synthetic>"
    assistant.update(
        error="rate_limit",
        is_api_error_message=True,
        api_error_status=429,
        api_error="usage_limit_reached",
        api_error_params={"rate_limit_info": info},
        api_error_type="rate_limit_error",
    )
    _line(assistant)
    # A "success" that is an error, with the text as its result, as the real one.
    # The refused call costs nothing: the process's spending so far stands.
    result: dict[str, Any] = end(
        subtype="success", is_error=True, text=text, reason="api_error", errors=[], cost=0.0
    )
    result.update(
        api_error_status=429,
        api_error_type="rate_limit_error",
        api_error="usage_limit_reached",
    )
    return result


def _result(
    session_id: str, *, subtype: str, is_error: bool, text: str, turns: int, errors: list[str]
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "type": "result",
        "subtype": subtype,
        "is_error": is_error,
        "duration_ms": 12,
        "duration_api_ms": 10,
        "num_turns": turns,
        "session_id": session_id,
        "total_cost_usd": 0.0 if turns == 0 else _cost(),
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "modelUsage": {},
        "permission_denials": [],
        "uuid": _uuid4(),
    }
    if subtype == "success":
        result["result"] = text
    else:
        result["errors"] = errors
    return result


def _mode(opts: dict[str, Any]) -> str:
    return str(opts.get("--permission-mode", "default"))


class _McpServer:
    """An MCP server over stdio, started from ``--mcp-config`` as the real CLI does."""

    def __init__(self, name: str, config: dict[str, Any], cwd: str) -> None:
        import subprocess

        self.name = name
        env = {**os.environ, **(config.get("env") or {})}
        self._process = subprocess.Popen(
            [config["command"], *config.get("args", [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
        self._next = 0
        self._ask("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        self._notify("notifications/initialized")
        self.tools = [t["name"] for t in self._ask("tools/list", {})["tools"]]

    def _notify(self, method: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self._process.stdin.flush()

    def _ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._next += 1
        request = {"jsonrpc": "2.0", "id": self._next, "method": method, "params": params}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._process.stdout.readline())
        result: dict[str, Any] = answer["result"]
        return result

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._ask("tools/call", {"name": tool, "arguments": arguments})

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()


class _SdkMcpServer:
    """An SDK MCP server (``"type": "sdk"``): no process, its host answers for it. As the
    real CLI does, each JSON-RPC message goes to the host in an ``mcp_message`` control
    request on stdout (a notification too), whose ``control_response`` carries the
    server's answer as ``mcp_response``."""

    def __init__(self, name: str, host: _Host) -> None:
        self.name = name
        self._host = host
        self._next = -1
        self.tools: list[str] = []
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}}
        if self._ask("initialize", init) is None:
            return  # the host did not answer: no tools
        self._host.mcp_message(name, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = self._ask("tools/list", {}) or {}
        self.tools = [t["name"] for t in listed.get("tools", [])]

    def _ask(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        self._next += 1
        message = {"method": method, "params": params, "jsonrpc": "2.0", "id": self._next}
        answer = self._host.mcp_message(self.name, message)
        if answer is None or "result" not in answer:
            return None
        result: dict[str, Any] = answer["result"]
        return result

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self._ask("tools/call", {"name": tool, "arguments": arguments})
        if result is None:
            return {"content": [{"type": "text", "text": "no answer"}], "isError": True}
        return result

    def close(self) -> None:
        pass


def _start_mcp(
    configs: list[str], cwd: str, host: _Host, *, sdk: bool
) -> list[_McpServer | _SdkMcpServer]:
    """The stdio servers of ``configs`` (or, with ``sdk``, the SDK servers), started."""
    servers: list[_McpServer | _SdkMcpServer] = []
    for text in configs:
        for name, config in json.loads(text).get("mcpServers", {}).items():
            if (config.get("type") == "sdk") != sdk:
                continue
            servers.append(_SdkMcpServer(name, host) if sdk else _McpServer(name, config, cwd))
    return servers


def _init(
    session_id: str,
    cwd: str,
    model: str,
    mode: str,
    mcp: list[_McpServer | _SdkMcpServer] | None = None,
) -> dict[str, Any]:
    mcp = mcp or []
    return {
        "type": "system",
        "subtype": "init",
        "cwd": cwd,
        "session_id": session_id,
        "tools": TOOLS + [f"mcp__{m.name}__{t}" for m in mcp for t in m.tools],
        "mcp_servers": [{"name": m.name, "status": "connected", "source": "dynamic"} for m in mcp],
        "model": model,
        "permissionMode": mode,
        "slash_commands": [],
        "apiKeySource": "ANTHROPIC_API_KEY",
        "claude_code_version": "0.0.0-fake",
        "output_style": "default",
        "uuid": _uuid4(),
    }


def _tool_pair(session_id: str, command: str) -> None:
    """A Bash tool_use and its tool_result, as the real CLI prints them."""
    tool_id = "toolu_" + _uuid4().replace("-", "")[:20]
    _line(
        _assistant(
            session_id,
            {
                "type": "tool_use",
                "id": tool_id,
                "name": "Bash",
                "input": {"command": command},
            },
        )
    )
    _line(
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_id,
                        "content": "hello",
                        "is_error": False,
                    }
                ],
            },
            "parent_tool_use_id": None,
            "session_id": session_id,
            "uuid": _uuid4(),
        }
    )


def _wait_for(trigger: Path) -> None:
    while not trigger.exists():
        time.sleep(0.002)


def _assistant(session_id: str, block: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [block],
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
        "parent_tool_use_id": None,
        "session_id": session_id,
        "uuid": _uuid4(),
    }


_DOUBLE_FORK = """
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
# The pid is written once the environment is cleared (after the exec), so
# whoever reads the file never sees this process still carrying the marker.
os.execve("/bin/sh", ["sh", "-c", 'echo $$ > "$0"; exec sleep 300', sys.argv[1]], {})
"""


def _start_escapes(directory: Path) -> list[int]:
    """The three escaping tool processes of FAKE_CLAUDE_ESCAPE; returns their pids."""
    import subprocess

    quiet: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
    }
    env_i = directory / "env-i.pid"
    inner = f"echo $$ > {env_i}; exec sleep 300"
    subprocess.run(
        ["sh", "-c", 'env -i sh -c "$0" &', inner], start_new_session=True, check=True, **quiet
    )
    double = directory / "double-fork.pid"
    subprocess.run([sys.executable, "-c", _DOUBLE_FORK, str(double)], check=True, **quiet)
    background = directory / "background.pid"
    subprocess.Popen(["env", "-i", "sh", "-c", f"echo $$ > {background}; exec sleep 300"], **quiet)
    files = (env_i, double, background)
    # The pid files are written by processes nobody waits for: poll (bounded).
    deadline = time.monotonic() + 30
    while not all(f.exists() and f.read_text().strip() for f in files):
        if time.monotonic() > deadline:
            _fail("escaping processes did not start")
        time.sleep(0.01)
    return [int(f.read_text()) for f in files]


_CHILDREN = ("FAKE_CLAUDE_GRANDCHILD", "FAKE_CLAUDE_BACKGROUND", "FAKE_CLAUDE_WRITE_AFTER_EXIT")


def _start_children() -> list[int]:
    pids: list[int] = []
    if not any(map(_env, _CHILDREN)):
        # Imported only when needed: subprocess (with locale and selectors) costs
        # 3-5 ms, on a prestarted claude's way from the prompt to its answer.
        return pids
    import subprocess

    if _env("FAKE_CLAUDE_GRANDCHILD"):
        shell = subprocess.Popen(
            ["sh", "-c", "sleep 300 & wait"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pids.append(shell.pid)
    if _env("FAKE_CLAUDE_BACKGROUND"):
        sleeper = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
        pids.append(sleeper.pid)
    if _env("FAKE_CLAUDE_WRITE_AFTER_EXIT"):
        # The child waits for the end of a pipe only claude holds open: claude's
        # exit; and says when it ignores SIGTERM, before claude goes on.
        exit_r, _kept_open_until_exit = os.pipe()
        ready_r, ready_w = os.pipe()
        size = _env("FAKE_CLAUDE_WRITE_AFTER_EXIT")
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITE_AFTER_EXIT, str(exit_r), str(ready_w), size],
            stdin=subprocess.DEVNULL,
            pass_fds=(exit_r, ready_w),
        )
        os.close(exit_r)
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        pids.append(writer.pid)
    return pids


_WRITE_AFTER_EXIT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.write(int(sys.argv[2]), b"!")
os.read(int(sys.argv[1]), 1)
for _ in range(int(sys.argv[3]) // 4096):
    os.write(1, b"y" * 4096)
time.sleep(300)
"""


def _record(
    cwd: str, prompt: str, children: list[int], escaped: list[int], content: object = None
) -> None:
    if not _env("FAKE_CLAUDE_RECORD"):
        return
    record = {
        "argv": sys.argv,
        "cwd": cwd,
        "env": dict(os.environ),
        "prompt": prompt,
        "content": content,  # the first user message's content as sent (blocks, images)
        "pid": os.getpid(),
        "children": children,
        "escaped": escaped,
    }
    tmp = Path(_env("FAKE_CLAUDE_RECORD") + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(_env("FAKE_CLAUDE_RECORD"))


def _times(prompt: str, printed: float) -> None:
    if _env("FAKE_CLAUDE_TIMES"):
        stamp = {"prompt": prompt, "start": _STARTED, "result": printed, "exit": time.monotonic()}
        with open(_env("FAKE_CLAUDE_TIMES"), "a") as times:
            times.write(json.dumps(stamp) + "\n")


class _RunLog:
    """``FAKE_CLAUDE_RUN_LOG``: this process's start, prompts and end, for invariant checks."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock: int | None = None
        self._ended = False

    def _write(self, entry: dict[str, Any]) -> None:
        entry = {**entry, "pid": os.getpid(), "t": time.time()}
        data = (json.dumps(entry) + "\n").encode()
        # O_APPEND and one write: concurrent runs' lines never interleave.
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def start(self, cwd: str) -> None:
        import fcntl

        # Each run holds a lock on a file of its own under its cwd's directory for as
        # long as it lives; another run's file that cannot be locked is a live run.
        locks = Path(self._path + ".locks") / (cwd.strip("/").replace("/", "_") or "_")
        locks.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(locks / str(os.getpid()), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        overlap = False
        for other in locks.iterdir():
            if other.name == str(os.getpid()):
                continue
            fd = os.open(other, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                overlap = True
            finally:
                os.close(fd)
        # Who started it: the test's tag for the replica, and the run's marker
        # (its run id, which the runner sets).
        tag, run = _env("FAKE_CLAUDE_RUN_TAG"), _env("CHATBRIDGE_RUN_MARKER")
        self._write({"event": "start", "cwd": cwd, "overlap": overlap, "tag": tag, "run": run})

    def prompt(self, text: str) -> None:
        self._write({"event": "prompt", "text": text})

    def end(self, how: str) -> None:
        if not self._ended:
            self._ended = True
            self._write({"event": "end", "how": how})


_RUN_LOG = _RunLog(_env("FAKE_CLAUDE_RUN_LOG")) if _env("FAKE_CLAUDE_RUN_LOG") else None


def _log_prompt(text: str) -> None:
    if _RUN_LOG is not None:
        _RUN_LOG.prompt(text)


def _exit_now(code: int, how: str) -> NoReturn:
    """``os._exit`` from a signal handler, after the run log's end line."""
    if _RUN_LOG is not None:
        _RUN_LOG.end(how)
    os._exit(code)


PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan")

# What the real CLI puts in the tool_result of a tool use an interrupt cut off.
_REJECTED = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it"
    " was a file edit, the new_string was NOT written to the file). STOP what you are doing and"
    " wait for the user to tell you how to proceed."
)
_STREAM_CLOSED = (
    "Tool permission request failed: AbortError: Tool permission stream closed before response"
    " received"
)


def _text_of(message: dict[str, Any]) -> str:
    """The text of a user message (content is a string or a list of blocks)."""
    content = message.get("message", {}).get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def _user_text(session_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        "parent_tool_use_id": None,
        "session_id": session_id,
        "uuid": _uuid4(),
    }


def _tool_result(
    session_id: str, tool_id: str, content: str | list[dict[str, Any]], is_error: bool
) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_id,
                    "content": content,
                    "is_error": is_error,
                }
            ],
        },
        "parent_tool_use_id": None,
        "session_id": session_id,
        "uuid": _uuid4(),
    }


class _Aborted(Exception):
    """An ``interrupt`` ended the turn; ``reason`` is its ``terminal_reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Session:
    """The two-way protocol of ``--input-format stream-json``.

    A reader thread takes stdin's lines as they come: control requests are
    answered there at once (as the real CLI does, even mid-tool), user
    messages and control responses are handed to the main thread, which runs
    the turns. Everything shared is guarded by ``self._cond``.
    """

    def __init__(
        self,
        opts: dict[str, Any],
        cwd: str,
        session_id: str,
        sessions: Path | None,
        history: list[str],
    ) -> None:
        self._cwd = cwd
        self._session_id = session_id
        self._sessions = sessions
        self._history = history
        self._replay = bool(opts.get("--replay-user-messages"))
        self._ask = opts.get("--permission-prompt-tool") == "stdio"
        self._allowed = {
            rule.strip() for arg in opts["allowed"] for rule in arg.replace(",", " ").split()
        }
        self._model = str(opts.get("--model", MODEL))
        self._budget = opts.get("--max-budget-usd")
        # What this process spent so far: as the real one's, each result's
        # total_cost_usd is the sum of the process's turns (a steered run's last
        # result carries the whole run's), and --max-budget-usd caps that sum.
        self._spent = 0.0
        skip = opts.get("--dangerously-skip-permissions")
        self._mode = "bypassPermissions" if skip else _mode(opts)
        self._cond = threading.Condition()
        self._inbox: list[dict[str, Any]] = []  # user messages read, not taken yet
        self._answers: dict[str, dict[str, Any]] = {}  # can_use_tool request id -> response
        self._asking: str | None = None  # the can_use_tool request waiting for its answer
        self._running = False
        self._interrupted = False
        self._eof = False
        self._turns = 0
        self._prompts: list[str] = []  # the messages the running turn took
        self._taken: list[str] = []  # and their uuids
        self._denials: list[dict[str, Any]] = []
        self._mcp_configs: list[str] = opts["mcp"]
        self._mcp: list[_McpServer | _SdkMcpServer] | None = None  # started at start-up (serve)

    # -- stdin (reader thread) --

    def _read(self) -> None:
        for raw in sys.stdin:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            kind = obj.get("type")
            if kind == "user":
                # The real CLI gives a message sent without a uuid one of its own.
                obj.setdefault("uuid", _uuid4())
                self._lifecycle(obj["uuid"], "queued")
                with self._cond:
                    self._inbox.append(obj)
                    self._cond.notify_all()
                if _env("FAKE_CLAUDE_READ_LOG"):
                    # Read, not yet taken: a test may act once claude has the message.
                    with open(_env("FAKE_CLAUDE_READ_LOG"), "a") as f:
                        f.write(json.dumps({"text": _text_of(obj)}) + "\n")
            elif kind == "control_request":
                self._control(obj.get("request_id", ""), obj.get("request") or {})
            elif kind == "control_response":
                if self._replay:
                    _line(obj)
                response = obj.get("response") or {}
                with self._cond:
                    self._answers[str(response.get("request_id"))] = response
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _control(self, request_id: str, request: dict[str, Any]) -> None:
        subtype = request.get("subtype")
        if subtype in _env("FAKE_CLAUDE_DEAF_TO").split(","):
            return  # a hung claude: the request is never answered
        answer: dict[str, Any] | None = None
        error = ""
        if subtype == "initialize":
            answer = {
                "commands": [],
                "output_style": "default",
                "available_output_styles": ["default"],
                "models": [{"value": MODEL, "displayName": "Fake", "description": "fake"}],
                "account": {},
            }
        elif subtype == "interrupt":
            with self._cond:
                if self._asking is not None:
                    # The real CLI withdraws its pending question first.
                    _line({"type": "control_cancel_request", "request_id": self._asking})
                if self._running:
                    self._interrupted = True
                    self._cond.notify_all()
            answer = {"still_queued": []}
        elif subtype == "set_model":
            # No model given: back to the default, as the real CLI does.
            with self._cond:
                self._model = str(request.get("model") or MODEL)
                answer = {"model": self._model}
        elif subtype == "set_permission_mode":
            mode = request.get("mode")
            if mode in PERMISSION_MODES:
                with self._cond:
                    self._mode = str(mode)
                answer = {"mode": mode}
                _line(
                    {
                        "type": "system",
                        "subtype": "status",
                        "status": None,
                        "permissionMode": mode,
                        "uuid": _uuid4(),
                        "session_id": self._session_id,
                    }
                )
            else:
                error = "Cannot set permission mode: must be one of " + ", ".join(PERMISSION_MODES)
        else:
            error = f"Unsupported control request subtype: {subtype}"
        response: dict[str, Any] = {"request_id": request_id}
        if answer is not None:
            response.update(subtype="success", response=answer)
        else:
            response.update(subtype="error", error=error)
        _line({"type": "control_response", "response": response})

    def _lifecycle(self, message_uuid: str, state: str) -> None:
        _line(
            {
                "type": "command_lifecycle",
                "command_uuid": message_uuid,
                "state": state,
                "uuid": _uuid4(),
                "session_id": self._session_id,
            }
        )

    # -- turns (main thread) --

    def serve(self) -> int:
        """Run a turn per message taken while idle; the exit code once stdin is done.

        Like the real CLI: 1 when the last result was an error (an interrupted
        turn too), else 0. Its MCP servers start first, as the real CLI's do
        (claude-cli.md: a prestarted claude has them up before its first
        message, and answers ``initialize`` only then).
        """
        stdio = _start_mcp(self._mcp_configs, self._cwd, self, sdk=False)
        # Reading only now, but before the SDK servers start: their answers come on stdin.
        threading.Thread(target=self._read, daemon=True).start()
        self._mcp = stdio + _start_mcp(self._mcp_configs, self._cwd, self, sdk=True)
        error = False
        printed = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._inbox) or self._eof)
                if not self._inbox:
                    break
                first = self._inbox.pop(0)
                self._running = True
                self._interrupted = False
            error = self._turn(first)
            printed = time.monotonic()
            with self._cond:
                self._running = False
        for server in self._mcp or []:
            server.close()
        if _env("FAKE_CLAUDE_LINGER"):
            time.sleep(float(_env("FAKE_CLAUDE_LINGER")))
        _times(self._history[0] if self._history else "", printed)
        return 1 if error else 0

    def _turn(self, first: dict[str, Any]) -> bool:
        """One turn, to its result line; True if that result is an error."""
        sid = self._session_id
        self._turns += 1
        self._prompts = []
        self._taken = []
        self._denials = []
        if self._turns == 1:
            if _env("FAKE_CLAUDE_SLEEP_BEFORE_INIT"):
                time.sleep(float(_env("FAKE_CLAUDE_SLEEP_BEFORE_INIT")))
            children = _start_children()
            escape = _env("FAKE_CLAUDE_ESCAPE")
            escaped = _start_escapes(Path(escape)) if escape else []
            content = first.get("message", {}).get("content")
            _record(self._cwd, _text_of(first), children, escaped, content)
        self._lifecycle(first["uuid"], "started")
        if self._mcp is None:
            self._mcp = [
                *_start_mcp(self._mcp_configs, self._cwd, self, sdk=False),
                *_start_mcp(self._mcp_configs, self._cwd, self, sdk=True),
            ]
        with self._cond:
            _line(_init(sid, self._cwd, self._model, self._mode, self._mcp))
        self._take(first, started=True)
        if _usage_limited():
            self._finish(_usage_limit(sid, self._end))
            return True
        try:
            self._script()
        except _Aborted as aborted:
            self._finish(
                self._end(
                    subtype="error_during_execution",
                    is_error=True,
                    text="",
                    reason=aborted.reason,
                    errors=["interrupted"],
                )
            )
            return True
        if _env("FAKE_CLAUDE_EXIT"):
            _fail("fake claude failure", int(_env("FAKE_CLAUDE_EXIT")))
        text = "\n".join(self._prompts) if _env("FAKE_CLAUDE_ECHO") else ""
        text = text or _env("FAKE_CLAUDE_RESULT") or "Done."
        if _env("FAKE_CLAUDE_CUT_EMOJI"):
            text += " \ud83d"
        is_error = bool(_env("FAKE_CLAUDE_IS_ERROR"))
        _line(_assistant(sid, {"type": "text", "text": text}))
        if self._budget is not None and self._spent + _cost() >= float(self._budget):
            # As the real one: the turn's spending is checked after its model call.
            self._finish(
                self._end(
                    subtype="error_max_budget_usd",
                    is_error=True,
                    text="",
                    reason="completed",
                    errors=[f"Reached maximum budget (${self._budget})"],
                )
            )
            return True
        self._finish(
            self._end(
                subtype="error_during_execution" if is_error else "success",
                is_error=is_error,
                text=text,
                reason="completed",
                errors=["fake error"] if is_error else [],
            )
        )
        return is_error

    def _script(self) -> None:
        """The scripted steps of a turn, as in print mode; raises _Aborted."""
        sid = self._session_id
        if _env("FAKE_CLAUDE_UNKNOWN"):
            _line({"type": "system", "subtype": "status", "status": "thinking"})
            _line({"type": "stream_event", "event": {"type": "content_block_delta"}})
            _line({"type": "rate_limit_event", "session_id": sid})
            _line(_assistant(sid, {"type": "thinking", "thinking": "hmm"}))
        _line(_assistant(sid, {"type": "text", "text": "Working on it."}))
        if _env("FAKE_CLAUDE_GARBAGE"):
            with _OUT:
                sys.stdout.write("this is not json {\n")
                sys.stdout.flush()
        if _env("FAKE_CLAUDE_HUGE"):
            _line(_assistant(sid, {"type": "text", "text": "x" * int(_env("FAKE_CLAUDE_HUGE"))}))
        if _env("FAKE_CLAUDE_QUESTION"):
            self._question(json.loads(_env("FAKE_CLAUDE_QUESTION")))
        tool_turns = _env("FAKE_CLAUDE_TOOL_TURNS")
        if not _env("FAKE_CLAUDE_NO_TOOL") and (not tool_turns or self._turns <= int(tool_turns)):
            self._tool(_env("FAKE_CLAUDE_TOOL_COMMAND") or "echo hello")
        if _env("FAKE_CLAUDE_SEND_FILE"):
            inputs = json.loads(_env("FAKE_CLAUDE_SEND_FILE"))
            for tool_input in inputs if isinstance(inputs, list) else [inputs]:
                self._send_file(tool_input)
        # The model is at work from here on: an interrupt aborts its streaming.
        self._pause("aborted_streaming", seconds=float(_env("FAKE_CLAUDE_SLEEP") or 0))
        if _env("FAKE_CLAUDE_WAIT_FOR"):
            self._pause("aborted_streaming", path=Path(_env("FAKE_CLAUDE_WAIT_FOR")))
            if _env("FAKE_CLAUDE_THEN_TOOL"):
                self._tool(_env("FAKE_CLAUDE_THEN_TOOL"))
                self._pause("aborted_streaming", path=Path(_env("FAKE_CLAUDE_WAIT_FOR") + ".2"))
            if _env("FAKE_CLAUDE_THEN_SEND_FILE"):
                self._send_file(json.loads(_env("FAKE_CLAUDE_THEN_SEND_FILE")))

    def _take(self, message: dict[str, Any], *, started: bool = False) -> None:
        """Take a user message into the conversation: echo it, keep it."""
        if not started:
            self._lifecycle(message["uuid"], "started")
        self._taken.append(message["uuid"])
        if self._replay:
            _line(
                {
                    "type": "user",
                    "message": message.get("message", {}),
                    "session_id": self._session_id,
                    "parent_tool_use_id": None,
                    "uuid": message["uuid"],
                    "isReplay": True,
                }
            )
        text = _text_of(message)
        _log_prompt(text)
        self._prompts.append(text)
        self._history.append(text)
        _keep(self._sessions, self._cwd, self._session_id, text)

    def _take_waiting(self) -> None:
        """The turn's next step: messages sent meanwhile join this turn."""
        with self._cond:
            waiting, self._inbox = self._inbox, []
        for message in waiting:
            self._take(message)

    def _pause(
        self,
        reason: str,
        *,
        seconds: float = 0,
        path: Path | None = None,
        message: bool = False,
    ) -> None:
        """Wait ``seconds``, or until ``path`` exists, or (``message``) until a user message
        is waiting; an interrupt raises _Aborted(reason)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._interrupted:
                if message:
                    if self._inbox or self._eof:
                        return
                    self._cond.wait()
                elif path is not None:
                    if path.exists():
                        return
                    self._cond.wait(0.002)  # a file has no event to wait on: poll
                elif (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                else:
                    return
        raise _Aborted(reason)

    def _asks(self, tool: str) -> bool:
        """Whether a use of ``tool`` goes to the host (rules decide the rest)."""
        if not self._ask:
            return False
        with self._cond:
            if self._mode == "bypassPermissions":
                return False
        return not any(rule == tool or rule.startswith(tool + "(") for rule in self._allowed)

    def _tool(self, command: str) -> None:
        """A Bash tool use: asked for if need be, then run, then its result; next step."""
        sid = self._session_id
        tool_id = "toolu_" + _uuid4().replace("-", "")[:20]
        tool_input: dict[str, Any] = {"command": command}
        tool_input.update(json.loads(_env("FAKE_CLAUDE_TOOL_FIELDS") or "{}"))
        block = {"type": "tool_use", "id": tool_id, "name": "Bash", "input": tool_input}
        _line(_assistant(sid, block))
        if self._asks("Bash"):
            refusal = self._permission(tool_id, tool_input)
            if isinstance(refusal, str):
                self._denials.append(
                    {"tool_name": "Bash", "tool_use_id": tool_id, "tool_input": tool_input}
                )
                _line(_tool_result(sid, tool_id, refusal, True))
                self._take_waiting()
                return
            tool_input = refusal
        if _env("FAKE_CLAUDE_TOOL_LOG"):
            with open(_env("FAKE_CLAUDE_TOOL_LOG"), "a") as log:
                log.write(json.dumps(tool_input) + "\n")
        try:
            self._pause("aborted_tools", seconds=float(_env("FAKE_CLAUDE_TOOL_SECONDS") or 0))
            if _env("FAKE_CLAUDE_TOOL_WAIT_FOR"):
                self._pause("aborted_tools", path=Path(_env("FAKE_CLAUDE_TOOL_WAIT_FOR")))
            if _env("FAKE_CLAUDE_TOOL_UNTIL_MESSAGE"):
                self._pause("aborted_tools", message=True)
        except _Aborted:
            self._abandon(tool_id)
            raise
        output = _env("FAKE_CLAUDE_TOOL_OUTPUT") or "hello"
        _line(_tool_result(sid, tool_id, output, False))
        self._take_waiting()

    def _question(self, tool_input: dict[str, Any]) -> None:
        """An AskUserQuestion use: asked of the host; its answers are the tool's result."""
        sid = self._session_id
        tool_id = "toolu_" + _uuid4().replace("-", "")[:20]
        name = "AskUserQuestion"
        _line(
            _assistant(sid, {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input})
        )
        # Without a host to ask, nobody answers (as print mode without the stdio tool).
        answered = self._permission(tool_id, tool_input, name) if self._ask else tool_input
        if isinstance(answered, str):
            self._denials.append(
                {"tool_name": name, "tool_use_id": tool_id, "tool_input": tool_input}
            )
            _line(_tool_result(sid, tool_id, answered, True))
        else:
            if _env("FAKE_CLAUDE_TOOL_LOG"):
                with open(_env("FAKE_CLAUDE_TOOL_LOG"), "a") as log:
                    log.write(json.dumps(answered) + "\n")
            answers = answered.get("answers") or {}
            text = (
                "Your questions have been answered: "
                + ", ".join(f'"{q}"="{a}"' for q, a in answers.items())
                if answers
                else "The user did not answer the questions"
            )
            _line(_tool_result(sid, tool_id, text, False))
        self._take_waiting()

    def _send_file(self, tool_input: dict[str, Any]) -> None:
        """A ``mcp__chatbridge__send_file`` use, answered by the real MCP server."""
        sid = self._session_id
        name = "mcp__chatbridge__send_file"
        tool_id = "toolu_" + _uuid4().replace("-", "")[:20]
        _line(
            _assistant(sid, {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input})
        )
        server = next((m for m in self._mcp or [] if m.name == "chatbridge"), None)
        if server is None or "send_file" not in server.tools:
            text = f"<tool_use_error>Error: No such tool available: {name}</tool_use_error>"
            _line(_tool_result(sid, tool_id, text, True))
        elif self._asks(name) or (self._mode != "bypassPermissions" and name not in self._allowed):
            # Asked (``--permission-prompt-tool stdio``), or refused as print mode refuses.
            refusal = (
                self._permission(tool_id, tool_input, name)
                if self._asks(name)
                else f"Claude requested permissions to use {name}, but you haven't granted it yet."
            )
            if isinstance(refusal, str):
                self._denials.append(
                    {"tool_name": name, "tool_use_id": tool_id, "tool_input": tool_input}
                )
                _line(_tool_result(sid, tool_id, refusal, True))
            else:
                self._call_send_file(server, tool_id, refusal)
        else:
            self._call_send_file(server, tool_id, tool_input)
        self._take_waiting()

    def _call_send_file(
        self, server: _McpServer | _SdkMcpServer, tool_id: str, tool_input: dict[str, Any]
    ) -> None:
        """The MCP server's answer as the real CLI prints an MCP tool's result."""
        sid = self._session_id
        result = server.call("send_file", tool_input)
        if result.get("isError"):
            # An error's text blocks joined into one string, is_error true...
            text = "\n".join(b.get("text", "") for b in result["content"])
            _line(_tool_result(sid, tool_id, text, True))
        else:
            # ...and a success's blocks as they came, with no is_error key at all.
            line = _tool_result(sid, tool_id, result["content"], False)
            del line["message"]["content"][0]["is_error"]
            _line(line)

    def _permission(
        self, tool_id: str, tool_input: dict[str, Any], tool: str = "Bash"
    ) -> dict[str, Any] | str:
        """Ask the host (``can_use_tool``): the input to run with, or why not."""
        request_id = _uuid4()
        with self._cond:
            self._asking = request_id
        request: dict[str, Any] = {"subtype": "can_use_tool", "tool_name": tool}
        if tool == "Bash":
            command = str(tool_input.get("command", ""))
            rule: dict[str, Any] = {"toolName": "Bash", "ruleContent": command}
            request.update(display_name="Bash", input=tool_input, description=command)
        elif tool == "AskUserQuestion":
            rule = {"toolName": tool}
            request.update(display_name=tool, input=tool_input)
        else:
            # An MCP tool, as the real CLI asks for one: its server, no description,
            # and a rule for the whole tool.
            server = tool.split("__")[1]
            rule = {"toolName": tool}
            request.update(
                mcp_server={"name": server, "source": "dynamic"},
                display_name=" ".join(
                    w.capitalize() for w in tool.rsplit("__", maxsplit=1)[-1].split("_")
                ),
                input=tool_input,
                server_policy_ask_only=True,
            )
        request["permission_suggestions"] = [
            {
                "type": "addRules",
                "rules": [rule],
                "behavior": "allow",
                "destination": "localSettings",
            }
        ]
        request["tool_use_id"] = tool_id
        _line({"type": "control_request", "request_id": request_id, "request": request})
        with self._cond:
            self._cond.wait_for(
                lambda: request_id in self._answers or self._interrupted or self._eof
            )
            self._asking = None
            answer = self._answers.pop(request_id, None)
            interrupted = self._interrupted
        if interrupted:
            self._abandon(tool_id)
            raise _Aborted("aborted_tools")
        if answer is None:
            return _STREAM_CLOSED
        if answer.get("subtype") != "success":
            return str(answer.get("error", ""))
        decision = answer.get("response") or {}
        if decision.get("behavior") == "allow":
            return dict(decision.get("updatedInput") or tool_input)
        return str(decision.get("message", ""))

    def mcp_message(self, server: str, message: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the host for an SDK MCP server's answer to ``message``; None if the host
        refused or stdin ended first."""
        request_id = _uuid4()
        request = {"subtype": "mcp_message", "server_name": server, "message": message}
        _line({"type": "control_request", "request_id": request_id, "request": request})
        with self._cond:
            self._cond.wait_for(lambda: request_id in self._answers or self._eof)
            answer = self._answers.pop(request_id, None)
        if answer is None or answer.get("subtype") != "success":
            return None
        mcp = (answer.get("response") or {}).get("mcp_response")
        return mcp if isinstance(mcp, dict) else None

    def _abandon(self, tool_id: str) -> None:
        """The lines of a tool use an interrupt cut off."""
        _line(_tool_result(self._session_id, tool_id, _REJECTED, True))
        _line(_user_text(self._session_id, "[Request interrupted by user for tool use]"))

    def _end(
        self,
        *,
        subtype: str,
        is_error: bool,
        text: str,
        reason: str,
        errors: list[str],
        cost: float | None = None,
    ) -> dict[str, Any]:
        """The turn's result line; ``cost``: the turn's (``FAKE_CLAUDE_COST`` by default)."""
        result = _result(
            self._session_id,
            subtype=subtype,
            is_error=is_error,
            text=text,
            turns=len(self._history),
            errors=errors,
        )
        if result["total_cost_usd"]:
            self._spent += _cost() if cost is None else cost
        result["total_cost_usd"] = self._spent
        result["terminal_reason"] = reason
        result["permission_denials"] = self._denials
        return result

    def _finish(self, result: dict[str, Any]) -> None:
        _line(result)
        for message_uuid in self._taken:
            self._lifecycle(message_uuid, "completed")


FAKE_VERSION = "0.0.0-fake (Claude Code)"
"""What ``--version`` prints: the real CLI prints e.g. ``2.1.330 (Claude Code)``."""


def main() -> None:
    if sys.argv[1:] in (["--version"], ["-v"]):
        print(FAKE_VERSION)
        return
    opts, positional = _parse(sys.argv[1:])
    if _env("FAKE_CLAUDE_STDERR"):
        sys.stderr.write(_env("FAKE_CLAUDE_STDERR") + "\n")
    if _env("FAKE_CLAUDE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        # The real CLI exits 143 on SIGTERM without a result line.
        signal.signal(signal.SIGTERM, lambda *_: _exit_now(143, "sigterm"))
    if _RUN_LOG is not None:
        import atexit

        _RUN_LOG.start(os.getcwd())
        atexit.register(_RUN_LOG.end, "exit")

    if not (opts.get("-p") or opts.get("--print")):
        _fail("fake claude only implements print mode (-p)")
    output_format = opts.get("--output-format", "text")
    if output_format not in ("text", "json", "stream-json"):
        _fail(f"error: option '--output-format <format>' argument '{output_format}' is invalid.")
    if output_format == "stream-json" and not opts.get("--verbose"):
        _fail("Error: When using --print, --output-format=stream-json requires --verbose")

    streaming = opts.get("--input-format") == "stream-json"
    if streaming and output_format != "stream-json":
        _fail("Error: --input-format=stream-json requires output-format=stream-json.")
    # With stream-json input the prompts are the user messages read later on.
    prompt = "" if streaming else _read_prompt(positional)
    if not streaming:
        _log_prompt(prompt)

    cwd = os.getcwd()
    sessions = Path(_env("FAKE_CLAUDE_SESSIONS_DIR")) if _env("FAKE_CLAUDE_SESSIONS_DIR") else None
    resume: str | None = opts.get("resume")
    history: list[str] = []
    if resume:
        session_id = resume
        if sessions is not None:
            path = _project_dir(sessions, cwd) / f"{resume}.jsonl"
            if not path.exists():
                if output_format == "stream-json":
                    _line(
                        _result(
                            _uuid4(),
                            subtype="error_during_execution",
                            is_error=True,
                            text="",
                            turns=0,
                            errors=[],
                        )
                    )
                _fail(f"No conversation found with session ID: {resume}")
            history = [json.loads(x)["prompt"] for x in path.read_text().splitlines() if x]
        if opts.get("--fork-session"):
            # A copy under a new id: the resumed session's file stays as it was.
            session_id = _uuid4()
            for earlier in history:
                _keep(sessions, cwd, session_id, earlier)
    else:
        session_id = _uuid4()
    if not streaming:
        _keep(sessions, cwd, session_id, prompt)
        history.append(prompt)

    def on_interrupt(*_: object) -> None:
        _line(
            _result(
                session_id,
                subtype="error_during_execution",
                is_error=True,
                text="",
                turns=len(history),
                errors=["interrupted"],
            )
        )
        _exit_now(0, "sigint")

    signal.signal(signal.SIGINT, signal.SIG_IGN if _env("FAKE_CLAUDE_IGNORE_INT") else on_interrupt)
    if streaming:
        sys.exit(_Session(opts, cwd, session_id, sessions, history).serve())

    if _env("FAKE_CLAUDE_SLEEP_BEFORE_INIT"):
        time.sleep(float(_env("FAKE_CLAUDE_SLEEP_BEFORE_INIT")))
    children = _start_children()
    escaped = _start_escapes(Path(_env("FAKE_CLAUDE_ESCAPE"))) if _env("FAKE_CLAUDE_ESCAPE") else []
    _record(cwd, prompt, children, escaped)

    stream = output_format == "stream-json"
    if stream:
        _line(_init(session_id, cwd, opts.get("--model", MODEL), _mode(opts)))
        if _env("FAKE_CLAUDE_UNKNOWN"):
            _line({"type": "system", "subtype": "status", "status": "thinking"})
            _line({"type": "stream_event", "event": {"type": "content_block_delta"}})
            _line({"type": "rate_limit_event", "session_id": session_id})
            _line(_assistant(session_id, {"type": "thinking", "thinking": "hmm"}))
        _line(_assistant(session_id, {"type": "text", "text": "Working on it."}))
        if _env("FAKE_CLAUDE_GARBAGE"):
            sys.stdout.write("this is not json {\n")
            sys.stdout.flush()
        if _env("FAKE_CLAUDE_HUGE"):
            _line(
                _assistant(
                    session_id, {"type": "text", "text": "x" * int(_env("FAKE_CLAUDE_HUGE"))}
                )
            )
        if not _env("FAKE_CLAUDE_NO_TOOL"):
            _tool_pair(session_id, _env("FAKE_CLAUDE_TOOL_COMMAND") or "echo hello")
    if _env("FAKE_CLAUDE_SLEEP"):
        time.sleep(float(_env("FAKE_CLAUDE_SLEEP")))
    if _env("FAKE_CLAUDE_WAIT_FOR"):
        _wait_for(Path(_env("FAKE_CLAUDE_WAIT_FOR")))
        if _env("FAKE_CLAUDE_THEN_TOOL") and stream:
            _tool_pair(session_id, _env("FAKE_CLAUDE_THEN_TOOL"))
            _wait_for(Path(_env("FAKE_CLAUDE_WAIT_FOR") + ".2"))
    if _env("FAKE_CLAUDE_EXIT"):
        _fail("fake claude failure", int(_env("FAKE_CLAUDE_EXIT")))

    text = prompt if _env("FAKE_CLAUDE_ECHO") else (_env("FAKE_CLAUDE_RESULT") or "Done.")
    if _env("FAKE_CLAUDE_CUT_EMOJI"):
        text += " \ud83d"  # the first half of U+1F600, which UTF-16 writes as \ud83d\ude00
    is_error = bool(_env("FAKE_CLAUDE_IS_ERROR"))
    result = _result(
        session_id,
        subtype="error_during_execution" if is_error else "success",
        is_error=is_error,
        text=text,
        turns=len(history),
        errors=["fake error"] if is_error else [],
    )
    if stream:
        _line(_assistant(session_id, {"type": "text", "text": text}))
        _line(result)
    elif output_format == "json":
        _line(result)
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    printed = time.monotonic()
    if _env("FAKE_CLAUDE_LINGER"):
        time.sleep(float(_env("FAKE_CLAUDE_LINGER")))
    _times(prompt, printed)
    sys.exit(1 if is_error else 0)


if __name__ == "__main__":
    main()
