"""A Matrix transport in a process of its own that kills itself at a chosen step.

``python -m tests.transports.matrix.crash_child URL STORE RECORD STEP FINAL``: syncs from
the homeserver at URL with its state under STORE. Its sink stands in for the
service: it records each message's text durably (append, fsync) in RECORD.
STEP names where the process dies by SIGKILL, as in a power cut, with no
clean-up of any kind:

- ``accepting:TEXT``: when the sink is handed TEXT, before recording it;
- ``accepted:TEXT``: right after TEXT is recorded;
- ``saving:N``: as the N-th write of the sync position (1, 2, ...) begins;
- ``saved:N``: right after the N-th write (which positions are written
  depends on timing: positions noted during a write are coalesced);
- ``none``: no crash.

The process exits with status 0 once position FINAL is saved (at once if it
already was).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from bridge.core.model import InboundMessage, RoomId
from bridge.core.transport import Accepted, InboundEvent, RoomBinding
from transports.backoff import Backoff
from transports.matrix import MatrixSettings, MatrixTransport
from transports.matrix.state import SyncPosition

ROOM = "!room:stub"


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, store: Path, record: Path, step: str, final: str) -> None:
    position = store / "sync_position"
    if position.exists() and position.read_text() == final:
        # A crash right after saving FINAL (saves coalesce, so the last write
        # may be FINAL itself): there is nothing left to sync, and syncing from
        # FINAL would wait forever for a next save.
        return
    save = SyncPosition.save
    writes = 0

    def saving(self: SyncPosition, token: str) -> None:
        nonlocal writes
        writes += 1
        if step == f"saving:{writes}":
            die()
        save(self, token)
        if step == f"saved:{writes}":
            die()
        if token == final:
            os._exit(0)

    SyncPosition.save = saving  # type: ignore[method-assign]

    async def sink(event: InboundEvent) -> Accepted:
        assert isinstance(event, InboundMessage)
        if step == f"accepting:{event.text}":
            die()
        with record.open("a", encoding="utf-8") as f:
            f.write(event.text + "\n")
            f.flush()
            os.fsync(f.fileno())
        if step == f"accepted:{event.text}":
            die()
        return Accepted.ACCEPTED

    settings = MatrixSettings.model_validate(
        {"homeserver": url, "user_id": "@bot:stub", "access_token": "stub", "store_path": store}
    )
    transport = MatrixTransport(
        settings, [RoomBinding(RoomId(ROOM))], backoff=Backoff(base=0.01, cap=0.02)
    )
    await transport.run(sink, asyncio.Event())


if __name__ == "__main__":
    url, store, record, step, final = sys.argv[1:6]
    asyncio.run(main(url, Path(store), Path(record), step, final))
