"""Git repositories for the worktree tests, and the notices a room was sent."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bridge.core.model import ReplyKind
from tests.bridge.chat_room import ChatRoom

AT_ONCE = {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 1}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "README").write_text("hello\n")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def notices(chat: ChatRoom) -> list[str]:
    return chat.texts(ReplyKind.NOTICE)
