"""A run waiting for a person lends its run slot: another conversation runs meanwhile,
through the real service and the fake claude (docs/live-runs.md, "Waiting runs and the
run slots")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import ReplyKind
from bridge.core.transport import Accepted, ApprovalChoice
from bridge.store.base import ApprovalDecision, ApprovalState
from dispatcher.lending import SlotLease
from runner import PermissionCancelled
from tests.bridge.approval_posts import RUN, Bound
from tests.bridge.chat_room import GUARD_S, ChatRoom, serving
from tests.bridge.harness import ECHO, write_config

# Every message is a batch at once: the test follows runs, not windows.
AT_ONCE = {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 1}


def results(chat: ChatRoom) -> list[tuple[str | None, str]]:
    return [(r.thread, r.text) for r in chat.replies if r.kind is ReplyKind.RESULT]


def said(chat: ChatRoom, text: str, thread: str) -> bool:
    return any(text in r.text and r.thread == thread for r in chat.replies)


def one_slot(tmp_path: Path, env: dict[str, str], **defaults: str) -> Settings:
    """One run slot; each thread a conversation; every tool use asked."""
    config = {
        "dispatcher": AT_ONCE,
        "runner": {"max_concurrent_runs": 1, "prestart": False},
        "defaults": {"conversation": "thread", "approve_tools": True, **defaults},
    }
    return load_settings(write_config(tmp_path, config, env=env))


async def a_waits_for_approval(chat: ChatRoom) -> None:
    """Thread a's run waits on request #1; thread b's runs ask nothing (the fake asks
    for every Bash otherwise)."""
    await chat.say("!mode bypassPermissions", thread="b")
    await chat.wait_until(lambda: said(chat, "bypassPermissions", "b"))
    await chat.say("job a", thread="a")
    await chat.wait_until(lambda: said(chat, "(request `#1`", "a"))


async def test_a_run_waiting_for_approval_lets_another_conversation_run_with_one_slot(
    tmp_path: Path,
) -> None:
    async with serving(one_slot(tmp_path, ECHO)) as (service, chat):
        await a_waits_for_approval(chat)
        # a's run waits for a person: its slot went back to the pool.
        assert service.parts.dispatcher.active_runs == 1
        assert service.parts.dispatcher.lent_runs == 1
        await chat.say("!status", thread="a")
        await chat.wait_until(lambda: said(chat, "its run slot serves other rooms", "a"))
        await chat.say("job b", thread="b")
        await chat.wait_until(lambda: ("b", "job b") in results(chat))
        assert results(chat) == [("b", "job b")]  # a still waits
        await chat.say("!approve #1", thread="a")
        await chat.wait_until(lambda: ("a", "job a") in results(chat))
        assert service.parts.dispatcher.lent_runs == 0
    assert results(chat) == [("b", "job b"), ("a", "job a")]


async def test_an_answer_waits_for_a_slot_while_another_run_holds_it_and_says_so(
    tmp_path: Path,
) -> None:
    """With the only slot taken by b's run, a's approval is queued (the room is told)
    and delivered once b's run ends; a then completes."""
    gate = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate)}
    async with serving(one_slot(tmp_path, env)) as (service, chat):
        await a_waits_for_approval(chat)
        await chat.say("job b", thread="b")  # runs in a's lent slot; its tool waits for go
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 2)
        await chat.say("!approve #1", thread="a")
        await chat.wait_until(lambda: said(chat, "Queued: 0 waiting run(s) ahead", "a"))
        assert results(chat) == []
        await chat.say("!status", thread="a")
        await chat.wait_until(lambda: said(chat, "goes on when a run slot frees (0 waiting", "a"))
        gate.touch()  # b's run ends; a gets the slot, hears its answer and goes on
        await chat.wait_until(lambda: ("a", "job a") in results(chat))
    assert results(chat) == [("b", "job b"), ("a", "job a")]


