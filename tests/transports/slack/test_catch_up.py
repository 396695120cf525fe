"""Messages sent while chatbridge is down run once after it starts (issue 25).

Real Slack drops events sent while no connection is open; local-slack shows
the same (its events to a bridge that is down go nowhere). The service reads
what it missed from ``conversations.history`` / ``conversations.replies``
since the newest message it saw there, and hands that over through the
idempotent inbox: run once, in order, however the bridge went down and
whatever Slack delivers again.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.transports.slack import peer
from tests.transports.slack.events import signed
from tests.transports.slack.service import ECHO, Bridged, answers, bridged, wait_for_answers

pytestmark = [pytest.mark.slack, pytest.mark.slow]


def prompts(times: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in times.read_text().splitlines()]


async def stop(b: Bridged, how: signal.Signals) -> None:
    b.process.send_signal(how)
    await b.process.wait()


async def redeliver(b: Bridged, since: int) -> int:
    """Events mode: POST again (signed, as Slack's retries) every event local-slack tried to
    deliver after its log's first ``since`` entries; how many."""
    bodies = [e["detail"] for e in (await b.slack.log())[since:] if e["direction"] == "to_bot"]
    url = f"http://127.0.0.1:{b.slack.events_port}/slack/events"
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            headers = {**signed(body), "X-Slack-Retry-Num": "3", "X-Slack-Retry-Reason": "timeout"}
            async with http.post(url, data=body, headers=headers) as r:
                assert r.status == 200
    return len(bodies)


@pytest.mark.parametrize("mode", ["socket", "events"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill9"])
async def test_messages_sent_while_the_bridge_was_down_run_once_after_it_starts(
    tmp_path: Path, mode: str, how: signal.Signals
) -> None:
    times = tmp_path / "times"
    env = {**ECHO, "FAKE_CLAUDE_TIMES": str(times)}
    async with bridged(tmp_path, mode, env) as b:
        first = await b.slack.post_message(peer.ALICE, "before the stop")
        await wait_for_answers(b, 1)
        await b.wait_for_reaction(first, "white_check_mark")
        await stop(b, how)
        logged = len(await b.slack.log())
        # Posted while nothing listens: a channel message, a reply in the answered
        # thread, a stranger's message and another bot's (neither may run).
        await b.slack.post_message(peer.ALICE, "while down, in the channel")
        await b.slack.post_message(peer.BOB, "a stranger while down")
        await b.slack.post_message(peer.OTHER_BOT, "another bot while down")
        await b.slack.post_message(peer.ALICE, "while down, in the thread", thread_ts=first)
        async with b.restarted() as again:
            await wait_for_answers(again, 2)
            if mode == "events":
                # Slack's own retries of the events sent while down, after the catch-up.
                assert await redeliver(again, logged) >= 4
            # A later message: once it is answered, a second run of a missed one would be there.
            later = await again.slack.post_message(peer.ALICE, "after the start")
            await wait_for_answers(again, 3)
            await again.wait_for_reaction(later, "white_check_mark")
            # Started once more: nothing new to catch up, nothing runs again.
            await stop(again, signal.SIGTERM)
            async with again.restarted() as third:
                last = await third.slack.post_message(peer.ALICE, "the last one")
                await wait_for_answers(third, 4)
                await third.wait_for_reaction(last, "white_check_mark")
                found = await answers(third)
    runs = prompts(times)
    assert runs[0] == "before the stop", runs
    assert runs[-2:] == ["after the start", "the last one"], runs
    # The missed messages ran once each, in the order they were sent (in one run or two).
    missed = "\n".join(runs[1:-2])
    assert missed.count("while down, in the channel") == 1, runs
    assert missed.count("while down, in the thread") == 1, runs
    assert missed.index("while down, in the channel") < missed.index("while down, in the thread")
    assert "stranger" not in missed
    assert "another bot" not in missed
    assert len(found) == len(runs)


async def test_in_a_thread_room_missed_replies_continue_their_threads(tmp_path: Path) -> None:
    times = tmp_path / "times"
    env = {**ECHO, "FAKE_CLAUDE_TIMES": str(times)}
    async with bridged(tmp_path, "socket", env, room_extra={"conversation": "thread"}) as b:
        first = await b.slack.post_message(peer.ALICE, "thread one")
        await wait_for_answers(b, 1)
        await b.wait_for_reaction(first, "white_check_mark")
        await stop(b, signal.SIGKILL)
        await b.slack.post_message(peer.ALICE, "more for thread one", thread_ts=first)
        second = await b.slack.post_message(peer.ALICE, "thread two")
        async with b.restarted() as again:
            await wait_for_answers(again, 3)
            await again.wait_for_reaction(second, "white_check_mark")
            found = await answers(again)
    runs = prompts(times)
    assert sorted(runs) == sorted(["thread one", "more for thread one", "thread two"])
    by_thread = {str(m["thread_ts"]): str(m["text"]) for m in found}
    assert "thread two" in by_thread[second]
    assert "more for thread one" in [str(m["text"]) for m in found if m["thread_ts"] == first][-1]
