"""claude's questions and plans answered from Matrix, end to end: ``chatbridge run`` with the
real ``claude`` against the scripted model server, and the test Synapse
(docs/live-runs.md, "Questions and plans")."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.bridge.questions import SINGLE, asking, planning, told
from tests.fakes.model_server import ModelServer, claude_bin, claude_env
from tests.transports.matrix.matrix_helpers import Human, Seen, joined
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.reactions import react
from tests.transports.matrix.seen import ALICE, MALLORY, answer_to, edit_of, request_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [
    pytest.mark.synapse,
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


def real(tmp_path: Path, server: ModelServer, **defaults: object) -> dict[str, object]:
    return {
        "runner": {"claude_bin": str(claude_bin())},
        "defaults": {
            "approve_tools": True,
            "env": claude_env(server.url, tmp_path / "home"),
            **defaults,
        },
    }


@contextlib.asynccontextmanager
async def asked(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> AsyncIterator[tuple[ModelServer, str, Seen]]:
    """Alice's run asks SINGLE: the model server, the room, the question's event."""
    room = await alice.create_room([bot.user_id])
    async with (
        ModelServer(asking(SINGLE)) as server,
        service(tmp_path, synapse, bot, room, allowed=(ALICE,), extra=real(tmp_path, server)),
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "ask me")
        yield server, room, await alice.wait_for(request_in(bot, room, "#1"))


@contextlib.asynccontextmanager
async def planned(
    notes: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> AsyncIterator[tuple[ModelServer, str, Seen]]:
    """Alice's run in plan mode proposes PLAN (then writes ``notes``), Mallory approving:
    the model server, the room, the plan's event."""
    room = await alice.create_room([bot.user_id, mallory.user.user_id])
    await mallory.join(room)
    async with (
        ModelServer(planning(notes)) as server,
        service(
            notes.parent,
            synapse,
            bot,
            room,
            allowed=(ALICE,),
            room_extra={"approvers": [ALICE, MALLORY]},
            extra=real(notes.parent, server, permission_mode="plan"),
        ),
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "plan it")
        yield server, room, await alice.wait_for(request_in(bot, room, "#1"))


async def test_a_question_is_answered_in_matrix_with_free_text(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    async with asked(tmp_path, synapse, bot, alice) as (server, room, question):
        body = str(question.content["body"])
        assert "Which database?" in body
        assert "2. `PostgreSQL`" in body
        await alice.send(room, "!answer #1 DuckDB, in memory")
        # (The edit comes first: the question is shown answered before claude goes on.)
        await alice.wait_for(edit_of(str(question.source["event_id"]), "answered by"))
        await alice.wait_for(answer_to(bot, room, "Thanks, noted."))
        assert any('"Which database?"="DuckDB, in memory"' in t for t in told(server))


async def test_a_plan_sent_back_by_a_reaction_keeps_claude_planning(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> None:
    async with planned(tmp_path / "notes.md", synapse, bot, alice, mallory) as (server, room, plan):
        assert "40. `rm -rf /srv/data`" in str(plan.content["body"])
        await mallory.sync(timeout_ms=0)
        await react(mallory, room, str(plan.source["event_id"]), "❌")
        await alice.wait_for(edit_of(str(plan.source["event_id"]), "sent back to planning"))
        write = await alice.wait_for(request_in(bot, room, "#2"))
        await react(mallory, room, str(write.source["event_id"]), "❌")
        await alice.wait_for(answer_to(bot, room, "Plan carried out."))
        assert "The user wants you to keep planning; the plan is not approved yet." in told(server)


async def test_a_question_is_answered_by_a_reply_and_offers_no_tool_reactions(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    async with asked(tmp_path, synapse, bot, alice) as (server, room, question):
        body = str(question.content["body"])
        assert "allow once" not in body
        assert "Reply to this message" in body
        event_id = str(question.source["event_id"])
        reply = {"m.relates_to": {"m.in_reply_to": {"event_id": event_id}}}
        await alice.send(room, "2", extra=reply)
        await alice.wait_for(edit_of(event_id, "answered by"))
        await alice.wait_for(answer_to(bot, room, "Thanks, noted."))
        assert any('"Which database?"="PostgreSQL"' in t for t in told(server))


async def test_a_single_choice_question_is_answered_by_a_number_reaction(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    async with asked(tmp_path, synapse, bot, alice) as (server, room, question):
        event_id = str(question.source["event_id"])
        await react(alice, room, event_id, "1\ufe0f\u20e3")
        await alice.wait_for(edit_of(event_id, "answered by"))
        await alice.wait_for(answer_to(bot, room, "Thanks, noted."))
        assert any('"Which database?"="SQLite"' in t for t in told(server))


async def test_a_plan_is_started_with_edits_asked_by_a_check_reaction(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> None:
    notes = tmp_path / "notes.md"
    async with planned(notes, synapse, bot, alice, mallory) as (_server, room, plan):
        body = str(plan.content["body"])
        assert "allow once" not in body
        assert "✅ to start with each edit asked" in body
        await mallory.sync(timeout_ms=0)
        await react(mallory, room, str(plan.source["event_id"]), "✅")
        await alice.wait_for(edit_of(str(plan.source["event_id"]), "each edit asked"))
        write = await alice.wait_for(request_in(bot, room, "#2"))
        await react(mallory, room, str(write.source["event_id"]), "✅")
        await alice.wait_for(answer_to(bot, room, "Plan carried out."))
        assert notes.read_text() == "notes\n"
