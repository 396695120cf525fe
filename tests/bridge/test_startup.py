"""Start-up of the real ``chatbridge``: what it imports, how a part that cannot start fails.

A part that cannot start is one line naming its setting and exit status 1,
never a traceback, and "chatbridge ready" is not logged before it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.bridge.harness import write_config as config

pytestmark = pytest.mark.slow

HEAVY = ("alembic", "aiohttp", "nio", "slack_bolt", "slack_sdk", "asyncpg", "markdown_it")
"""Libraries a console bridge on SQLite with HTTP off never needs."""

_PROBE = """
import json, logging, sys
from bridge.cli import main
at_ready = []
def snapshot(record):
    if record.getMessage() == "chatbridge ready":
        at_ready.extend(sys.modules)
    return True
logging.getLogger("bridge.service").addFilter(snapshot)
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules), "at_ready": sorted(at_ready)}))
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}


def probe(*args: str, cwd: Path, at_ready: bool = False) -> tuple[int, set[str]]:
    """Run ``chatbridge ARGS`` in a child interpreter; its exit code and every module it loaded
    (``at_ready``: by the time it logged "chatbridge ready")."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    modules = report["at_ready" if at_ready else "modules"]
    return report["code"], {name.partition(".")[0] for name in modules}


def chatbridge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env=clean_env(),
        check=False,
    )


def assert_one_clear_line(
    result: subprocess.CompletedProcess[str], *needles: str, logger: str = ""
) -> None:
    """Exit 1, no traceback, no "ready", one ERROR line (of ``logger``) with ``needles``."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "chatbridge ready" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if f" ERROR {logger}" in line]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0]


def test_console_start_imports_only_what_it_uses_before_ready(tmp_path: Path) -> None:
    # HTTP on, as in the embedded defaults: its server (aiohttp) is imported once ready.
    path = str(config(tmp_path, {"http": {"listen": "127.0.0.1:0"}}))
    # The first start creates the schema (Alembic is needed then, and only then).
    assert probe("run", "--config", path, cwd=tmp_path)[0] == 0
    code, loaded = probe("run", "--config", path, cwd=tmp_path, at_ready=True)
    assert code == 0
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    assert "sqlalchemy" in loaded  # the probe did reach the store


def test_cli_module_imports_almost_nothing(tmp_path: Path) -> None:
    """``--version`` and ``--help`` pay only for what ``import bridge.cli`` loads."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("main(sys.argv[1:])", "None")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = {m.partition(".")[0] for m in json.loads(result.stdout)["modules"]}
    assert loaded.isdisjoint({"pydantic", "sqlalchemy", "asyncio", *HEAVY})
    version = chatbridge("--version", cwd=tmp_path)
    assert version.returncode == 0
    # The package's own version, as installed (pyproject reads it from bridge/__init__.py).
    assert version.stdout.split() == ["chatbridge", metadata.version("chatbridge")]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_http_port_taken_is_one_line_naming_the_setting(tmp_path: Path, taken_port: int) -> None:
    path = config(tmp_path, {"http": {"listen": f"127.0.0.1:{taken_port}"}})
    result = chatbridge("run", "--config", str(path), cwd=tmp_path)
    assert_one_clear_line(result, "http.listen", str(taken_port), "in use")


def test_unwritable_database_path_is_one_line(tmp_path: Path) -> None:
    # Under a regular file: no directory can be made there, not even by root.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    url = f"sqlite+aiosqlite:///{blocker / 'bridge.db'}"
    path = config(tmp_path, {"database": {"url": url}})
    result = chatbridge("run", "--config", str(path), cwd=tmp_path)
    assert_one_clear_line(result, "database.url", f"{blocker} is not a directory")


def test_unknown_database_driver_is_a_configuration_error(tmp_path: Path) -> None:
    path = config(tmp_path, {"database": {"url": "mysql://root:hunter2@db/x"}})
    result = chatbridge("run", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "database.url" in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


def test_sqlite_file_problems_are_found_before_connecting(tmp_path: Path) -> None:
    from bridge.service import sqlite_file_problem

    def url(path: Path) -> str:
        return f"sqlite+aiosqlite:///{path}"

    assert sqlite_file_problem(url(tmp_path / "new.db")) is None
    assert sqlite_file_problem(url(tmp_path)) == f"{tmp_path} is a directory"
    missing = tmp_path / "missing" / "x.db"
    assert sqlite_file_problem(url(missing)) == (
        f"cannot create {missing}: {missing.parent} is not a directory"
    )
    assert sqlite_file_problem("sqlite+aiosqlite:///:memory:") is None
    assert sqlite_file_problem("postgresql+asyncpg://u@127.0.0.1/db") is None


def test_a_part_that_crashes_while_starting_is_one_line_naming_it(tmp_path: Path) -> None:
    """An exception no part expects (here from mkdir) fails the start-up like a setting's error.

    The task group used to re-raise it raw: a 45-line exception-group traceback.
    """
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    matrix = {
        # Never reached: the store directory is made before logging in.
        "homeserver": "http://127.0.0.1:9",
        "user_id": "@bot:localhost",
        "password": "hunter2",
        "store_path": str(blocker / "store"),
    }
    path = config(
        tmp_path,
        {
            "console": {"enabled": False},
            "matrix": matrix,
            "rooms": [{"transport": "matrix", "id": "!r:localhost"}],
        },
    )
    result = chatbridge("run", "--config", str(path), cwd=tmp_path)
    # The Matrix transport's state files log their own complaint when it is built.
    assert_one_clear_line(
        result, "transport-matrix failed to start", "Not a directory", logger="bridge:"
    )
    assert "hunter2" not in result.stderr


def test_a_database_newer_than_the_code_is_one_line_for_run_and_migrate(tmp_path: Path) -> None:
    """After a rollback of chatbridge to a version that does not know the schema."""
    database = tmp_path / "bridge.db"
    path = str(config(tmp_path))
    assert chatbridge("migrate", "--config", path, cwd=tmp_path).returncode == 0
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    for args in (("run", "--config", path), ("migrate", "--config", path)):
        result = chatbridge(*args, cwd=tmp_path)
        assert_one_clear_line(
            result, "database.url: the schema is at revision 9999, newer than this chatbridge"
        )


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A TCP port that accepts connections and never answers (a hung database)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.settimeout(60)
        yield sock


def test_ctrl_c_while_the_database_does_not_answer_is_a_clean_exit(
    tmp_path: Path, silent_server: socket.socket
) -> None:
    port = silent_server.getsockname()[1]
    url = f"postgresql+asyncpg://bob:hunter2@127.0.0.1:{port}/db"
    path = config(tmp_path, {"database": {"url": url}})
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge", "run", "--config", str(path)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    try:
        # Connected: the start-up now waits for the database's answer.
        connection, _ = silent_server.accept()
        with connection:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted while starting" in stderr
    assert "hunter2" not in stderr


def test_what_fails_every_run_is_a_warning_naming_the_setting(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    path = config(
        tmp_path,
        {
            "runner": {"claude_bin": str(tmp_path / "no-claude")},
            "rooms": [{"transport": "console", "id": "console", "cwd": str(not_a_directory)}],
        },
    )
    result = chatbridge("run", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    ready = next(n for n, line in enumerate(lines) if "chatbridge ready" in line)
    for needle in (
        f"WARNING bridge.service: runner.claude_bin = '{tmp_path / 'no-claude'}': not found",
        f"WARNING bridge.service: rooms[0].cwd = '{not_a_directory}': is not a directory",
    ):
        found = [n for n, line in enumerate(lines) if needle in line]
        assert len(found) == 1, result.stderr
        assert found[0] < ready
