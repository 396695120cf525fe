"""Supervisor protocol version 2: a bridge that goes, a claude that stops (review b)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest

from runner.supervision import BOOTSTRAP, SUPERVISOR
from tests.runner.test_detached import records
from tests.runner.test_supervisor_v2 import JournalReader, stdin, user

pytestmark = pytest.mark.slow

# Asks its host, waits for the answer, then is stuck (prints nothing, reads nothing).
ASKING_THEN_STUCK = """
import json, sys, time
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()
msg = json.loads(sys.stdin.readline())
out({**msg, "isReplay": True})
request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}}
out({"type": "control_request", "request_id": "ask-1", "request": request})
sys.stdin.readline()
time.sleep(300)
"""


async def start(
    tmp_path: Path, theirs: socket.socket, *, idle_s: float = 60, orphan_s: float = 60
) -> asyncio.subprocess.Process:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    script = tmp_path / "claude.py"
    script.write_text(ASKING_THEN_STUCK)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(SUPERVISOR),
        "--run-id=v2-breaks", f"--run-dir={run_dir}", f"--cwd={tmp_path}",
        f"--conn-fd={theirs.fileno()}", "--grace-s=0.5", "--run-timeout-s=60",
        f"--idle-timeout-s={idle_s}", f"--orphan-timeout-s={orphan_s}",
        "--spool-max-bytes=1000000", "--max-line-bytes=1000000",
        "--", sys.executable, "-I", str(script),
        pass_fds=(theirs.fileno(),),
    )  # fmt: skip


def heads(tmp_path: Path) -> list[dict[str, object]]:
    return [head for head, _, _ in records((tmp_path / "run" / "journal").read_bytes())]


async def test_after_the_answer_a_silent_claude_is_stalled_again(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + stdin(user("go", "u-1")))
        with theirs:
            proc = await start(tmp_path, theirs, idle_s=0.5)
        reader = JournalReader(ours)
        await reader.until(b'"can_use_tool"')
        await asyncio.sleep(1.0)  # a person deciding: not stalled
        answer = {"subtype": "success", "request_id": "ask-1", "response": {"behavior": "allow"}}
        line = json.dumps({"type": "control_response", "response": answer}).encode() + b"\n"
        ours.sendall(stdin(line))
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    expired = [head for head in heads(tmp_path) if head["t"] == "expired"]
    assert expired == [{"t": "expired", "status": "stalled"}]


async def test_a_bridge_gone_during_a_permission_request(tmp_path: Path) -> None:
    # No result came: the supervisor must not close stdin (that refuses the tool); the
    # orphan limit still ends the run.
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + stdin(user("go", "u-1")))
        with theirs:
            proc = await start(tmp_path, theirs, orphan_s=1.0)
        reader = JournalReader(ours)
        await reader.until(b'"can_use_tool"')
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    kinds = [head["t"] for head in heads(tmp_path)]
    assert {"t": "expired", "status": "orphaned"} in heads(tmp_path)
    assert "stdin_closed" not in kinds[: kinds.index("expired")]
