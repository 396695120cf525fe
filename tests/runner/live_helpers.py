"""Helpers shared by the live-run tests: requests, scripts, event callbacks and waits.

For the runner's live runs (fake and real claude) and for the supervisor's protocol
version 2 spoken over a socket pair.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import LiveRun, RunId
from runner import EventCallback, Result, RunControl, RunEvent
from runner.bare import bare_argv
from runner.spare import SUPERVISOR
from tests.fakes.model_server import ModelServer, ToolCall, Turn
from tests.runner.conftest import Recorder
from tests.runner.detached_runs import records
from tests.runner.real_claude import marked_with, real_request, until


def asking(run_id: RunId, tmp_path: Path, server: ModelServer, prompt: str, **kw: Any) -> Any:
    """A run whose tool uses claude's rules do not decide: it asks (``approve_tools``)."""
    return real_request(
        run_id,
        tmp_path,
        server,
        prompt,
        permission_mode="default",
        allowed_tools=(),
        approve_tools=True,
        **kw,
    )


def gate(tmp_path: Path) -> tuple[Path, str]:
    """A fifo a Bash tool blocks on (``cat``) until the test writes to it."""
    path = tmp_path / "gate"
    os.mkfifo(path)
    return path, f"cat {path}"


def bash_turn(command: str, text: str = "") -> Turn:
    """A model turn that runs ``command`` with claude's Bash tool."""
    return Turn(text=text, tools=(ToolCall("Bash", {"command": command}),))


async def until_running(run_id: RunId, command: str) -> None:
    """The run's tool process running ``command`` is there (the real claude started it)."""
    await until(lambda: bool(marked_with(run_id, command)))


def journal_heads(live: LiveRun) -> list[tuple[dict[str, Any], bytes]]:
    data = (Path(live.run_dir) / "journal").read_bytes()
    return [(head, payload) for head, payload, _ in records(data)]


def sending_at_the_first_result(
    recorder: Recorder, control: RunControl, text: str
) -> tuple[EventCallback, list[str]]:
    """An ``on_event`` that records every event and sends ``text`` once, at the first
    result; and the list that then holds the uuid ``send`` returned."""
    sent: list[str] = []

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, Result) and not sent:
            sent.append(control.send(text))

    return on_event, sent


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it ended by that cancel."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# The supervisor on its own (protocol version 2), a scripted claude behind it.


def user(text: str, uid: str) -> bytes:
    line = json.dumps({"type": "user", "message": {"role": "user", "content": text}, "uuid": uid})
    return line.encode() + b"\n"


def stdin(data: bytes) -> bytes:
    return b'{"t":"stdin","n":%d}\n%s' % (len(data), data)


def allowed(request_id: str) -> bytes:
    """The ``stdin`` record of the host's answer allowing the tool use ``request_id``."""
    answer = {"subtype": "success", "request_id": request_id, "response": {"behavior": "allow"}}
    return stdin(json.dumps({"type": "control_response", "response": answer}).encode() + b"\n")


async def start_supervisor(
    tmp_path: Path,
    theirs: socket.socket,
    claude: str,
    *,
    name: str,
    grace_s: float,
    idle_s: float = 60,
    orphan_s: float = 60,
) -> asyncio.subprocess.Process:
    """The supervisor of run ``name`` in ``tmp_path/run``, the script ``claude`` its claude."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    script = tmp_path / "claude.py"
    script.write_text(claude)
    return await asyncio.create_subprocess_exec(
        *bare_argv(str(SUPERVISOR)),
        f"--run-id={name}", f"--run-dir={run_dir}", f"--cwd={tmp_path}",
        f"--conn-fd={theirs.fileno()}", f"--grace-s={grace_s}", "--run-timeout-s=60",
        f"--idle-timeout-s={idle_s}", f"--orphan-timeout-s={orphan_s}",
        "--spool-max-bytes=1000000", "--max-line-bytes=1000000",
        "--", sys.executable, "-I", str(script),
        pass_fds=(theirs.fileno(),),
    )  # fmt: skip


def run_heads(tmp_path: Path) -> list[dict[str, Any]]:
    """The heads of the journal in ``tmp_path/run``."""
    return [head for head, _, _ in records((tmp_path / "run" / "journal").read_bytes())]


class JournalReader:
    """The journal as a bridge gets it over the socket, record by record."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""
        self.heads: list[tuple[dict[str, Any], bytes]] = []

    async def until(self, wanted: bytes) -> None:
        """Read on until an ``out`` payload holding ``wanted`` arrived."""
        while not any(h["t"] == "out" and wanted in p for h, p in self.heads):
            chunk = await asyncio.to_thread(self.sock.recv, 65536)
            assert chunk, "the connection ended first"
            self.data += chunk
            _, _, rest = self.data.partition(b"\n")  # the welcome line
            self.heads = [(h, p) for h, p, end in records(rest) if end <= len(rest)]
