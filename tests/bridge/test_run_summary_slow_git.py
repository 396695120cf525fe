"""A run's summary never holds up the run (bridge/runs/executor.py, docs/conversations.md
"What a run changed"): git that does not answer costs the run at most CHANGES_TIMEOUT_S
before claude gets the prompt, as it does before the answer."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bridge.config import load_settings
from tests.bridge.harness import ConsoleSession, write_config


async def test_a_git_that_hangs_does_not_hold_up_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_git = shutil.which("git")
    assert real_git is not None
    project = tmp_path / "proj"
    project.mkdir()
    subprocess.run([real_git, "init", "-q", str(project)], check=True)
    # A git whose `add` hangs (a huge untracked tree, a stuck network mount).
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "git").write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = add ] && exec sleep 3600; done\n'
        f'exec {real_git} "$@"\n'
    )
    (slow / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}:{os.environ['PATH']}")
    monkeypatch.setattr("bridge.runs.ending.CHANGES_TIMEOUT_S", 0.5)
    path = write_config(
        tmp_path, {"defaults": {"cwd": str(project)}}, env={"FAKE_CLAUDE_ECHO": "1"}
    )
    # git's own limit per command is 30 s: well past this.
    async with asyncio.timeout(20), ConsoleSession(load_settings(path)) as bridge:
        bridge.send("quick question")
        await bridge.wait_for("\nquick question\n")
