"""A file claude sent is posted once, whatever restarts happen around it: the real
``chatbridge`` process is killed (or stopped) after the tool result, the run goes on
under its supervisor, and the next start replays the run's journal (docs/files.md)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.bridge.bridge_process import Bridge, wait_rows
from tests.bridge.detached_runs import finished_claudes, started_run, wait_for_offset, waiting
from tests.bridge.harness import rows, write_config

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
async def test_a_replayed_tool_result_posts_nothing_again(
    tmp_path: Path, how: signal.Signals
) -> None:
    (tmp_path / "report.txt").write_text("numbers\n")
    sending = json.dumps({"path": "report.txt", "comment": "the report"})
    config = write_config(tmp_path, env=waiting(tmp_path, FAKE_CLAUDE_SEND_FILE=sending))
    bridge = Bridge(config)
    await bridge.start()
    bridge.send("send the report, then wait")
    await bridge.wait_for("[file] report.txt (8 bytes)")
    run_id = str(rows(tmp_path, "select id from runs")[0][0])
    await wait_for_offset(tmp_path, run_id)
    # Posted and recorded as posted (the console has no idempotency key of its own:
    # a kill between its print and that record would print it again, as for answers).
    await wait_rows(tmp_path, "select state from outbox where file is not null", [("delivered",)])
    bridge.signal(how)
    await bridge.exit_code()

    again = Bridge(config)
    await again.start()
    (tmp_path / "go").touch()
    await again.wait_for("send the report, then wait")  # the run's answer (echoed)
    assert await again.end_input() == 0
    assert "[file]" not in again.out
    assert rows(tmp_path, "select count(*) from outbox where file is not null") == [(1,)]


@pytest.mark.usefixtures("no_leftovers")
async def test_a_file_sent_while_the_bridge_is_down_is_posted_after_the_restart(
    tmp_path: Path,
) -> None:
    """The supervisor answers claude's send_file (the SDK MCP server's ``mcp_message``)
    with no bridge attached: the run finishes on its own, and the next start posts
    the file, once."""
    (tmp_path / "report.txt").write_text("numbers\n")
    sending = json.dumps({"path": "report.txt", "comment": "the report"})
    env = waiting(tmp_path, FAKE_CLAUDE_THEN_SEND_FILE=sending)
    config = write_config(tmp_path, env=env)
    bridge = Bridge(config)
    await bridge.start()
    await started_run(bridge, tmp_path, "send the report once I say go")
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()
    (tmp_path / "go").touch()
    # Answered by the supervisor alone: claude gets its tool result and ends. (Another
    # process writes the file: no event to wait on, only its state.)
    async with asyncio.timeout(30):
        while finished_claudes(tmp_path) != ["send the report once I say go"]:
            await asyncio.sleep(0.05)

    again = Bridge(config)
    await again.start()
    await again.wait_for("[file] report.txt (8 bytes)")
    await again.wait_for("send the report once I say go")  # the run's answer (echoed)
    assert await again.end_input() == 0
    assert again.out.count("[file] report.txt") == 1
    assert rows(tmp_path, "select count(*) from outbox where file is not null") == [(1,)]
