"""The console posts an approval request with how to answer it by command."""

from __future__ import annotations

import io

from bridge.core.model import ExternalMessageId, Reply, ReplyKind
from transports.console import ConsoleTransport


async def test_an_approval_request_names_the_commands_that_answer_it() -> None:
    out = io.StringIO()
    console = ConsoleTransport("console", "me", stdin=io.BytesIO(), stdout=out, command_prefix="/")
    request = Reply(console.room, "Claude wants to run `Bash`: ls", ReplyKind.RESULT)
    sent = await console.post_approval(request, "#3")
    assert sent == ExternalMessageId("out-1")
    assert out.getvalue().splitlines() == [
        "* Claude wants to run `Bash`: ls",
        "* Answer with `/approve #3`, `/approve session #3` or `/deny #3 [reason]`.",
    ]
    # Closing it prints the outcome (the default: an edit of the request).
    await console.close_approval(console.room, sent, "✅ allowed by me")
    assert out.getvalue().splitlines()[-1] == "· ✅ allowed by me"
