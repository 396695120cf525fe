"""Start-up of the real ``chatbridge``: what it imports, how a part that cannot start fails.

A part that cannot start is one line naming its setting and exit status 1,
never a traceback, and "chatbridge ready" is not logged before it.
"""

from __future__ import annotations

import json
import os
import socket
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
import json, sys
from bridge.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}


def probe(*args: str, cwd: Path) -> tuple[int, set[str]]:
    """Run ``chatbridge ARGS`` in a child interpreter; its exit code and every module it loaded."""
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
    return report["code"], {name.partition(".")[0] for name in report["modules"]}


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


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "chatbridge ready" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0]


def test_console_start_imports_only_what_it_uses(tmp_path: Path) -> None:
    # HTTP on, as in the embedded defaults: its listener needs no aiohttp.
    path = str(config(tmp_path, {"http": {"listen": "127.0.0.1:0"}}))
    # The first start creates the schema (Alembic is needed then, and only then).
    assert probe("run", "--config", path, cwd=tmp_path)[0] == 0
    code, loaded = probe("run", "--config", path, cwd=tmp_path)
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
