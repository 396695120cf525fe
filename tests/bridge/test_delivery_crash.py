"""A real ``chatbridge`` process killed after a run's outcome was recorded but
before its answer was delivered: the next start delivers it, exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.bridge.bridge_process import Bridge, wait_rows
from tests.bridge.harness import rows, write_config

pytestmark = pytest.mark.slow


async def test_kill_9_before_the_answer_went_out_delivers_it_after_the_restart(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path)
    # The console's output is a pipe nobody reads: every reply fails (EPIPE),
    # as if the chat server were down, and the answer waits in the outbox.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    first = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge", "run", "--config", str(config),
        stdin=asyncio.subprocess.PIPE,
        stdout=write_end,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )  # fmt: skip
    os.close(write_end)
    assert first.stdin is not None
    first.stdin.write(b"the answer that must arrive\n")
    # Recorded: the run succeeded and its answer is in the outbox, tried and
    # not delivered. No event crosses the process boundary: poll the database.
    await wait_rows(
        tmp_path,
        "select r.status, o.state, o.attempts > 0 from runs r join outbox o on o.run_id = r.id",
        [("succeeded", "pending", 1)],
    )
    first.send_signal(signal.SIGKILL)
    await first.wait()

    again = Bridge(config)
    await again.start()
    await again.wait_for("the answer that must arrive")
    assert await again.end_input() == 0
    assert again.out.splitlines().count("the answer that must arrive") == 1
    assert rows(tmp_path, "select state, parts_done from outbox") == [("delivered", 1)]
    # The run stays as it ended: it is not swept as interrupted.
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]
    assert "interrupted" not in again.out
