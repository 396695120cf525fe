"""Approval requests as local-slack shows them: buttons, ephemerals and waits."""

from __future__ import annotations

from typing import Any

from tests.transports.slack.service import Bridged

APPROVING = {"defaults": {"approve_tools": True}}


async def requests(b: Bridged) -> list[dict[str, Any]]:
    """The bot's approval requests (open or closed), oldest first."""
    return [
        m
        for m in await b.results()
        if str(m.get("text")).startswith(("Claude asks to use", "Request `#"))
    ]


def buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The message's approval buttons by choice (allow, allow_session, deny); none once closed."""
    found = {}
    for block in message.get("blocks") or ():
        if block["type"] == "actions":
            for element in block["elements"]:
                choice = element["action_id"].removeprefix("chatbridge_approval_")
                found[choice] = {**element, "block_id": block.get("block_id")}
    return found


async def wait_for_request(b: Bridged, count: int) -> dict[str, Any]:
    async def asked() -> bool:
        return len(await requests(b)) >= count

    await b.wait_until(asked, f"approval request {count}")
    return (await requests(b))[count - 1]


async def message(b: Bridged, ts: str) -> dict[str, Any]:
    [found] = [m for m in await b.slack.messages() if m["ts"] == ts]
    return found


async def wait_closed(b: Bridged, ts: str, outcome: str) -> dict[str, Any]:
    async def closed() -> bool:
        m = await message(b, ts)
        return not buttons(m) and outcome in str(m.get("text"))

    await b.wait_until(closed, f"request {ts} closed as {outcome}")
    return await message(b, ts)


async def wait_for_ephemeral(b: Bridged, user: str, text: str) -> None:
    """A message of the bot that only ``user`` sees, saying ``text``."""

    async def told() -> bool:
        return any(
            m.get("subtype") == "ephemeral" and m.get("ephemeral_to") == user and text in m["text"]
            for m in await b.slack.messages()
        )

    await b.wait_until(told, f"{user} told {text!r}")


async def wait_for_answer(b: Bridged, prompt: str) -> None:
    async def answered() -> bool:
        return any(
            prompt in str(m.get("text")) and "Claude asks" not in str(m.get("text"))
            for m in await b.results()
        )

    await b.wait_until(answered, f"the answer to {prompt!r}")
