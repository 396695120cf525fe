"""The whole service in-process: console room on a pipe, fake claude, SQLite."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.bridge.harness import run_console, write_config


def db_rows(tmp_path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return db.execute(sql).fetchall()


async def test_a_burst_becomes_one_attributed_batch(tmp_path: Path) -> None:
    out = await run_console(write_config(tmp_path), ["first", "second", "third"])
    assert out.count("local wrote:") == 3
    assert out.index("first") < out.index("second") < out.index("third")
    assert db_rows(tmp_path, "select count(*) from runs") == [(1,)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("done",)]


async def test_progress_then_result(tmp_path: Path) -> None:
    out = (await run_console(write_config(tmp_path), ["hello"])).splitlines()
    progress = [line for line in out if line.startswith("· ")]
    assert progress[0].startswith("· Working")
    assert progress[-1].startswith("· Done after")
    assert out[-1] == "hello"


async def test_session_is_resumed_on_the_next_run(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    record = tmp_path / "record.json"
    path = write_config(
        tmp_path,
        env=f'FAKE_CLAUDE_SESSIONS_DIR = "{sessions}", FAKE_CLAUDE_RECORD = "{record}"',
    )
    await run_console(path, ["one"])
    first = json.loads(record.read_text())
    assert not any(a.startswith("--resume") for a in first["argv"])
    session = first.get("session_id") or db_rows(tmp_path, "select session_id from rooms")[0][0]
    await run_console(path, ["two"])
    second = json.loads(record.read_text())
    assert f"--resume={session}" in second["argv"]
    assert second["prompt"] == "two"
    assert "two" not in second["argv"]


async def test_reset_starts_a_new_session(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    path = write_config(tmp_path, env=f'FAKE_CLAUDE_ECHO = "1", FAKE_CLAUDE_RECORD = "{record}"')
    await run_console(path, ["one"])
    out = await run_console(path, ["!reset"])
    assert "new Claude session" in out
    await run_console(path, ["two"])
    assert not any(a.startswith("--resume") for a in json.loads(record.read_text())["argv"])
    actions = [r[0] for r in db_rows(tmp_path, "select action from audit order by id")]
    assert "session_reset" in actions


async def test_unknown_session_falls_back_to_a_fresh_one(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    path = write_config(
        tmp_path, env=f'FAKE_CLAUDE_SESSIONS_DIR = "{sessions}", FAKE_CLAUDE_ECHO = "1"'
    )
    await run_console(path, ["one"])
    for f in sessions.rglob("*"):
        if f.is_file():
            f.unlink()  # claude forgot every session
    out = await run_console(path, ["two"])
    assert "no longer has session" in out
    assert out.splitlines()[-1] == "two"


async def test_missing_claude_is_reported_in_the_room(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(
        path.read_text().replace('claude_bin = "', f'claude_bin = "{tmp_path}/no-such-dir')
    )
    out = await run_console(path, ["hello"])
    assert "run failed" in out
    assert "not found" in out
    assert db_rows(tmp_path, "select status from runs") == [("failed",)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("failed",)]


async def test_help_status_and_unknown_commands(tmp_path: Path) -> None:
    out = await run_console(write_config(tmp_path), ["!help", "!status", "!bogus"])
    assert "`!stop`" in out
    assert "Idle." in out
    assert "Unknown command `!bogus`" in out
    # Commands never become part of a batch.
    assert db_rows(tmp_path, "select count(*) from runs") == [(0,)]
    assert db_rows(tmp_path, "select distinct state from messages") == [("done",)]


async def test_stop_with_nothing_running(tmp_path: Path) -> None:
    out = await run_console(write_config(tmp_path), ["!stop"])
    assert "Nothing is running and nothing is waiting." in out


async def test_unauthorized_console_user_starts_nothing(tmp_path: Path) -> None:
    out = await run_console(
        write_config(tmp_path, extra='allowed_users = ["someone-else"]'), ["hello"]
    )
    assert "hello" not in out
    assert db_rows(tmp_path, "select count(*) from runs") == [(0,)]
    assert db_rows(tmp_path, "select count(*) from messages") == [(0,)]
    assert db_rows(tmp_path, "select action from audit") == [("message_ignored",)]


async def test_failed_run_can_be_retried(tmp_path: Path) -> None:
    path = write_config(tmp_path, env='FAKE_CLAUDE_EXIT = "3"')
    out = await run_console(path, ["do it"])
    assert "run failed" in out
    path.write_text(path.read_text().replace('FAKE_CLAUDE_EXIT = "3"', 'FAKE_CLAUDE_ECHO = "1"'))
    out = await run_console(path, ["!retry"])
    assert "Retrying 1 message" in out
    assert out.splitlines()[-1] == "do it"
    statuses = [r[0] for r in db_rows(tmp_path, "select status from runs order by started_at")]
    assert statuses == ["failed", "succeeded"]
    out = await run_console(path, ["!retry"])
    assert "no failed or interrupted run" in out
