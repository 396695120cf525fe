"""An assistant app's thread status line as its sign of life and run phases
(``[slack] assistant``; docs/live-runs.md, "A sign of life"). local-slack has no assistant
threads, so Slack's side is the project's stand-in (fake_slack.py)."""

from __future__ import annotations

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName
from bridge.core.transport import RoomBinding, RunPhase
from tests.transports.slack.fake_slack import fake_slack
from transports.slack.outbound import SlackOutbound
from transports.slack.settings import SlackSettings
from transports.slack.web import web_client

THREAD = RoomKey(TransportName("slack"), RoomId("D0ALICE"), "1700000000.000100")
MESSAGE = (ExternalMessageId("1700000001.000200"),)


def outbound(api_url: str, *, assistant: bool) -> SlackOutbound:
    rooms = {RoomId("D0ALICE"): RoomBinding(RoomId("D0ALICE"))}
    settings = SlackSettings(
        bot_token="xoxb-test",
        app_token="xapp-test",
        api_url=api_url,
        message_limit=4000,
        upload_threshold=12000,
        assistant=assistant,
    )
    return SlackOutbound(web_client("xoxb-test", api_url), rooms, settings)


async def test_an_assistant_thread_shows_its_phases_in_its_status_line_not_reactions() -> None:
    async with fake_slack() as fake:
        slack = outbound(fake.api_url, assistant=True)
        for phase in (RunPhase.RECEIVED, RunPhase.RUNNING, RunPhase.DONE):
            await slack.set_phase(THREAD, MESSAGE, phase)
        assert [(s["channel_id"], s["thread_ts"], s["status"]) for s in fake.statuses] == [
            ("D0ALICE", THREAD.thread, "is reading your message…"),
            ("D0ALICE", THREAD.thread, "is working on it…"),
            ("D0ALICE", THREAD.thread, ""),
        ]
        assert fake.calls_to("reactions.add") == 0


async def test_a_refused_status_line_falls_back_to_reactions_for_good() -> None:
    async with fake_slack() as fake:
        fake.errors["assistant.threads.setStatus"] = ["missing_scope"]
        slack = outbound(fake.api_url, assistant=True)
        await slack.set_phase(THREAD, MESSAGE, RunPhase.RECEIVED)
        await slack.set_phase(THREAD, MESSAGE, RunPhase.RUNNING)
        assert fake.calls_to("assistant.threads.setStatus") == 1
        assert fake.calls_to("reactions.add") == 2
        assert fake.calls_to("reactions.remove") == 1


async def test_without_assistant_or_outside_a_thread_phases_are_reactions() -> None:
    async with fake_slack() as fake:
        await outbound(fake.api_url, assistant=False).set_phase(THREAD, MESSAGE, RunPhase.RECEIVED)
        await outbound(fake.api_url, assistant=True).set_phase(
            THREAD.channel, MESSAGE, RunPhase.RECEIVED
        )
        assert fake.calls_to("assistant.threads.setStatus") == 0
        assert fake.calls_to("reactions.add") == 2