async def test_a_click_whose_answer_waits_for_a_slot_tells_the_person_and_claude_hears_it_later(
    tmp_path: Path,
) -> None:
    lent: list[bool] = []
    lease = SlotLease(lambda: lent.append(True), lambda: 2)  # two reclaimers ahead
    bound = Bound(tmp_path)
    bound.runs.bind(bound.key, RUN, bound.control, lease)
    await bound.asks(bound.asked)
    assert lent == [True]  # posted: the run lent its slot
    assert await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW)) is Accepted.ACCEPTED
    [(_, text)] = bound.told.told
    assert "Queued: 2 waiting run(s) ahead" in text
    assert bound.answers() == []  # claude waits with the run
    lease.resumed(True)
    async with asyncio.timeout(GUARD_S):
        while not bound.answers():
            await asyncio.sleep(0)
    assert bound.answers() == [{"behavior": "allow", "updatedInput": {"command": "ls"}}]


async def test_a_run_whose_request_claude_withdrew_holds_a_slot_as_it_goes_on(
    tmp_path: Path,
) -> None:
    """An interrupt while a's run waits for a person: claude withdraws the request and
    works on the new message at once. Was: the run stayed lent and queued for a slot
    nothing waited for, so it worked uncounted beside b (two claudes on one slot, and
    a third room could start), and ``!status`` said it had been answered and waited."""
    gate = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate), "FAKE_CLAUDE_TOOL_TURNS": "1"}
    async with serving(one_slot(tmp_path, env, during_run="interrupt")) as (service, chat):
        await a_waits_for_approval(chat)
        await chat.say("job b", thread="b")  # runs in a's lent slot; its tool waits for go
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 2)
        await chat.say("rather this", thread="a")  # claude withdraws #1 and goes on
        await chat.wait_until(lambda: ("a", "rather this") in results(chat))
        # a's claude works (it answered): it holds a slot, beyond the one if need be.
        assert service.parts.dispatcher.lent_runs == 0
        await chat.say("!status", thread="a")
        await chat.wait_until(lambda: said(chat, "Waiting:", "a"))
        assert not said(chat, "It was answered", "a")
        gate.touch()
        await chat.wait_until(lambda: ("b", "job b") in results(chat))


async def test_an_answer_found_undelivered_at_a_replay_that_waits_for_a_slot_is_shown(
    tmp_path: Path,
) -> None:
    """Decided before a restart, never received by claude; on the replay its run lent
    its slot (another request of it waits) and none is free: the answer waits, and
    the request's message shows it as taken. Was: shown only when claude heard it at
    once, so the message kept its actions, clicked in vain."""
    closed: list[tuple[object, ...]] = []
    bound = Bound(tmp_path)

    async def close_approval(*args: object) -> None:
        closed.append(args)

    bound.told.close_approval = close_approval  # type: ignore[method-assign]
    await bound.asks(bound.asked)  # posted
    approval = await bound.store.approval_by_number(bound.key, 1)
    assert approval is not None
    assert await bound.store.decide_approval(
        approval, ApprovalDecision(ApprovalState.ALLOWED, bound.user, 1.0, "")
    )  # ... and the bridge stopped there
    # The restart: the run reattached, lent, and every slot busy (one reclaimer ahead).
    bound.runs.bind(bound.key, RUN, bound.control, SlotLease(lambda: None, lambda: 1))
    closed.clear()
    await bound.asks(bound.asked)
    assert bound.answers() == []  # claude waits for the run's slot
    assert len(closed) == 1
    assert "allowed" in str(closed[0]).lower()


async def test_an_answer_claude_already_has_takes_no_slot_back(tmp_path: Path) -> None:
    """A replay meets a request claude was answered before the restart, while its run
    lent its slot (another request of it waits): claude goes on with nothing new, so
    the run stays lent. Was: it reclaimed, queued ahead of every new run, and held a
    slot while it still waited for a person."""
    reclaims: list[bool] = []

    def reclaim() -> int | None:
        reclaims.append(True)
        return 1

    bound = Bound(tmp_path)
    await bound.asks(bound.asked)
    approval = await bound.store.approval_by_number(bound.key, 1)
    assert approval is not None
    decision = ApprovalDecision(ApprovalState.ALLOWED, bound.user, 1.0, "")
    assert await bound.store.decide_approval(approval, decision)
    # The earlier bridge's answer, as the journal shows it to the reattached run.
    answer = {"type": "control_response", "response": {"request_id": "r1", "response": {}}}
    bound.control.note_in(json.dumps(answer).encode())
    bound.runs.bind(bound.key, RUN, bound.control, SlotLease(lambda: None, reclaim))
    await bound.asks(bound.asked)
    assert reclaims == []
    assert bound.answers() == []


