"""An approval request as the store's approval tests record it."""

from __future__ import annotations

from bridge.core.model import RoomId, RoomKey, RunId, TransportName
from bridge.store.base import Approval, ApprovalAsk
from tests.store.conftest import InspectableStore

ROOM = RoomKey(TransportName("matrix"), RoomId("!a:localhost"))


RUN = RunId("run-1")


async def ask(
    store: InspectableStore,
    request_id: str,
    *,
    room: RoomKey = ROOM,
    run_id: RunId = RUN,
    asked_at: float = 100.0,
    expires_at: float = 1000.0,
    tool: str = "Bash",
    shown_digest: str = "",
) -> Approval:
    return await store.add_approval(
        ApprovalAsk(
            room,
            run_id,
            request_id,
            tool_name=tool,
            input_json='{"command": "ls"}',
            asked_at=asked_at,
            expires_at=expires_at,
            shown_digest=shown_digest,
        )
    )
