"""The real ``chatbridge`` process, driven through the console transport."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bridge.harness import write_config as config
from tests.config_files import write_toml
from tests.fakes.fake_claude import FAKE_CLAUDE

pytestmark = pytest.mark.slow


def chatbridge(
    *args: str, stdin: str = "", cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=full_env,
        check=False,
    )


def test_version_and_help() -> None:
    result = chatbridge("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("chatbridge ")
    for sub in ("run", "check-config", "migrate"):
        result = chatbridge(sub, "--help")
        assert result.returncode == 0
        assert "--config" in result.stdout


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    write_toml(bad, {"runner": {"max_concurrent_runs": -1}})
    result = chatbridge("check-config", "--config", str(bad))
    assert result.returncode == 2
    assert "runner.max_concurrent_runs" in result.stderr
    result = chatbridge("run", "--config", str(bad))
    assert result.returncode == 2


def test_config_from_environment_variable(tmp_path: Path) -> None:
    path = config(tmp_path)
    result = chatbridge("check-config", env={"CHATBRIDGE_CONFIG": str(path)})
    assert result.returncode == 0, result.stderr
    effective = json.loads(result.stdout)
    assert effective["runner"]["claude_bin"] == str(FAKE_CLAUDE)
    # Room env values are secrets as far as the printout is concerned.
    assert effective["defaults"]["env"] == {"FAKE_CLAUDE_ECHO": "**********"}


def test_piped_message_is_answered_and_the_service_exits_0(tmp_path: Path) -> None:
    result = chatbridge("run", "--config", str(config(tmp_path)), stdin="hello $(whoami) `id`\n")
    assert result.returncode == 0, result.stderr
    # The fake echoes the prompt it got on stdin: verbatim, no shell involved.
    assert "hello $(whoami) `id`" in result.stdout.splitlines()


def test_end_of_input_on_dev_null_ends_the_service(tmp_path: Path) -> None:
    # asyncio accepts /dev/null as a pipe and then never reports its end:
    # the service used to wait forever (subprocess.run's timeout fails it).
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    with open(os.devnull, "rb") as devnull:
        result = subprocess.run(
            [sys.executable, "-m", "bridge", "run", "--config", str(config(tmp_path))],
            stdin=devnull,
            capture_output=True,
            text=True,
            timeout=60,
            env=full_env,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert "chatbridge stopped" in result.stderr


def test_unreachable_database_exits_1_with_a_clear_message(tmp_path: Path) -> None:
    unreachable = "postgresql+asyncpg://nobody:hunter2@127.0.0.1:1/none"
    path = config(tmp_path, {"database": {"url": unreachable}})
    result = chatbridge("run", "--config", str(path), stdin="hello\n")
    assert result.returncode == 1
    assert "database.url:" in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


def test_leaves_flattens_nested_groups() -> None:
    from bridge.cli import _leaves

    inner = ExceptionGroup("inner", [ValueError("a"), KeyError("b")])
    outer = ExceptionGroup("outer", [inner, TypeError("c")])
    assert [type(e) for e in _leaves(outer)] == [ValueError, KeyError, TypeError]
