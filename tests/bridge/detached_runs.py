"""Runs that outlive the service that started them: waits on their supervisors and journals."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bridge.bridge_process import Bridge, escaping_tree, wait_rows
from tests.bridge.harness import rows


def waiting(tmp_path: Path, **more: str) -> dict[str, str]:
    """A run that answers (its prompt, echoed) once ``tmp_path/go`` exists; one line per
    claude process that ran to its end in ``tmp_path/times``."""
    return {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_WAIT_FOR": str(tmp_path / "go"),
        "FAKE_CLAUDE_TIMES": str(tmp_path / "times"),
        **escaping_tree(tmp_path),
        "FAKE_CLAUDE_SLEEP": "0",
        **more,
    }


def finished_claudes(tmp_path: Path) -> list[str]:
    """The prompts of the claude processes that ran to their end."""
    path = tmp_path / "times"
    if not path.exists():
        return []
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line]


async def started_run(bridge: Bridge, tmp_path: Path, text: str = "long job") -> str:
    """Send ``text``, wait until its run shows progress and is registered; its id."""
    bridge.send(text)
    await bridge.wait_for("Bash: echo hello")
    run_id = str(rows(tmp_path, "select id from runs")[0][0])
    # Registered before the room is shown the run; the shown offset follows within a second.
    await wait_for_offset(tmp_path, run_id)
    return run_id


def supervisor_pid(tmp_path: Path) -> int:
    return int(str(rows(tmp_path, "select supervisor_pid from live_runs")[0][0]))


async def wait_for_offset(tmp_path: Path, run_id: str) -> None:
    # (The tests have one run at a time.)
    await wait_rows(tmp_path, "select run_id, delivered_offset > 0 from live_runs", [(run_id, 1)])