def closing(bound: Bound) -> list[str]:
    """What the request's message is edited to say, each time."""
    closed: list[str] = []

    async def close_approval(*args: object) -> None:
        closed.append(str(args[-1]))  # (room, message id, text)

    bound.told.close_approval = close_approval  # type: ignore[method-assign]
    return closed


async def test_an_answer_waiting_for_a_slot_then_withdrawn_by_claude_says_nothing_ran(
    tmp_path: Path,
) -> None:
    """Allowed while every slot was busy, so the answer waited; then an interrupt (a new
    message) made claude withdraw the request before it heard the answer. Was: the
    request's message said "allowed", though the tool never ran."""
    lease = SlotLease(lambda: None, lambda: 1, lambda: lease.resumed(True))
    bound = Bound(tmp_path)
    bound.runs.bind(bound.key, RUN, bound.control, lease)
    closed = closing(bound)
    await bound.asks(bound.asked)
    assert await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW)) is Accepted.ACCEPTED
    assert len(closed) == 1  # shown as allowed, the answer waiting for a slot
    bound.control.note(PermissionCancelled("r1"))
    await bound.flow.withdrawn(bound.key, RUN, "r1")  # the run holds a slot at once
    async with asyncio.timeout(GUARD_S):
        while len(closed) < 2:
            await asyncio.sleep(0)
    assert bound.answers() == []  # claude never heard it
    assert "withdrew" in closed[-1], closed
    assert "did not run" in closed[-1], closed


async def test_an_answer_waiting_for_a_slot_whose_run_ended_says_nothing_ran(
    tmp_path: Path,
) -> None:
    """Allowed while every slot was busy; the run ended (stopped) before it had one
    back. Was: the message said "allowed", though the tool never ran."""
    lease = SlotLease(lambda: None, lambda: 1)
    bound = Bound(tmp_path)
    bound.runs.bind(bound.key, RUN, bound.control, lease)
    closed = closing(bound)
    await bound.asks(bound.asked)
    assert await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW)) is Accepted.ACCEPTED
    lease.ended()
    async with asyncio.timeout(GUARD_S):
        while len(closed) < 2:
            await asyncio.sleep(0)
    assert "ended before claude heard" in closed[-1], closed
    assert "did not run" in closed[-1], closed


async def test_an_answer_waiting_for_a_slot_then_withdrawn_is_shown_unheard_in_the_room(
    tmp_path: Path,
) -> None:
    """Through the service and the fake claude: a's request is allowed while b's run
    holds the only slot, then a new message in a interrupts claude, which withdraws
    the request and goes on. The request's message says the answer was never heard."""
    gate = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate), "FAKE_CLAUDE_TOOL_TURNS": "1"}
    async with serving(one_slot(tmp_path, env, during_run="interrupt")) as (service, chat):
        closed: list[str] = []

        async def close_approval(room: object, message_id: object, text: str) -> None:
            closed.append(text)

        chat.close_approval = close_approval  # type: ignore[method-assign]
        await a_waits_for_approval(chat)
        await chat.say("job b", thread="b")  # runs in a's lent slot; its tool waits for go
        await chat.wait_until(lambda: service.parts.dispatcher.active_runs == 2)
        await chat.say("!approve #1", thread="a")
        await chat.wait_until(lambda: said(chat, "Queued: 0 waiting run(s) ahead", "a"))
        await chat.say("rather this", thread="a")  # claude withdraws #1 and goes on
        await chat.wait_until(lambda: ("a", "rather this") in results(chat))
        await chat.wait_until(lambda: any("withdrew" in t for t in closed))
        assert "did not run" in closed[-1], closed
        gate.touch()
        await chat.wait_until(lambda: ("b", "job b") in results(chat))
