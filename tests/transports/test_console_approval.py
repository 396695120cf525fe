"""The console posts an approval request as a notice; closing it prints the outcome."""

from __future__ import annotations

import io

from bridge.core.model import ExternalMessageId, Reply, ReplyKind
from transports.console import ConsoleTransport


async def test_an_approval_request_is_a_notice_and_closing_prints_the_outcome() -> None:
    out = io.StringIO()
    console = ConsoleTransport("console", "me", stdin=io.BytesIO(), stdout=out)
    request = Reply(console.room, "Claude wants to run `Bash`: ls", ReplyKind.RESULT)
    sent = await console.post_approval(request, "#3")
    assert sent == ExternalMessageId("out-1")
    assert out.getvalue().splitlines() == [
        "* Claude wants to run `Bash`: ls",
    ]
    # Closing it prints the outcome (the default: an edit of the request).
    await console.close_approval(console.room, sent, "✅ allowed by me")
    assert out.getvalue().splitlines()[-1] == "· ✅ allowed by me"
