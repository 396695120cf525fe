#!/usr/bin/env python3
"""A fake ``claude`` CLI for tests: print mode with stream-json, no network.

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
``FAKE_CLAUDE_RECORD=PATH``
    Write ``{"argv", "cwd", "env", "prompt", "pid", "children", "escaped"}`` as JSON to
    PATH (written before any output, after children are started).
``FAKE_CLAUDE_SESSIONS_DIR=DIR``
    Keep sessions as files under DIR, per cwd like the real CLI (a resume from
    another cwd finds nothing). Then ``--resume`` of an unknown id prints a
    zeroed ``error_during_execution`` result, ``No conversation found with
    session ID: <id>`` on stderr and exits 1. Without it any resume succeeds.
    The result of a resumed run reports ``num_turns`` = prompts in the session.
``FAKE_CLAUDE_TOOL_COMMAND=CMD``
    The command shown in the tool_use (default ``echo hello``);
    ``FAKE_CLAUDE_NO_TOOL=1`` skips the tool_use/tool_result pair.
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
``FAKE_CLAUDE_TIMES=PATH``
    Append one JSON line to PATH at exit: ``{"prompt", "start", "result", "exit"}``,
    the ``time.monotonic()`` (system-wide on Linux) once this script's imports
    are done, just after the result line was flushed and just before exiting.
``FAKE_CLAUDE_LINGER=SECONDS``
    Stay alive this long after printing the result line.
``FAKE_CLAUDE_STDERR=TEXT``
    Write TEXT to stderr at start.

Children started by the switches above are listed in the record file.
SIGINT prints an interrupted ``error_during_execution`` result and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

# Python's own start-up is over here: what a run's breakdown calls "claude started".
_STARTED = time.monotonic()

FAKE_CLAUDE = Path(__file__).resolve()
"""This script, to use as ``RunRequest.claude_bin``."""


def install(directory: Path, python: str = sys.executable) -> Path:
    """Write an executable ``claude`` into ``directory`` that runs this fake with ``python``.

    Faster to start than the ``env python3`` shebang where ``python3`` is a
    shim, and usable by name with ``directory`` on PATH. Returns its path.
    """
    launcher = directory / "claude"
    launcher.write_text(f'#!/bin/sh\nexec "{python}" "{FAKE_CLAUDE}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


MODEL = "claude-fake-1"
TOOLS = ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]
_VALUE_FLAGS = {
    "--output-format",
    "--model",
    "--permission-mode",
    "--permission-prompt-tool",
    "--max-turns",
    "--append-system-prompt",
    "--system-prompt",
    "--fallback-model",
    "--session-id",
    "--max-budget-usd",
    "--input-format",
    "--settings",
}
_VARIADIC_FLAGS = {"--allowedTools", "--allowed-tools", "--disallowedTools", "--disallowed-tools"}
_BOOL_FLAGS = {
    "-p",
    "--print",
    "--verbose",
    "--continue",
    "-c",
    "--fork-session",
    "--include-partial-messages",
    "--replay-user-messages",
    "--dangerously-skip-permissions",
}


def _fail(message: str, code: int = 1) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def _env(name: str) -> str:
    return os.environ.get(name, "")


def _parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse like commander: variadic tool lists swallow following non-options."""
    opts: dict[str, Any] = {"allowed": [], "disallowed": []}
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
            key = "allowed" if name.startswith("--allowed") else "disallowed"
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


def _project_dir(sessions: Path, cwd: str) -> Path:
    return sessions / cwd.replace("/", "-")


def _line(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


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
        "total_cost_usd": 0.0 if turns == 0 else 0.0123,
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "modelUsage": {},
        "permission_denials": [],
        "uuid": str(uuid.uuid4()),
    }
    if subtype == "success":
        result["result"] = text
    else:
        result["errors"] = errors
    return result


def _tool_pair(session_id: str, command: str) -> None:
    """A Bash tool_use and its tool_result, as the real CLI prints them."""
    tool_id = "toolu_" + uuid.uuid4().hex[:20]
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
            "uuid": str(uuid.uuid4()),
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
        "uuid": str(uuid.uuid4()),
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


