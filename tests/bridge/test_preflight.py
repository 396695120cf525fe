"""Start-up warnings about what would fail every run: the claude binary, the rooms' cwd."""

from __future__ import annotations

import os
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.host.preflight import run_problems
from tests.config_files import Table, write_toml
from tests.fakes.fake_claude import FAKE_CLAUDE

MATRIX = {"homeserver": "http://127.0.0.1:9", "user_id": "@bot:localhost", "password": "x"}


def settings(tmp_path: Path, table: Table) -> Settings:
    return load_settings(write_toml(tmp_path / "chatbridge.toml", table))


def fake_binary(directory: Path, name: str) -> Path:
    """A claude that answers --version, unless chatbridge's own settings reach it."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(
        "#!/bin/sh\n"
        'if env | grep -q "^CHATBRIDGE_"; then echo "got chatbridge settings" >&2; exit 1; fi\n'
        "echo '2.1.0 (Claude Code)'\n"
    )
    path.chmod(0o755)
    return path


def test_a_usable_setup_has_no_problems(tmp_path: Path) -> None:
    config = settings(
        tmp_path, {"runner": {"claude_bin": FAKE_CLAUDE}, "defaults": {"cwd": tmp_path}}
    )
    assert run_problems(config, os.environ) == []


def test_the_probe_gets_none_of_chatbridges_own_settings(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "bin", "claude")
    config = settings(
        tmp_path, {"runner": {"claude_bin": str(binary)}, "defaults": {"cwd": tmp_path}}
    )
    env = {**os.environ, "CHATBRIDGE_MATRIX__PASSWORD": "hunter2"}
    assert run_problems(config, env) == []


def test_the_binary_is_looked_up_on_each_rooms_path(tmp_path: Path) -> None:
    fake_binary(tmp_path / "bin", "claude-here")
    config = settings(
        tmp_path,
        {
            "runner": {"claude_bin": "claude-here"},
            "defaults": {"cwd": tmp_path},
            "console": {"enabled": True},
            "matrix": MATRIX,
            "rooms": [
                {"transport": "matrix", "id": "!a:x", "env": {"PATH": str(tmp_path / "bin")}},
                {"transport": "matrix", "id": "!b:x"},
            ],
        },
    )
    assert run_problems(config, {"PATH": "/nonexistent"}) == [
        "runner.claude_bin = 'claude-here': not found (not an executable, nor on PATH)"
        " (PATH of rooms console:console, matrix:!b:x): runs will fail"
    ]


def test_each_cwd_problem_names_the_setting_it_comes_from(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    a_file = tmp_path / "file"
    a_file.write_text("")
    config = settings(
        tmp_path,
        {
            "runner": {"claude_bin": FAKE_CLAUDE},
            "defaults": {"cwd": missing},
            "matrix": MATRIX,
            "rooms": [
                {"transport": "matrix", "id": "!a:x"},
                {"transport": "matrix", "id": "!b:x", "cwd": str(a_file)},
                {"transport": "matrix", "id": "!c:x"},
                {"transport": "matrix", "id": "!d:x", "cwd": str(tmp_path)},
            ],
        },
    )
    assert run_problems(config, os.environ) == [
        f"defaults.cwd = '{missing}': does not exist; runs in matrix:!a:x, matrix:!c:x will fail",
        f"rooms[1].cwd = '{a_file}': is not a directory; runs in matrix:!b:x will fail",
    ]
