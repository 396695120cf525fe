"""git as a child process, bounded in time and, when asked, in output.

The worktrees (bridge/host/worktrees.py) and a run's change summary
(bridge/runs/changes.py) run git this way; each says in its own terms what a
git that cannot start or hangs means to it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path


async def run_git(
    cwd: Path,
    *args: str,
    timeout_s: float,
    stderr: int = asyncio.subprocess.DEVNULL,
    env: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> tuple[int, bytes]:
    """git's exit code and output (``stderr=asyncio.subprocess.STDOUT``: its errors too);
    ``env`` is added to this process's environment. With ``limit``, at most ``limit + 1``
    bytes are read (git is stopped there: its code is then -1).

    Raises OSError when git cannot start, TimeoutError when it runs longer than
    ``timeout_s``; git never outlives the call.
    """
    process = await asyncio.create_subprocess_exec(
        "git",
        "-C",
        str(cwd),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env=None if env is None else {**os.environ, **env},
    )
    try:
        async with asyncio.timeout(timeout_s):
            if limit is None:
                out, _ = await process.communicate()
            else:
                out = await _read_at_most(process, limit + 1)
                if len(out) > limit:
                    return -1, out
                await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return (-1 if process.returncode is None else process.returncode), out


async def _read_at_most(process: asyncio.subprocess.Process, n: int) -> bytes:
    if process.stdout is None:  # started with stdout=PIPE: always there
        return b""
    chunks: list[bytes] = []
    got = 0
    while got < n and (chunk := await process.stdout.read(min(n - got, 1 << 16))):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
