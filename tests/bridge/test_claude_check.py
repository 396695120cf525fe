"""First-run checks: the claude binary and version check-config names, the credentials warning."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.host.claude_check import (
    VERSION_SHOWN,
    check_binary,
    credentials_source,
    shown_line,
    switched_on,
)
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


# claude 2.1.330's provider switches, by the names its code reads.
SWITCHES = (
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "CLAUDE_CODE_USE_ANTHROPIC_GOOGLE_CLOUD",
    "CLAUDE_CODE_USE_MANTLE",
    "CLAUDE_CODE_USE_GATEWAY",
)
# claude turns a switch on for "1", "true", "yes", "on" (trimmed, any case), and nothing else.
ON = ("1", "true", "TRUE", " yes ", "On")
OFF = ("", "0", "false", "no", "off", "2", "enabled", "y")


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ON)
def test_a_provider_switch_turned_on_counts(home: Path, name: str, value: str) -> None:
    assert credentials_source({"HOME": str(home), name: value}) == f"${name}"


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", OFF)
def test_a_provider_switch_claude_reads_as_off_is_no_credentials(
    home: Path, name: str, value: str
) -> None:
    assert credentials_source({"HOME": str(home), name: value}) is None


@pytest.mark.parametrize(
    ("value", "counts"),
    [("0", False), ("false", False), ("1", True), ("yes", True), (True, True), (False, False)],
)
def test_a_provider_switch_in_settings_env_is_read_as_claude_reads_it(
    home: Path, value: object, counts: bool
) -> None:
    (home / ".claude").mkdir()
    settings = home / ".claude" / "settings.json"
    settings.write_text(json.dumps({"env": {"CLAUDE_CODE_USE_BEDROCK": value}}))
    assert credentials_source({"HOME": str(home)}) == (str(settings) if counts else None)


def test_switched_on_follows_claude() -> None:
    assert [switched_on(v) for v in (*ON, True, 1)] == [True] * (len(ON) + 2)
    assert [switched_on(v) for v in (*OFF, None, False, 0)] == [False] * (len(OFF) + 3)


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


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def assert_ended(pid_file: Path) -> None:
    """The process whose pid ``pid_file`` holds has ended (waiting on its pidfd, not a clock)."""
    pid = int(pid_file.read_text())
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # SIGKILL was sent before check_binary returned; the exit follows promptly.
        assert select.select([fd], [], [], 10)[0], f"process {pid} still running"
    finally:
        os.close(fd)


def test_the_real_claude_looks_like_claude_code() -> None:
    real = Path(sys.executable).parent / "claude"
    if not real.is_file():
        pytest.skip(f"no claude binary at {real}")
    binary = check_binary(str(real), {"PATH": os.environ.get("PATH", "")})
    assert binary.problem is None
    assert binary.looks_like_claude, binary.version
    assert binary.describe() == f"claude: {real}, version {binary.version}"


def test_a_hung_binary_is_killed_with_its_children(tmp_path: Path) -> None:
    hang = script(tmp_path, "claude", f"sleep 300 & echo $! > {tmp_path}/child; exec sleep 300")
    binary = check_binary(str(hang), {"PATH": "/usr/bin:/bin"}, timeout_s=0.5)
    assert binary.problem == f"{hang} --version gave no answer in 0.5s"
    assert_ended(tmp_path / "child")


def test_a_child_left_behind_is_killed_and_does_not_hold_up_the_answer(tmp_path: Path) -> None:
    # The child inherits stdout: waiting for its end of the pipe would wait for the child.
    body = f'sleep 300 & echo $! > {tmp_path}/child; echo "2.1.0 (Claude Code)"'
    binary = check_binary(str(script(tmp_path, "claude", body)), {"PATH": "/usr/bin:/bin"}, 60)
    assert binary.problem is None
    assert binary.version == "2.1.0 (Claude Code)"
    assert_ended(tmp_path / "child")


@pytest.mark.parametrize(
    "body",
    [
        'head -c 3000000 /dev/zero | tr "\\0" x',  # 3 MB on one line
        "exec yes 2.1.0",  # endless: cut short, not waited for
    ],
)
def test_a_flood_is_cut_short_and_shown_bounded(tmp_path: Path, body: str) -> None:
    binary = check_binary(str(script(tmp_path, "claude", body)), {"PATH": "/usr/bin:/bin"}, 60)
    assert binary.problem is None
    assert binary.version is not None
    assert len(binary.version) <= VERSION_SHOWN
    assert not binary.looks_like_claude
    assert "does not look like Claude Code's version" in binary.describe()


def test_terminal_escapes_never_reach_the_operator(tmp_path: Path) -> None:
    esc = script(tmp_path, "claude", r"printf '\033[2J\033]0;pwned\007 2.1.0 (Claude Code)\r\n'")
    binary = check_binary(str(esc), {"PATH": "/usr/bin:/bin"})
    assert binary.version == "2.1.0 (Claude Code)"
    assert binary.looks_like_claude
    failing = script(tmp_path, "failing", r"printf '\033[31mbroken\033[0m\a\n' >&2; exit 2")
    assert check_binary(str(failing), {}).problem == f"{failing} --version failed: broken"


def test_a_version_unlike_claude_codes_is_pointed_out(tmp_path: Path) -> None:
    other = script(tmp_path, "claude", "echo 1.0")
    binary = check_binary(str(other), {"PATH": "/usr/bin:/bin"})
    assert binary.problem is None
    assert binary.describe() == (
        f"claude: {other}, version '1.0': this does not look like Claude Code's version"
        " (such as '2.1.330 (Claude Code)'); check runner.claude_bin"
    )


def test_shown_line_is_the_first_line_printable_and_bounded() -> None:
    assert shown_line(b"\n\n  2.1.330 (Claude Code)\nmore\n") == "2.1.330 (Claude Code)"
    # Bidirectional overrides and other format characters go too.
    assert shown_line("a\u202eb\x00c\x7f\x9bd".encode()) == "abcd"
    assert shown_line(b"\x1bc\x1b(Bok") == "ok"  # two-byte escapes (reset, charset)
    assert shown_line(b"\xff\xfe") == "\ufffd\ufffd"
    long = shown_line(b"y" * 1000)
    assert len(long) == VERSION_SHOWN
    assert long.endswith("\u2026")
    assert shown_line(b"") == ""


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


@pytest.mark.slow
def test_check_config_prints_no_escape_of_the_binary(tmp_path: Path, home: Path) -> None:
    esc = script(tmp_path, "claude", r"printf '\033[2J\033]0;pwned\007 1.0\n'")
    path = config(tmp_path, {"runner": {"claude_bin": str(esc)}})
    result = run_chatbridge(
        "check-config", "--config", str(path), env={"HOME": str(home)}, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stderr
    assert "\x07" not in result.stderr
    assert f"claude: {esc}, version '1.0': this does not look like" in result.stderr
