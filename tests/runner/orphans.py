"""A script that leaves orphans behind, some ignoring SIGTERM."""

from __future__ import annotations

import asyncio
import os
import sys

from bridge.core.model import RunId
from runner import MARKER_ENV

IGNORES_TERM = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); os.close(1); time.sleep(300)"
)


async def leave_orphans(run_id: RunId) -> list[int]:
    """Start, as a crashed run would leave them, a sleeper and a TERM-ignoring process.

    A shell starts both in the background and exits, so they are orphans in
    their own session, not children of the test.
    """
    shell = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        'sleep 300 >/dev/null & echo "$!"; "$PY" -c "$CODE" & echo "$!"',
        env={**os.environ, MARKER_ENV: run_id, "PY": sys.executable, "CODE": IGNORES_TERM},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert shell.stdout is not None
    pids = [int(await shell.stdout.readline()), int(await shell.stdout.readline())]
    assert await shell.stdout.readline() == b"ready\n"  # the TERM handler is in place
    assert await shell.stdout.read() == b""  # nothing holds the pipe any more
    assert await shell.wait() == 0
    return pids
