"""The real ``chatbridge`` process: signals, kill -9 and recovery.

After every test no process of any run survives (checked by marker).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from runner.process import find_marked
from tests.bridge.bridge_process import Bridge, escaping_tree, run_pids, wait_rows
from tests.bridge.harness import rows, write_config
from tests.runner.containment import alive

pytestmark = pytest.mark.slow


SLOW_TREE = {
    "FAKE_CLAUDE_SLEEP": "60",
    "FAKE_CLAUDE_GRANDCHILD": "1",
    "FAKE_CLAUDE_BACKGROUND": "1",
}


@pytest.mark.usefixtures("no_leftovers")
async def test_sigterm_interrupts_a_long_run_after_the_grace_period(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, {"runner": {"shutdown_grace_s": 0.5, "on_shutdown": "stop"}}, env=SLOW_TREE
    )
    bridge = Bridge(config)
    await bridge.start()
    bridge.send("long job")
    await bridge.wait_for("Bash: echo hello")
    run_id = str(rows(tmp_path, "select id from runs")[0][0])
    assert find_marked(run_id)
    bridge.signal(signal.SIGTERM)
    assert await bridge.exit_code() == 0
    assert (
        "The run was interrupted: chatbridge stopped before it finished. "
        f"`!retry {run_id}` runs it again." in bridge.out
    )
    assert find_marked(run_id) == []
    assert rows(tmp_path, "select status from runs") == [("interrupted",)]


@pytest.mark.usefixtures("no_leftovers")
async def test_sigterm_lets_a_short_run_finish(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"runner": {"on_shutdown": "stop"}},
        env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_SLEEP": "1"},
    )
    bridge = Bridge(config)
    await bridge.start()
    bridge.send("quick job")
    await bridge.wait_for("Bash: echo hello")
    bridge.signal(signal.SIGTERM)
    assert await bridge.exit_code() == 0
    assert "quick job" in bridge.out.splitlines()
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]


@pytest.mark.usefixtures("no_leftovers")
async def test_second_signal_stops_at_once(tmp_path: Path) -> None:
    # A grace longer than the run: had the second signal been ignored, the run
    # would finish and be recorded as succeeded.
    config = write_config(
        tmp_path, {"runner": {"shutdown_grace_s": 600, "on_shutdown": "stop"}}, env=SLOW_TREE
    )
    bridge = Bridge(config)
    await bridge.start()
    bridge.send("long job")
    await bridge.wait_for("Bash: echo hello")
    run_id = str(rows(tmp_path, "select id from runs")[0][0])
    bridge.signal(signal.SIGTERM)
    bridge.signal(signal.SIGINT)
    assert await bridge.exit_code() == 0
    assert find_marked(run_id) == []
    assert rows(tmp_path, "select status from runs") == [("interrupted",)]


@pytest.mark.usefixtures("no_leftovers")
async def test_stop_leaves_no_tool_behind(tmp_path: Path) -> None:
    config = write_config(tmp_path, env=escaping_tree(tmp_path))
    bridge = Bridge(config)
    await bridge.start()
    bridge.send("long job")
    await bridge.wait_for("Bash: echo hello")
    pids = run_pids(tmp_path)
    assert alive(pids) == pids
    bridge.send("!stop")
    await bridge.wait_for("· Stopped after")
    # The reply is sent once the run's supervisor, and so its whole tree, is gone.
    assert alive(pids) == []
    assert await bridge.end_input() == 0


@pytest.mark.usefixtures("no_leftovers")
async def test_kill_9_between_commit_and_dispatch(tmp_path: Path) -> None:
    # A debounce window far longer than the test: accepted, never dispatched.
    config = write_config(tmp_path, {"dispatcher": {"coalesce_ms": 600000, "max_wait_ms": 600000}})
    bridge = Bridge(config)
    await bridge.start()
    for text in ("alpha", "beta", "gamma"):
        bridge.send(text)
    await wait_rows(tmp_path, "select count(*) from messages where state = 'pending'", [(3,)])
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()

    write_config(tmp_path)  # the usual debounce window
    again = Bridge(config)
    await again.start()
    assert await again.end_input() == 0
    assert "local wrote:\n> alpha\n\nlocal wrote:\n> beta\n\nlocal wrote:\n> gamma" in again.out
    assert rows(tmp_path, "select count(*) from runs") == [(1,)]
    assert rows(tmp_path, "select distinct state from messages") == [("done",)]
