"""git as a bounded child process, the runner the worktrees and change summaries share
(bridge/host/git.py), with real git."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.host.git import run_git


async def test_exit_code_and_output_with_errors_only_when_asked(tmp_path: Path) -> None:
    code, out = await run_git(tmp_path, "rev-parse", "HEAD", timeout_s=30)
    assert code != 0
    assert out == b""
    code, out = await run_git(
        tmp_path, "rev-parse", "HEAD", timeout_s=30, stderr=asyncio.subprocess.STDOUT
    )
    assert code != 0
    assert b"not a git repository" in out


async def test_env_is_added_to_the_environment(tmp_path: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "Ada Example", "GIT_AUTHOR_EMAIL": "ada@example.org"}
    code, out = await run_git(tmp_path, "var", "GIT_AUTHOR_IDENT", timeout_s=30, env=env)
    assert code == 0
    assert out.startswith(b"Ada Example <ada@example.org>")


async def test_output_over_the_limit_stops_git(tmp_path: Path) -> None:
    code, whole = await run_git(tmp_path, "--version", timeout_s=30)
    assert code == 0
    assert len(whole) > 5
    assert await run_git(tmp_path, "--version", timeout_s=30, limit=5) == (-1, whole[:6])
    assert await run_git(tmp_path, "--version", timeout_s=30, limit=len(whole)) == (0, whole)


async def test_a_git_that_cannot_start_or_hangs_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await run_git(tmp_path, "--version", timeout_s=30, env={"PATH": str(tmp_path)})
    # The alias's sleep does not hold git's output open, so git's end is the call's end.
    with pytest.raises(TimeoutError):
        await run_git(tmp_path, "-c", "alias.wait=!exec >/dev/null; sleep 5", "wait", timeout_s=0.1)
