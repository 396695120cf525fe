"""First-run checks: the claude binary and version check-config names, the credentials warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.claude_check import check_binary, credentials_source
from tests.bridge.harness import write_config as config
from tests.fakes.fake_claude import FAKE_CLAUDE, FAKE_VERSION


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def test_no_key_and_no_login_is_no_credentials(home: Path) -> None:
    assert credentials_source({"HOME": str(home), "ANTHROPIC_API_KEY": ""}) is None


@pytest.mark.parametrize("name", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"])
def test_a_key_in_the_environment_counts(home: Path, name: str) -> None:
    assert credentials_source({"HOME": str(home), name: "sk-x"}) == f"${name}"


def test_a_login_under_home_counts(home: Path) -> None:
    (home / ".claude").mkdir()
    creds = home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": "t"}}))
    assert credentials_source({"HOME": str(home)}) == str(creds)


def test_a_login_under_claude_config_dir_counts(home: Path, tmp_path: Path) -> None:
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    (config_dir / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": "a"}}))
    env = {"HOME": str(home), "CLAUDE_CONFIG_DIR": str(config_dir)}
    assert credentials_source(env) == str(config_dir / ".claude.json")


def test_home_login_is_not_used_with_another_config_dir(home: Path, tmp_path: Path) -> None:
    # ~/.claude.json is not where claude looks once CLAUDE_CONFIG_DIR is set.
    (home / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": "a"}}))
    assert credentials_source({"HOME": str(home)}) == str(home / ".claude.json")
    empty = tmp_path / "empty-config"
    empty.mkdir()
    assert credentials_source({"HOME": str(home), "CLAUDE_CONFIG_DIR": str(empty)}) is None


def test_unreadable_or_empty_files_are_no_login(home: Path) -> None:
    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text("not json")
    (home / ".claude.json").write_text(json.dumps({"numStartups": 3}))
    assert credentials_source({"HOME": str(home)}) is None


def test_binary_found_on_path_with_its_version() -> None:
    # The fake is a script: its interpreter must stay findable too.
    path = f"{FAKE_CLAUDE.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    binary = check_binary(FAKE_CLAUDE.name, {"PATH": path})
    assert binary.problem is None
    assert binary.path == str(FAKE_CLAUDE)
    assert binary.version == FAKE_VERSION


def test_missing_binary_names_the_setting(tmp_path: Path) -> None:
    binary = check_binary("no-such-claude", {"PATH": str(tmp_path)})
    assert binary.path is None
    assert binary.describe().startswith("runner.claude_bin = 'no-such-claude': not found")


def test_binary_that_fails_version_is_a_problem(tmp_path: Path) -> None:
    broken = tmp_path / "claude"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    binary = check_binary(str(broken), {"PATH": ""})
    assert binary.problem == f"{broken} --version failed: cannot start"


def run_chatbridge(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CHATBRIDGE_", "ANTHROPIC_"))}
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**clean, **env},
        check=False,
    )


@pytest.mark.slow
def test_check_config_names_binary_and_version(tmp_path: Path, home: Path) -> None:
    path = config(tmp_path)
    result = run_chatbridge(
        "check-config", "--config", str(path), env={"HOME": str(home)}, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert f"claude: {FAKE_CLAUDE}, version {FAKE_VERSION}" in result.stderr
    assert "warning: claude has no credentials" in result.stderr
    json.loads(result.stdout)  # stdout stays the configuration alone


@pytest.mark.slow
def test_check_config_fails_when_claude_is_missing(tmp_path: Path, home: Path) -> None:
    path = config(tmp_path, {"runner": {"claude_bin": str(tmp_path / "nowhere" / "claude")}})
    result = run_chatbridge(
        "check-config", "--config", str(path), env={"HOME": str(home)}, cwd=tmp_path
    )
    assert result.returncode == 1
    assert "runner.claude_bin" in result.stderr
    assert "not found" in result.stderr


@pytest.mark.slow
def test_run_warns_without_credentials_and_still_starts(tmp_path: Path, home: Path) -> None:
    path = config(tmp_path)
    bare = run_chatbridge("run", "--config", str(path), env={"HOME": str(home)}, cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert "WARNING" in bare.stderr
    assert "claude has no credentials" in bare.stderr
    assert "chatbridge ready" in bare.stderr
    keyed = run_chatbridge(
        "run",
        "--config",
        str(path),
        env={"HOME": str(home), "ANTHROPIC_API_KEY": "sk-x"},
        cwd=tmp_path,
    )
    assert keyed.returncode == 0, keyed.stderr
    assert "no credentials" not in keyed.stderr
    assert "sk-x" not in keyed.stderr
