"""Supervisor protocol version 2: a bridge that goes, a claude that stops (review b)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.runner.live_helpers import (
    JournalReader,
    allowed,
    run_heads,
    start_supervisor,
    stdin,
    user,
)

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
    return await start_supervisor(
        tmp_path,
        theirs,
        ASKING_THEN_STUCK,
        name="v2-breaks",
        grace_s=0.5,
        idle_s=idle_s,
        orphan_s=orphan_s,
    )


async def test_after_the_answer_a_silent_claude_is_stalled_again(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + stdin(user("go", "u-1")))
        with theirs:
            proc = await start(tmp_path, theirs, idle_s=0.5)
        reader = JournalReader(ours)
        await reader.until(b'"can_use_tool"')
        await asyncio.sleep(1.0)  # a person deciding: not stalled
        ours.sendall(allowed("ask-1"))
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    expired = [head for head in run_heads(tmp_path) if head["t"] == "expired"]
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
    kinds = [head["t"] for head in run_heads(tmp_path)]
    assert {"t": "expired", "status": "orphaned"} in run_heads(tmp_path)
    assert "stdin_closed" not in kinds[: kinds.index("expired")]