def _start_children() -> list[int]:
    pids: list[int] = []
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


def _first_user_message(replay: bool) -> tuple[str, dict[str, Any] | None]:
    """``--input-format stream-json``: the first user message's text (and the line to
    echo with ``--replay-user-messages``); control requests before it get a bare success."""
    for raw in sys.stdin:
        obj = json.loads(raw)
        if obj.get("type") == "control_request":
            response = {"subtype": "success", "request_id": obj["request_id"], "response": {}}
            _line({"type": "control_response", "response": response})
        elif obj.get("type") == "user":
            content = obj["message"]["content"]
            return str(content), (obj if replay else None)
    return "", None


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
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))

    if not (opts.get("-p") or opts.get("--print")):
        _fail("fake claude only implements print mode (-p)")
    output_format = opts.get("--output-format", "text")
    if output_format not in ("text", "json", "stream-json"):
        _fail(f"error: option '--output-format <format>' argument '{output_format}' is invalid.")
    if output_format == "stream-json" and not opts.get("--verbose"):
        _fail("Error: When using --print, --output-format=stream-json requires --verbose")

    replay: dict[str, Any] | None = None
    if opts.get("--input-format") == "stream-json":
        stdin_text, replay = _first_user_message(bool(opts.get("--replay-user-messages")))
    else:
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
                            str(uuid.uuid4()),
                            subtype="error_during_execution",
                            is_error=True,
                            text="",
                            turns=0,
                            errors=[],
                        )
                    )
                _fail(f"No conversation found with session ID: {resume}")
            history = [json.loads(x)["prompt"] for x in path.read_text().splitlines() if x]
    else:
        session_id = str(uuid.uuid4())
    if sessions is not None:
        project = _project_dir(sessions, cwd)
        project.mkdir(parents=True, exist_ok=True)
        with (project / f"{session_id}.jsonl").open("a") as f:
            f.write(json.dumps({"prompt": prompt}) + "\n")
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
        os._exit(0)

    signal.signal(signal.SIGINT, on_interrupt)

    if _env("FAKE_CLAUDE_SLEEP_BEFORE_INIT"):
        time.sleep(float(_env("FAKE_CLAUDE_SLEEP_BEFORE_INIT")))
    children = _start_children()
    escaped = _start_escapes(Path(_env("FAKE_CLAUDE_ESCAPE"))) if _env("FAKE_CLAUDE_ESCAPE") else []
    if _env("FAKE_CLAUDE_RECORD"):
        record = {
            "argv": sys.argv,
            "cwd": cwd,
            "env": dict(os.environ),
            "prompt": prompt,
            "pid": os.getpid(),
            "children": children,
            "escaped": escaped,
        }
        tmp = Path(_env("FAKE_CLAUDE_RECORD") + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(_env("FAKE_CLAUDE_RECORD"))

    stream = output_format == "stream-json"
    if stream:
        _line(
            {
                "type": "system",
                "subtype": "init",
                "cwd": cwd,
                "session_id": session_id,
                "tools": TOOLS,
                "mcp_servers": [],
                "model": opts.get("--model", MODEL),
                "permissionMode": opts.get("--permission-mode", "default"),
                "slash_commands": [],
                "apiKeySource": "ANTHROPIC_API_KEY",
                "claude_code_version": "0.0.0-fake",
                "output_style": "default",
                "uuid": str(uuid.uuid4()),
            }
        )
        if replay is not None:
            _line({**replay, "session_id": session_id, "isReplay": True})
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
    if _env("FAKE_CLAUDE_TIMES"):
        stamp = {
            "prompt": prompt,
            "start": _STARTED,
            "result": printed,
            "exit": time.monotonic(),
        }
        with open(_env("FAKE_CLAUDE_TIMES"), "a") as times:
            times.write(json.dumps(stamp) + "\n")
    sys.exit(1 if is_error else 0)


if __name__ == "__main__":
    main()
