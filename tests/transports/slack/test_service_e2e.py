"""The whole bridge: ``chatbridge run`` with the fake claude, against local-slack.

Each test starts local-slack and the service (a few seconds on a loaded
machine), so related behaviours share one start.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest

from tests.transports.slack import peer
from tests.transports.slack.events import signed
from tests.transports.slack.service import ECHO, Bridged, answers, bridged, wait_for_answers

pytestmark = [pytest.mark.slack, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["socket", "events"])
async def test_a_burst_makes_one_run_and_strangers_start_nothing(tmp_path: Path, mode: str) -> None:
    async with bridged(tmp_path, mode, ECHO) as b:
        stranger = await b.slack.post_message(peer.BOB, "bob was here")
        batch = [await b.slack.post_message(peer.ALICE, t) for t in ("alpha", "beta", "gamma")]
        [answer] = await wait_for_answers(b, 1)
        for ts in batch:
            await b.wait_for_reaction(ts, "white_check_mark")
        stranger_reactions = await b.reactions(stranger)
    text = str(answer["text"])
    assert all(word in text for word in ("alpha", "beta", "gamma"))
    assert "bob was here" not in text
    assert answer["thread_ts"] == batch[0]  # the thread opens under the batch's first message
    assert stranger_reactions == []


async def test_messages_during_a_run_make_one_follow_up_run(tmp_path: Path) -> None:
    env = {**ECHO, "FAKE_CLAUDE_SLEEP": "2"}
    async with bridged(tmp_path, "socket", env) as b:
        first = await b.slack.post_message(peer.ALICE, "first task")
        await b.wait_for_reaction(first, "hourglass_flowing_sand")
        later = [await b.slack.post_message(peer.ALICE, t) for t in ("second", "third")]
        one, two = await wait_for_answers(b, 2)
        await b.wait_for_reaction(later[0], "white_check_mark")
        assert len(await answers(b)) == 2
    assert "first task" in str(one["text"])
    assert "second" not in str(one["text"])
    assert "second" in str(two["text"])
    assert "third" in str(two["text"])
    assert "first task" not in str(two["text"])


async def test_only_an_allowed_user_can_stop_a_run(tmp_path: Path) -> None:
    env = {**ECHO, "FAKE_CLAUDE_SLEEP": "60"}
    async with bridged(tmp_path, "socket", env) as b:
        task = await b.slack.post_message(peer.ALICE, "long task")
        await b.wait_for_reaction(task, "hourglass_flowing_sand")
        # The command is handled before the ack, so this is its full effect.
        await b.slack.post_message(peer.BOB, "!stop")
        assert await b.reactions(task) == ["hourglass_flowing_sand"]
        await b.slack.post_message(peer.ALICE, "!stop")
        await b.wait_for_reaction(task, "octagonal_sign")
        assert await b.reactions(task) == ["octagonal_sign"]
        assert await answers(b) == []


async def test_a_message_a_stop_dropped_in_its_window_is_shown_stopped_not_received(
    tmp_path: Path,
) -> None:
    window = {"dispatcher": {"coalesce_ms": 600_000, "max_wait_ms": 600_000}}
    async with bridged(tmp_path, "socket", ECHO, extra=window) as b:
        waiting = await b.slack.post_message(peer.ALICE, "never runs")
        await b.wait_for_reaction(waiting, "eyes")  # the sign of life
        await b.slack.post_message(peer.ALICE, "!stop")
        await b.wait_for_reaction(waiting, "octagonal_sign")
        assert await b.reactions(waiting) == ["octagonal_sign"]
        assert await answers(b) == []


async def test_a_long_answer_is_split_in_the_thread(tmp_path: Path) -> None:
    long_answer = "\n\n".join(f"Paragraph {i}. " + "word " * 60 for i in range(8))
    env = {"FAKE_CLAUDE_NO_TOOL": "1", "FAKE_CLAUDE_RESULT": long_answer}
    async with bridged(tmp_path, "socket", env, slack_extra={"message_limit": 500}) as b:
        ask = await b.slack.post_message(peer.ALICE, "write a lot")
        # Two paragraphs exceed the limit together: one message each.
        parts = await wait_for_answers(b, 8)
    assert len(parts) == 8
    assert all(p["thread_ts"] == ask for p in parts)
    assert all(len(str(p["text"])) <= 500 for p in parts)
    assert all(f"Paragraph {i}." in "".join(str(p["text"]) for p in parts) for i in range(8))


async def test_a_failing_claude_is_marked_failed(tmp_path: Path) -> None:
    async with bridged(tmp_path, "socket", {"FAKE_CLAUDE_EXIT": "3"}) as b:
        ask = await b.slack.post_message(peer.ALICE, "this will fail")
        await b.wait_for_reaction(ask, "x")
        assert await b.reactions(ask) == ["x"]


async def test_events_mode_redelivery_is_one_run_and_forgeries_are_refused(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path, "events", ECHO) as b:
        once = await b.slack.post_message(peer.ALICE, "only once")
        body = [e for e in await b.slack.log() if e["direction"] == "to_bot"][-1]["detail"]
        url = f"http://127.0.0.1:{b.slack.events_port}/slack/events"
        retry = {**signed(body), "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "timeout"}
        forged_body = json.loads(body)
        forged_body["event"].update(ts="1.000009", text="forged")
        forged = json.dumps(forged_body)
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body, headers=retry) as r:
                assert r.status == 200
            async with http.post(url, data=forged, headers=signed(forged, "wrong")) as r:
                assert r.status == 401
        await b.wait_for_reaction(once, "white_check_mark")
        await b.slack.post_message(peer.ALICE, "next one")
        first, second = await wait_for_answers(b, 2)
        assert len(await answers(b)) == 2
    assert "only once" in str(first["text"])
    assert "only once" not in str(second["text"])
    assert "forged" not in str(first["text"]) + str(second["text"])


async def test_commands_are_answered_in_the_channel(tmp_path: Path) -> None:
    async with bridged(tmp_path, "socket", {"FAKE_CLAUDE_EXIT": "3"}) as b:
        for count, command in enumerate(("!help", "!status", "!reset"), start=1):
            await b.slack.post_message(peer.ALICE, command)

            async def answered(count: int = count) -> bool:
                return len(await b.results()) >= count

            await b.wait_until(answered, f"an answer to {command}")
        failing = await b.slack.post_message(peer.ALICE, "fail please")
        await b.wait_for_reaction(failing, "x")
        await b.slack.post_message(peer.ALICE, "!retry")
        await b.wait_until(lambda: _started_twice(b), "the retried run")
        notices = [str(m["text"]) for m in await b.results()]
    assert "stop" in notices[0]  # !help names the commands
    assert len(notices) >= 4


async def _started_twice(b: Bridged) -> bool:
    return sum("room=slack:" in line and "run started" in line for line in b.log) >= 2


@pytest.mark.parametrize("mode", ["socket", "events"])
async def test_a_run_survives_a_crash_of_the_bridge_and_answers_once_in_its_thread(
    tmp_path: Path, mode: str
) -> None:
    go = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(go), "FAKE_CLAUDE_TIMES": str(tmp_path / "times")}
    async with bridged(tmp_path, mode, env) as b:
        task = await b.slack.post_message(peer.ALICE, "the long task")
        # The reaction comes once the run is registered: a restart finds it.
        await b.wait_for_reaction(task, "hourglass_flowing_sand")
        b.process.kill()
        await b.process.wait()
        async with b.restarted() as again:
            go.touch()
            [answer] = await wait_for_answers(again, 1)
            await again.wait_for_reaction(task, "white_check_mark")
            # A later task: once it is answered, a second answer to the first would be there.
            later = await again.slack.post_message(peer.ALICE, "after the restart")
            await wait_for_answers(again, 2)
            await again.wait_for_reaction(later, "white_check_mark")
            found = await answers(again)
    assert answer["thread_ts"] == task
    assert ["the long task" in str(m["text"]) for m in found] == [True, False]
    times = (tmp_path / "times").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in times] == ["the long task", "after the restart"]


async def test_a_shared_file_runs_with_the_file_in_its_inbox_and_the_sender_named(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path, "socket", ECHO) as b:
        await b.slack.share_file(peer.ALICE, "notes.txt", b"the notes")
        [answer] = await wait_for_answers(b, 1)
    text = str(answer["text"])
    assert f"({peer.ALICE}) shared files:" in text
    match = re.search(r'File "(\.chatbridge/inbox/run-[0-9a-f]+/notes\.txt)"', text)
    assert match is not None, text
    assert (tmp_path / match.group(1)).read_bytes() == b"the notes"


async def test_a_file_claude_sends_lands_in_the_thread_before_the_answer(tmp_path: Path) -> None:
    (tmp_path / "report.csv").write_text("a,b\n1,2\n")
    env = {
        "FAKE_CLAUDE_NO_TOOL": "1",
        "FAKE_CLAUDE_RESULT": "Sent you the report.",
        "FAKE_CLAUDE_SEND_FILE": json.dumps({"path": "report.csv", "comment": "The numbers."}),
    }
    async with bridged(tmp_path, "socket", env) as b:
        first = await b.slack.post_message(peer.ALICE, "send me the report")
        found = await wait_for_answers(b, 2)  # the file, then the answer
        answer = found[-1]
        posted = [m for m in await b.results() if m.get("thread_ts") == first]
    shared = [m for m in posted if m.get("files")]
    [message] = shared
    [file] = message["files"]
    assert file["name"] == "report.csv"
    assert file["size"] == len("a,b\n1,2\n")
    assert message["text"] == "The numbers."
    assert answer["text"] == "Sent you the report."
    assert float(str(message["ts"])) < float(str(answer["ts"]))  # the file first
