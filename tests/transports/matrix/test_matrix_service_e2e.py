"""The whole bridge: ``chatbridge run`` with the fake claude, against the test Synapse.

Each service start costs a few seconds on a loaded machine, so related
behaviours share one start. Answers (``m.text`` from the bot) are told apart
from notices (command answers, progress), which are ``m.notice``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psutil
import pytest
from nio import MemoryDownloadResponse
from nio.crypto.attachments import decrypt_attachment

from tests.transports.matrix.matrix_helpers import Human, joined, message_from
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.seen import ALICE, ECHO, answer_in, notice_in, typing_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]


async def test_burst_is_one_run_and_strangers_start_nothing(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> None:
    room = await alice.create_room([bot.user_id, mallory.user.user_id])
    await mallory.join(room)
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO):
        await alice.wait_for(joined(bot.user_id, room))
        await mallory.send(room, "mallory was here")
        burst = [await alice.send(room, word) for word in ("alpha", "beta", "gamma")]
        first = await alice.wait_for(answer_in(bot, room))
        # A second message after the first answer: its own run, the barrier
        # after which a run for mallory would have shown up.
        await alice.send(room, "delta")
        await alice.wait_for_all(answer_in(bot, room), count=2)
        # Commands answer as notices in Matrix rooms, and start no run.
        await alice.send(room, "!help")
        await alice.wait_for(notice_in(bot, room, "stop the running run"))
        await alice.send(room, "!reset")
        await alice.wait_for(notice_in(bot, room, "new Claude session"))
    answers = [s for s in alice.seen if answer_in(bot, room)(s)]
    assert len(answers) == 2
    body = first.content["body"]
    assert all(word in body for word in ("alpha", "beta", "gamma"))
    assert "mallory" not in body
    assert first.content["m.relates_to"] == {"m.in_reply_to": {"event_id": burst[-1]}}
    assert "delta" in answers[1].content["body"]
    assert "alpha" not in answers[1].content["body"]


async def test_messages_during_a_run_make_one_follow_up_run(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    env = {**ECHO, "FAKE_CLAUDE_SLEEP": "2"}
    # No sign of life: the bot typing then means the run is active.
    quiet = {"sign_of_life": False}
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env, room_extra=quiet
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first task")
        await alice.wait_for(typing_in(bot, room, on=True))  # the run is active
        await alice.send(room, "second")
        await alice.send(room, "third")
        one, two = await alice.wait_for_all(answer_in(bot, room), count=2)
        await alice.wait_for(typing_in(bot, room, on=False))
    assert "first task" in one.content["body"]
    assert "second" not in one.content["body"]
    assert "second" in two.content["body"]
    assert "third" in two.content["body"]


async def test_stop_from_allowed_user_ends_the_process_tree_and_not_from_others(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> None:
    room = await alice.create_room([bot.user_id, mallory.user.user_id])
    await mallory.join(room)
    record = tmp_path / "claude.json"
    env = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_SLEEP": "60",
        "FAKE_CLAUDE_GRANDCHILD": "1",
        "FAKE_CLAUDE_RECORD": str(record),
    }
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "a long task")
        # The fake claude writes its record before any output, so once its
        # tool use shows as progress, the record is there.
        await alice.wait_for(notice_in(bot, room, "echo hello"))
        info = json.loads(record.read_text())
        tree = [psutil.Process(info["pid"]), *(psutil.Process(p) for p in info["children"])]
        await mallory.send(room, "!stop")
        # Commands are handled in arrival order: once alice's !status is
        # answered, mallory's !stop has been handled (ignored).
        await alice.send(room, "!status")
        status = await alice.wait_for(notice_in(bot, room, "waiting:"))
        assert "running" in status.content["body"].lower()
        assert all(p.is_running() for p in tree)
        await alice.send(room, "!stop")
        await alice.wait_for(notice_in(bot, room, "stopping the run"))
        _, alive = await asyncio.to_thread(psutil.wait_procs, tree, 15)
    assert alive == []
    assert not [s for s in alice.seen if answer_in(bot, room)(s)]


async def test_restart_replays_nothing_and_misses_nothing(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "one")
        await alice.wait_for(answer_in(bot, room))
    await alice.send(room, "two, sent while the bridge was down")
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO):
        await alice.wait_for_all(answer_in(bot, room), count=2)
        await alice.send(room, "three")
        await alice.wait_for_all(answer_in(bot, room), count=3)
    bodies = [s.content["body"] for s in alice.seen if answer_in(bot, room)(s)]
    assert len(bodies) == 3
    assert "one" in bodies[0]
    assert "two" in bodies[1]
    assert "one" not in bodies[1]
    assert "three" in bodies[2]


async def test_encrypted_room_and_long_markdown_answer(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id], encrypted=True)
    code = "```python\n" + "\n".join(f"print({i})  # some code" for i in range(80)) + "\n```"
    prose = "\n\n".join(f"Paragraph {i}: " + "words " * 40 for i in range(6))
    env = {
        "FAKE_CLAUDE_NO_TOOL": "1",
        "FAKE_CLAUDE_RESULT": f"# Answer\n\n{prose}\n\n{code}\n\nEnd.",
    }
    async with service(
        tmp_path,
        synapse,
        bot,
        room,
        allowed=(ALICE,),
        claude_env=env,
        matrix_extra={"max_event_chars": 1000},
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.sync()  # learn the bot's device before encrypting to it
        await alice.send(room, "explain, at length")
        await alice.wait_for(lambda s: answer_in(bot, room)(s) and "End." in s.content["body"])
    parts = [s for s in alice.seen if answer_in(bot, room)(s)]
    assert len(parts) > 3
    assert all(getattr(p.event, "decrypted", False) for p in parts)
    assert all(len(p.content["body"]) <= 1000 for p in parts)
    assert parts[0].content["body"].startswith("# Answer")
    assert "<h1>Answer</h1>" in parts[0].content["formatted_body"]
    code_parts = [p for p in parts if "```python" in p.content["body"]]
    assert len(code_parts) > 1
    assert all(p.content["body"].count("```") == 2 for p in code_parts)


async def test_bridge_recovers_when_synapse_restarts(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO) as svc:
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "before")
        await alice.wait_for(answer_in(bot, room))
        await alice.send(room, "just before the outage")
        await asyncio.to_thread(synapse.stop)
        await asyncio.to_thread(synapse.start)
        await alice.send(room, "after")
        await alice.wait_for(lambda s: answer_in(bot, room)(s) and "after" in s.content["body"])
        assert svc.process.returncode is None
    bodies = " ".join(s.content["body"] for s in alice.seen if answer_in(bot, room)(s))
    assert "just before the outage" in bodies


async def test_a_run_survives_a_crash_of_the_bridge_and_answers_once_in_its_room(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    other = await alice.create_room([bot.user_id])
    go = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(go), "FAKE_CLAUDE_TIMES": str(tmp_path / "times")}
    quiet = {"sign_of_life": False}  # the bot typing then means the run is registered
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env, room_extra=quiet
    ) as svc:
        await alice.wait_for(joined(bot.user_id, room))
        asked = await alice.send(room, "the long task")
        await alice.wait_for(typing_in(bot, room, on=True))  # registered, then shown
        svc.process.kill()
        await svc.process.wait()
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env):
        go.touch()
        answer = await alice.wait_for(answer_in(bot, room))
        # A later message: its answer is the barrier after which a second
        # answer to the first task would have shown up.
        await alice.send(room, "after the restart")
        await alice.wait_for_all(answer_in(bot, room), count=2)
    answers = [s for s in alice.seen if answer_in(bot, room)(s)]
    assert [("the long task" in a.content["body"]) for a in answers] == [True, False]
    assert answer.content["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    assert not [s for s in alice.seen if message_from(bot.user_id, other)(s)]
    # One claude process answered the first task: the one started before the crash.
    times = (tmp_path / "times").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in times]
    assert prompts == ["the long task", "after the restart"]


async def test_a_file_claude_sends_arrives_encrypted_before_the_answer(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    data = b"%PDF-1.4 not really\n" * 50
    (tmp_path / "report.pdf").write_bytes(data)
    env = {
        "FAKE_CLAUDE_NO_TOOL": "1",
        "FAKE_CLAUDE_RESULT": "Sent you the report.",
        "FAKE_CLAUDE_SEND_FILE": json.dumps({"path": "report.pdf", "comment": "The report."}),
    }
    room = await alice.create_room([bot.user_id], encrypted=True)
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.sync()
        asked = await alice.send(room, "send me the report")
        answer = await alice.wait_for(
            lambda s: answer_in(bot, room)(s) and s.content.get("body") == "Sent you the report."
        )
    from_bot = [s for s in alice.seen if message_from(bot.user_id, room)(s)]
    [file] = [s for s in from_bot if s.content.get("msgtype") == "m.file"]
    assert from_bot.index(file) < from_bot.index(answer)
    assert getattr(file.event, "decrypted", False)
    assert file.content["filename"] == "report.pdf"
    assert file.content["body"] == "The report."
    assert file.content["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    encrypted = file.content["file"]
    response = await alice.client.download(mxc=encrypted["url"])
    assert isinstance(response, MemoryDownloadResponse), response
    plain = decrypt_attachment(
        response.body, encrypted["key"]["k"], encrypted["hashes"]["sha256"], encrypted["iv"]
    )
    assert plain == data
