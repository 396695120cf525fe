"""Review 2: bridge.cluster.paused_holders must not kill a process that holds no lock on the
store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

from bridge.cluster import paused_holders
from bridge.cluster.paused_holders import stop_paused_holders
from runner.proctree import is_stopped
from tests.bridge.paused_holders import stopped


def _other_device(path: Path) -> str:
    """A device (as /proc/locks writes it) that is not ``path``'s."""
    dev = path.stat().st_dev
    return f"{(os.major(dev) + 1) % 256:02x}:{os.minor(dev):02x}"


async def test_a_lock_on_another_filesystems_file_with_the_stores_inode_number_is_not_the_stores(
    db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every replica holds a flock for its life (<state_dir>/lock). One that is stopped
    # for a moment (an operator's SIGSTOP, a debugger's breakpoint) while the leader
    # changes, and whose lock file lives on another filesystem (a tmpfs, a volume) under
    # the same inode number as the store's file, is taken for the store's lock holder
    # and killed: /proc/locks is matched by inode number alone.
    sleeper = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(600)"
    )
    try:
        await stopped(sleeper)
        locks = tmp_path / "locks"
        elsewhere = f"{_other_device(db)}:{db.stat().st_ino}"
        locks.write_text(f"1: FLOCK  ADVISORY  WRITE {sleeper.pid} {elsewhere} 0 EOF\n")
        real = paused_holders.lock_holders
        monkeypatch.setattr(paused_holders, "lock_holders", lambda paths: real(paths, locks))
        assert await stop_paused_holders([db], {sleeper.pid: time.time()}) == [], (
            "killed a replica holding no store lock"
        )
        assert sleeper.returncode is None
        assert is_stopped(sleeper.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            sleeper.kill()
        await sleeper.wait()
