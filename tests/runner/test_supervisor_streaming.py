"""Supervisor protocol version 2 on its own: ``in`` records and the supervisor's own eof.

A scripted stand-in for claude speaks the streaming protocol's essentials
(docs/live-runs.md): it echoes each user message (``isReplay``) and prints
results, and exits only when its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from tests.runner.detached_runs import records
from tests.runner.live_helpers import (
    JournalReader,
    allowed,
    run_heads,
    start_supervisor,
    stdin,
    user,
)

pytestmark = pytest.mark.slow

# "late": a result first (the message is not taken yet), then the echo, then its result.
STREAMING_CLAUDE = """
import json, sys
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()
for raw in sys.stdin:
    msg = json.loads(raw)
    if msg.get("type") != "user":
        continue
    if msg["message"]["content"] == "late":
        out({"type": "result", "subtype": "success", "result": "earlier turn"})
    out({**msg, "isReplay": True})
    out({"type": "result", "subtype": "success", "result": "answer"})
"""


# Asks its host once, waits for the answer (however long), then answers.
ASKING_CLAUDE = """
import json, sys
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()
msg = json.loads(sys.stdin.readline())
out({**msg, "isReplay": True})
request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}}
out({"type": "control_request", "request_id": "ask-1", "request": request})
answer = json.loads(sys.stdin.readline())
out({"type": "result", "subtype": "success", "result": answer["response"]["response"]["behavior"]})
sys.stdin.read()
"""


async def start(
    tmp_path: Path, theirs: socket.socket, claude: str = STREAMING_CLAUDE, idle_s: float = 60
) -> asyncio.subprocess.Process:
    return await start_supervisor(
        tmp_path, theirs, claude, name="v2-test", grace_s=1, idle_s=idle_s
    )


async def test_in_records_and_the_supervisors_own_eof(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[1,2],"offset":0}\n' + stdin(user("first", "u-1")))
        with theirs:
            proc = await start(tmp_path, theirs)
        reader = JournalReader(ours)
        await reader.until(b'"result": "answer"')
        # Attached, the supervisor leaves the eof to the bridge: claude still takes input.
        ours.sendall(stdin(user("late", "u-2")))
        await reader.until(b'"uuid": "u-2", "isReplay": true')
        welcome = json.loads(reader.data.partition(b"\n")[0])
        # Detached now: the last result came after every message's echo, so it closes stdin.
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert welcome == {"t": "welcome", "v": 2, "size": welcome["size"]}
    heads = list(records((tmp_path / "run" / "journal").read_bytes()))
    assert heads[0][0]["v"] == 2
    ins = [payload for head, payload, _ in heads if head["t"] == "in"]
    assert ins == [user("first", "u-1"), user("late", "u-2")]
    kinds = [head["t"] for head, _, _ in heads]
    closed = kinds.index("stdin_closed")
    out_before = b"".join(p for h, p, _ in heads[:closed] if h["t"] == "out")
    assert out_before.count(b'"result": "answer"') == 2
    assert closed < kinds.index("exited")


async def test_a_result_before_the_echo_does_not_close_stdin(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + stdin(user("late", "u-1")))
        # The bridge goes at once (its end read after the message): the supervisor decides alone.
        ours.shutdown(socket.SHUT_WR)
        with theirs:
            proc = await start(tmp_path, theirs)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    heads = list(records((tmp_path / "run" / "journal").read_bytes()))
    kinds = [head["t"] for head, _, _ in heads]
    closed = kinds.index("stdin_closed")
    out_before = b"".join(p for h, p, _ in heads[:closed] if h["t"] == "out")
    # Closed only after the result that followed the echo, not after the earlier one.
    assert out_before.endswith(b'"result": "answer"}\n')
    assert b"isReplay" in out_before


async def test_claude_waiting_on_its_host_is_not_stalled(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + stdin(user("go", "u-1")))
        with theirs:
            proc = await start(tmp_path, theirs, ASKING_CLAUDE, idle_s=0.5)
        reader = JournalReader(ours)
        await reader.until(b'"can_use_tool"')
        await asyncio.sleep(1.5)  # a person deciding: three idle limits pass
        ours.sendall(allowed("ask-1"))
        await reader.until(b'"result": "allow"')
        ours.sendall(b'{"t":"eof"}\n')
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    heads = run_heads(tmp_path)
    assert {"t": "exited", "code": 0} in heads
    assert not [head for head in heads if head["t"] == "expired"]
