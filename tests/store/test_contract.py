"""The Store contract, run against every backend (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from bridge.core.model import (
    Attachment,
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Message,
    MessageId,
    MessageState,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import (
    AuditAction,
    AuditEntry,
    AuditFilter,
    AuditRecord,
    DeliveryState,
    RegisteredRun,
    RoomOverrides,
    RunEnding,
    StoreError,
)
from bridge.store.rules import EXCERPT_LIMIT_BYTES
from tests.store.conftest import InspectableStore
from tests.store.rows import ALICE, OTHER_ROOM, ROOM, SLACK_ROOM, accept, inbound, start

BOB = UserId("@bob:localhost")


async def accept_many(store: InspectableStore, n: int, at: float = 100.0) -> list[Message]:
    return [await accept(store, f"$e{i}", at + i) for i in range(n)]


def actions(trail: list[AuditRecord]) -> Counter[AuditAction]:
    return Counter(a.action for a in trail)


# Accepting messages


async def test_accept_records_pending_message(store: InspectableStore) -> None:
    msg = await store.accept(inbound("$1", text="do it", thread="t1"), 123.25)
    assert msg is not None
    assert (msg.room, msg.sender, msg.text, msg.external_id, msg.received_at, msg.thread) == (
        ROOM,
        ALICE,
        "do it",
        "$1",
        123.25,
        "t1",
    )
    assert await store.pending_messages() == [msg]
    assert await store.messages([msg.id]) == [msg]
    assert await store.message_states([msg.id]) == {msg.id: MessageState.PENDING}
    [row] = await store.audit_trail(AuditFilter(message_id=msg.id))
    assert (row.action, row.room, row.actor, row.at) == (
        AuditAction.MESSAGE_ACCEPTED,
        ROOM,
        ALICE,
        123.25,
    )


async def test_files_names_and_reply_context_are_stored_with_the_message(
    store: InspectableStore,
) -> None:
    # A crash between accept and run must lose none of it: the run reads it back.
    files = (
        Attachment("report.pdf", "application/pdf", 12345, '{"url":"https://x/f1"}'),
        Attachment("ü ☃.png", "image/png", None, "mxc://hs/abc"),
    )
    sent = InboundMessage(
        room=ROOM,
        sender=ALICE,
        text="",
        external_id=ExternalMessageId("$files"),
        attachments=files,
        sender_name="Alice 🚀",
        reply_to_text="the earlier message\nwith two lines",
    )
    msg = await store.accept(sent, 10.0)
    assert msg is not None
    assert (msg.attachments, msg.sender_name, msg.reply_to_text) == (
        files,
        "Alice 🚀",
        "the earlier message\nwith two lines",
    )
    assert await store.pending_messages() == [msg]
    assert await store.messages([msg.id]) == [msg]
    assert await store.pending_message(ROOM, ExternalMessageId("$files")) == msg
    edited = await store.edit_pending(msg.id, "now with text", ALICE, 11.0)
    assert edited is not None
    assert (edited.attachments, edited.sender_name) == (files, "Alice 🚀")
    plain = await accept(store, "$plain")
    assert (plain.attachments, plain.sender_name, plain.reply_to_text) == ((), None, None)
    assert await store.messages([plain.id]) == [plain]


async def test_ids_increase_in_acceptance_order_across_rooms(store: InspectableStore) -> None:
    a = await accept(store, "$1", room=ROOM)
    b = await accept(store, "$1", room=OTHER_ROOM)
    c = await accept(store, "$2", room=ROOM)
    assert a.id < b.id < c.id
    assert [m.id for m in await store.pending_messages()] == [a.id, b.id, c.id]


async def test_redelivery_returns_none_and_records_nothing(store: InspectableStore) -> None:
    first = await accept(store, "$1")
    trail_before = await store.audit_trail()
    assert await store.accept(inbound("$1", text="different text"), 999.0) is None
    assert await store.pending_messages() == [first]
    assert await store.audit_trail() == trail_before


async def test_same_external_id_in_other_room_or_transport_is_new(store: InspectableStore) -> None:
    await accept(store, "$1", room=ROOM)
    assert await store.accept(inbound("$1", room=OTHER_ROOM), 1.0) is not None
    assert await store.accept(inbound("$1", room=SLACK_ROOM), 1.0) is not None


async def test_concurrent_redeliveries_yield_exactly_one_message(store: InspectableStore) -> None:
    results = await asyncio.gather(*(store.accept(inbound("$dup"), 1.0) for _ in range(30)))
    accepted = [r for r in results if r is not None]
    assert len(accepted) == 1
    assert await store.pending_messages() == accepted
    assert actions(await store.audit_trail()) == {AuditAction.MESSAGE_ACCEPTED: 1}


async def test_concurrent_distinct_accepts_all_commit(store: InspectableStore) -> None:
    results = await asyncio.gather(*(store.accept(inbound(f"$m{i}"), 1.0) for i in range(30)))
    ids = {r.id for r in results if r is not None}
    assert len(ids) == 30
    assert len(await store.pending_messages()) == 30


async def test_text_that_cannot_be_stored_fails_only_its_own_accept(
    store: InspectableStore,
) -> None:
    # A lone surrogate (half an emoji) reaching the store in a group commit.
    bad = inbound("$bad", text="cut \ud83d")
    results = await asyncio.gather(
        *(store.accept(inbound(f"$m{i}"), 1.0) for i in range(5)),
        store.accept(bad, 1.0),
        *(store.accept(inbound(f"$n{i}"), 1.0) for i in range(5)),
        return_exceptions=True,
    )
    assert isinstance(results[5], StoreError)
    assert all(isinstance(r, Message) for i, r in enumerate(results) if i != 5)
    assert len(await store.pending_messages()) == 10
    # Once made safe, the same message is accepted.
    assert await store.accept(inbound("$bad", text="cut \ufffd"), 2.0) is not None


async def test_record_ignored_audits_without_text(store: InspectableStore) -> None:
    secret = "the secret text"
    await store.record_ignored(inbound("$x", text=secret), "not allowed", 5.0)
    assert await store.pending_messages() == []
    [row] = await store.audit_trail(AuditFilter(room=ROOM))
    assert (row.action, row.actor, row.message_id, row.at) == (
        AuditAction.MESSAGE_IGNORED,
        ALICE,
        None,
        5.0,
    )
    assert "not allowed" in row.detail
    assert "$x" in row.detail
    assert secret not in row.detail
    # An ignored message was not accepted: a later delivery still is.
    assert await store.accept(inbound("$x"), 6.0) is not None


async def test_complete_command_marks_done(store: InspectableStore) -> None:
    command, other = await accept_many(store, 2)
    await store.complete_command(command.id)
    assert await store.pending_messages() == [other]
    assert (await store.message_states([command.id]))[command.id] is MessageState.DONE


async def test_messages_skips_unknown_ids_and_sorts(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    assert await store.messages([b.id, MessageId(10_000), a.id]) == [a, b]
    assert await store.messages([]) == []


# Runs


async def test_start_run_dispatches_and_audits_per_message(store: InspectableStore) -> None:
    msgs = await accept_many(store, 3)
    rid = await start(store, "run-1", msgs, at=200.0)
    assert await store.pending_messages() == []
    states = await store.message_states([m.id for m in msgs])
    assert set(states.values()) == {MessageState.DISPATCHED}

    run = await store.get_run(rid)
    assert run is not None
    assert (run.id, run.room, run.status, run.started_at, run.ended_at, run.pid, run.report) == (
        rid,
        ROOM,
        RunStatus.RUNNING,
        200.0,
        None,
        None,
        None,
    )
    assert run.message_ids == tuple(m.id for m in msgs)
    assert await store.running_runs() == [run]

    trail = await store.audit_trail(AuditFilter(run_id=rid))
    assert actions(trail) == {AuditAction.MESSAGE_DISPATCHED: 3, AuditAction.RUN_STARTED: 1}
    dispatched = [a.message_id for a in trail if a.action is AuditAction.MESSAGE_DISPATCHED]
    assert dispatched == [m.id for m in msgs]


async def test_batch_order_is_kept(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    rid = await start(store, "run-1", [b, a])
    run = await store.get_run(rid)
    assert run is not None
    assert run.message_ids == (b.id, a.id)


async def test_steer_into_run_appends_messages_to_the_running_run(
    store: InspectableStore,
) -> None:
    a, b, c = await accept_many(store, 3)
    rid = await start(store, "run-1", [a])
    await store.steer_into_run(rid, Batch(ROOM, (b, c)), 300.0)
    run = await store.get_run(rid)
    assert run is not None
    assert run.message_ids == (a.id, b.id, c.id)
    assert await store.pending_messages() == []
    steered = [
        a.message_id
        for a in await store.audit_trail(AuditFilter(run_id=rid))
        if a.action is AuditAction.MESSAGE_DISPATCHED and a.detail == "steered"
    ]
    assert steered == [b.id, c.id]
    # Finishing the run finishes the steered messages with it.
    await store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED), 400.0))
    states = await store.message_states([b.id, c.id])
    assert set(states.values()) == {MessageState.DONE}


async def test_steer_into_a_finished_run_is_refused(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    rid = await start(store, "run-1", [a])
    await store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED), 400.0))
    with pytest.raises(StoreError):
        await store.steer_into_run(rid, Batch(ROOM, (b,)), 500.0)
    assert await store.pending_messages() == [b]


async def test_start_run_is_atomic(store: InspectableStore) -> None:
    [msg] = await accept_many(store, 1)
    ghost = Message(MessageId(10_000), ROOM, ALICE, "x", ExternalMessageId("$g"), 1.0)
    with pytest.raises(StoreError):
        await store.start_run(RunId("run-1"), Batch(ROOM, (msg, ghost)), 1.0)
    assert await store.get_run(RunId("run-1")) is None
    assert await store.pending_messages() == [msg]
    assert actions(await store.audit_trail()) == {AuditAction.MESSAGE_ACCEPTED: 1}


async def test_duplicate_run_id_is_an_error(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    await start(store, "run-1", [a])
    with pytest.raises(StoreError):
        await start(store, "run-1", [b])
    assert await store.pending_messages() == [b]


async def test_finish_run_records_report(store: InspectableStore) -> None:
    msgs = await accept_many(store, 2)
    rid = await start(store, "run-1", msgs, at=200.0)
    report = RunReport(
        status=RunStatus.SUCCEEDED,
        exit_code=0,
        session_id=SessionId("sess-1"),
        cost_usd=0.0125,
        num_turns=3,
        duration_ms=4567,
        result_text="the answer",
        error="",
    )
    await store.finish_run(RunEnding(rid, report, 260.5))
    run = await store.get_run(rid)
    assert run is not None
    assert (run.status, run.ended_at, run.report) == (RunStatus.SUCCEEDED, 260.5, report)
    assert await store.running_runs() == []
    assert set((await store.message_states([m.id for m in msgs])).values()) == {MessageState.DONE}
    finished = [
        a
        for a in await store.audit_trail(AuditFilter(run_id=rid))
        if a.action is AuditAction.RUN_FINISHED
    ]
    assert [(a.at, a.detail) for a in finished] == [(260.5, "succeeded")]


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (RunStatus.SUCCEEDED, MessageState.DONE),
        (RunStatus.STOPPED, MessageState.DROPPED),
        (RunStatus.FAILED, MessageState.FAILED),
        (RunStatus.TIMED_OUT, MessageState.FAILED),
        (RunStatus.STALLED, MessageState.FAILED),
        (RunStatus.INTERRUPTED, MessageState.FAILED),
    ],
)
async def test_finish_run_settles_messages(
    store: InspectableStore, status: RunStatus, state: MessageState
) -> None:
    msgs = await accept_many(store, 2)
    rid = await start(store, "run-1", msgs)
    await store.finish_run(RunEnding(rid, RunReport(status=status, session_not_found=True), 300.0))
    assert set((await store.message_states([m.id for m in msgs])).values()) == {state}
    run = await store.get_run(rid)
    assert run is not None
    assert run.report is not None
    assert run.report.session_not_found


async def test_finish_run_only_first_report_counts(store: InspectableStore) -> None:
    msgs = await accept_many(store, 1)
    rid = await start(store, "run-1", msgs)
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.INTERRUPTED), 300.0))
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.SUCCEEDED), 301.0))
    run = await store.get_run(rid)
    assert run is not None
    assert (run.status, run.ended_at) == (RunStatus.INTERRUPTED, 300.0)
    assert actions(await store.audit_trail(AuditFilter(run_id=rid)))[AuditAction.RUN_FINISHED] == 1


async def test_finishing_an_ended_run_again_returns_its_pending_entries(
    store: InspectableStore,
) -> None:
    """A retry after a lost acknowledgement of the commit gets the answer to hand over."""
    rid = await start(store, "run-1", await accept_many(store, 1))
    first = await store.finish_run(
        RunEnding(rid, RunReport(status=RunStatus.SUCCEEDED), 300.0, [answer("a"), answer("b")])
    )
    [unrelated] = await store.enqueue([answer("notice")], 300.5)
    await store.delivery_finished(first[0].id, DeliveryState.DELIVERED, 301.0)
    again = await store.finish_run(
        RunEnding(rid, RunReport(status=RunStatus.FAILED), 302.0, [answer("a"), answer("b")])
    )
    assert again == first[1:]
    assert [e.id for e in await store.undelivered()] == [first[1].id, unrelated.id]
    run = await store.get_run(rid)
    assert run is not None
    assert run.status is RunStatus.SUCCEEDED


async def test_finish_unknown_run_is_an_error(store: InspectableStore) -> None:
    with pytest.raises(StoreError):
        await store.finish_run(RunEnding(RunId("nope"), RunReport(status=RunStatus.FAILED), 1.0))


async def test_excerpts_are_bounded(store: InspectableStore) -> None:
    rid = await start(store, "run-1", await accept_many(store, 1))
    long_result = "é" * 50_000  # two bytes each: the cut must not split one
    long_error = "E" * 50_000
    await store.finish_run(
        RunEnding(
            rid, RunReport(status=RunStatus.FAILED, result_text=long_result, error=long_error), 1.0
        )
    )
    run = await store.get_run(rid)
    assert run is not None
    assert run.report is not None
    for kept, original in ((run.report.result_text, long_result), (run.report.error, long_error)):
        assert len(kept.encode()) <= EXCERPT_LIMIT_BYTES
        assert len(kept) > 1000
        assert original.startswith(kept.split("\n")[0])
        assert kept.endswith("[truncated]")


async def test_get_run_unknown_is_none(store: InspectableStore) -> None:
    assert await store.get_run(RunId("nope")) is None
    assert await store.last_run(ROOM) is None
    assert await store.retryable_runs(ROOM) == []


async def test_running_runs_lists_only_running_oldest_first(store: InspectableStore) -> None:
    a, b, c = await accept_many(store, 3)
    r1 = await start(store, "r1", [a])
    r2 = await start(store, "r2", [b])
    r3 = await start(store, "r3", [c])
    await store.finish_run(RunEnding(r2, RunReport(status=RunStatus.SUCCEEDED), 1.0))
    assert [r.id for r in await store.running_runs()] == [r1, r3]


async def test_last_run_is_per_room_and_latest(store: InspectableStore) -> None:
    a = await accept(store, "$1", room=ROOM)
    b = await accept(store, "$2", room=ROOM)
    c = await accept(store, "$1", room=OTHER_ROOM)
    await start(store, "r1", [a], at=10.0)
    await start(store, "r2", [c], at=11.0)
    # Same start time as r1: start order still decides.
    await start(store, "r3", [b], at=10.0)
    last = await store.last_run(ROOM)
    other = await store.last_run(OTHER_ROOM)
    assert last is not None
    assert other is not None
    assert (last.id, other.id) == ("r3", "r2")
    assert await store.last_run(SLACK_ROOM) is None


async def test_room_runs_are_the_conversations_newest_first_up_to_the_limit(
    store: InspectableStore,
) -> None:
    mine = [await accept(store, f"$m{i}", room=ROOM) for i in range(3)]
    theirs = await accept(store, "$t", room=OTHER_ROOM)
    await start(store, "r1", [mine[0]], at=10.0)
    await start(store, "o1", [theirs], at=11.0)
    await start(store, "r2", [mine[1]], at=12.0)
    await start(store, "r3", [mine[2]], at=12.0)  # same time: start order decides
    await store.finish_run(
        RunEnding(RunId("r1"), RunReport(RunStatus.SUCCEEDED, cost_usd=0.5), 13.0)
    )
    runs = await store.room_runs(ROOM, 10)
    assert [r.id for r in runs] == ["r3", "r2", "r1"]
    assert runs[2].report is not None
    assert runs[2].report.cost_usd == 0.5
    assert runs[2].message_ids == (mine[0].id,)
    assert [r.id for r in await store.room_runs(ROOM, 2)] == ["r3", "r2"]
    assert await store.room_runs(SLACK_ROOM, 10) == []


async def test_requeue_after_failure_and_rerun(store: InspectableStore) -> None:
    msgs = await accept_many(store, 3)
    r1 = await start(store, "r1", msgs)
    await store.finish_run(RunEnding(r1, RunReport(status=RunStatus.TIMED_OUT), 1.0))
    [failed] = await store.retryable_runs(ROOM)
    assert failed.id == r1
    requeued = await store.requeue_run(failed.id)
    assert requeued == msgs
    assert await store.pending_messages() == msgs

    r2 = await start(store, "r2", requeued, at=2.0)
    await store.finish_run(RunEnding(r2, RunReport(status=RunStatus.SUCCEEDED), 3.0))
    assert set((await store.message_states([m.id for m in msgs])).values()) == {MessageState.DONE}
    old = await store.get_run(r1)
    assert old is not None
    # The old run still lists its messages and its status is unchanged.
    assert (old.status, old.message_ids) == (RunStatus.TIMED_OUT, tuple(m.id for m in msgs))
    # Per message: accepted once, dispatched twice (once per run).
    for m in msgs:
        assert actions(await store.audit_trail(AuditFilter(message_id=m.id))) == {
            AuditAction.MESSAGE_ACCEPTED: 1,
            AuditAction.MESSAGE_DISPATCHED: 2,
        }


async def test_a_run_ended_with_requeue_leaves_its_messages_pending(
    store: InspectableStore,
) -> None:
    # A run that never began (its process died before spawning anything).
    msgs = await accept_many(store, 2)
    r1 = await start(store, "r1", msgs)
    await store.finish_run(
        RunEnding(r1, RunReport(RunStatus.INTERRUPTED, error="x"), 1.0, requeue=True)
    )
    assert await store.pending_messages() == msgs
    ended = await store.get_run(r1)
    assert ended is not None
    assert ended.status is RunStatus.INTERRUPTED
    assert await store.running_runs() == []
    # Not offered to !retry: nothing of it failed.
    assert await store.retryable_runs(ROOM) == []


async def test_requeue_of_an_unknown_run_returns_nothing(store: InspectableStore) -> None:
    assert await store.requeue_run(RunId("nope")) == []


# Dropping


async def test_mark_dropped_audits_live_messages_only(store: InspectableStore) -> None:
    running, queued, done = await accept_many(store, 3)
    rid = await start(store, "r0", [done])
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.SUCCEEDED), 1.0))
    r1 = await start(store, "r1", [running])

    await store.mark_dropped([running.id, queued.id, done.id], BOB, 5.0)

    states = await store.message_states([running.id, queued.id, done.id])
    assert states == {
        running.id: MessageState.DROPPED,
        queued.id: MessageState.DROPPED,
        done.id: MessageState.DONE,
    }
    dropped = [
        (a.message_id, a.actor, a.run_id, a.room, a.at)
        for a in await store.audit_trail()
        if a.action is AuditAction.MESSAGE_DROPPED
    ]
    assert dropped == [(running.id, BOB, r1, ROOM, 5.0), (queued.id, BOB, None, ROOM, 5.0)]

    # The stopped run ends afterwards; its dropped message stays dropped.
    await store.finish_run(RunEnding(r1, RunReport(status=RunStatus.STOPPED), 6.0))
    assert (await store.message_states([running.id]))[running.id] is MessageState.DROPPED
    assert await store.retryable_runs(ROOM) == []


# Sessions


async def test_room_state_is_the_session_and_the_overrides(store: InspectableStore) -> None:
    assert await store.room_state(ROOM) == (None, RoomOverrides())
    await store.set_session(ROOM, SessionId("s1"))
    await store.set_room_model(ROOM, "opus")
    await store.set_room_mode(OTHER_ROOM, "plan")
    assert await store.room_state(ROOM) == (SessionId("s1"), RoomOverrides("opus", None))
    assert await store.room_state(OTHER_ROOM) == (None, RoomOverrides(None, "plan"))
    await store.set_session(ROOM, None)
    assert await store.room_state(ROOM) == (None, RoomOverrides("opus", None))


async def test_a_rooms_fork_is_set_and_cleared_beside_its_other_overrides(
    store: InspectableStore,
) -> None:
    await store.set_room_model(ROOM, "opus")
    await store.set_room_fork(ROOM, True)
    assert await store.room_state(ROOM) == (None, RoomOverrides("opus", None, fork=True))
    assert (await store.room_overrides(OTHER_ROOM)).fork is False
    await store.set_room_fork(ROOM, False)
    assert await store.room_overrides(ROOM) == RoomOverrides("opus", None)


async def test_sessions_per_room(store: InspectableStore) -> None:
    assert await store.get_session(ROOM) is None
    await store.set_session(ROOM, SessionId("s1"))
    await store.set_session(SLACK_ROOM, SessionId("s9"))
    assert await store.get_session(ROOM) == "s1"
    await store.set_session(ROOM, SessionId("s2"))
    assert await store.get_session(ROOM) == "s2"
    await store.set_session(ROOM, None)
    assert await store.get_session(ROOM) is None
    assert await store.get_session(SLACK_ROOM) == "s9"
    await store.set_session(OTHER_ROOM, None)  # clearing an unknown room is fine
    assert await store.get_session(OTHER_ROOM) is None


# Thread conversations


async def test_a_rooms_thread_conversations_are_kept_apart(store: InspectableStore) -> None:
    """A thread conversation keeps its own messages, runs and session, comes back
    whole from the store, and is found by its room and a message id (an edit)."""
    thread = ROOM.in_thread("$root/with:odd chars%_")
    other = ROOM.in_thread("$other")
    in_thread = await store.accept(inbound("$1", room=thread, thread=thread.thread), 100.0)
    top = await accept(store, "$2")
    assert in_thread is not None
    assert in_thread.room == thread
    assert [m.room for m in await store.pending_messages()] == [thread, ROOM]
    # The transport names the room and the message: found in whichever conversation.
    assert await store.pending_message(ROOM, ExternalMessageId("$1")) == in_thread
    assert await store.pending_message(thread, ExternalMessageId("$1")) == in_thread
    assert await store.pending_message(OTHER_ROOM, ExternalMessageId("$1")) is None
    await start(store, "r-thread", [in_thread])
    assert (await store.last_run(thread)) is not None
    assert await store.last_run(ROOM) is None
    assert await store.last_run(other) is None
    await store.set_session(thread, SessionId("s-thread"))
    assert await store.get_session(thread) == "s-thread"
    assert await store.get_session(ROOM) is None
    assert await store.get_session(other) is None
    [entry] = await store.enqueue(
        [Reply(thread, "an answer", ReplyKind.RESULT, thread=thread.thread)], 101.0
    )
    assert entry.reply.room == thread
    assert [m.room for m in await store.messages([in_thread.id, top.id])] == [thread, ROOM]


async def test_a_room_is_found_by_its_own_id_not_as_a_pattern(store: InspectableStore) -> None:
    """Room ids may hold what LIKE reads as wildcards or escapes (``_``, ``%``,
    ``\\``) and are case-sensitive (Matrix's): a room's lookup by message id never
    reaches a look-alike room's threads."""
    for odd, lookalike in [
        ("!a_b:hs", "!aXb:hs"),
        ("!a%b:hs", "!aXYZb:hs"),
        ("!a\\b:hs", "!ab:hs"),
        ("!Ab:hs", "!aB:hs"),
    ]:
        room = RoomKey(TransportName("matrix"), RoomId(odd))
        other = RoomKey(TransportName("matrix"), RoomId(lookalike))
        message = await store.accept(inbound(f"$in{odd}", room=room.in_thread("$t")), 100.0)
        assert message is not None
        assert await store.pending_message(other, ExternalMessageId(f"$in{odd}")) is None
        assert await store.pending_message(room, ExternalMessageId(f"$in{odd}")) == message


async def test_a_thread_conversation_of_the_longest_ids_is_kept_whole(
    store: InspectableStore,
) -> None:
    """Matrix allows 255 bytes for a room id and for an event id (a thread root):
    a conversation of the two still fits the store's id columns on every
    backend, comes back as the same key, and is found by its room."""
    long_room = RoomKey(TransportName("matrix"), RoomId("!" + "r" * 200 + ":localhost"))
    root = "$" + "e/%_" * 60 + ":localhost"
    thread = long_room.in_thread(root)
    assert len(thread.room_id) + 1 + len(thread.thread) <= 255
    message = await store.accept(inbound("$in", room=thread, thread=root), 100.0)
    assert message is not None
    assert message.room == thread
    assert message.thread == root  # the reply still goes to the real thread
    assert [m.room for m in await store.pending_messages()] == [thread]
    assert await store.pending_message(long_room, ExternalMessageId("$in")) == message
    await start(store, "r-long", [message])
    assert (await store.last_run(thread)) is not None
    await store.set_session(thread, SessionId("s-long"))
    assert await store.get_session(thread) == "s-long"
    answer = Reply(thread, "an answer", ReplyKind.RESULT, thread=root)
    [entry] = await store.enqueue([answer], 101.0)
    assert entry.reply.room == thread
    assert entry.reply.thread == root
    # Two long threads of one room stay two conversations.
    assert long_room.in_thread(root + "x") != thread


# Audit


async def test_audit_filters_combine(store: InspectableStore) -> None:
    await store.audit(
        AuditEntry(AuditAction.COMMAND, 1.0, room=ROOM, actor=ALICE, detail="!status")
    )
    await store.audit(
        AuditEntry(AuditAction.STOP_REQUESTED, 2.0, room=ROOM, actor=BOB, run_id=RunId("r1"))
    )
    await store.audit(
        AuditEntry(AuditAction.RETRY_REQUESTED, 3.0, room=OTHER_ROOM, run_id=RunId("r1"))
    )
    await store.audit(AuditEntry(AuditAction.SESSION_RESET, 4.0, message_id=MessageId(7)))

    everything = await store.audit_trail()
    assert [a.action for a in everything] == [
        AuditAction.COMMAND,
        AuditAction.STOP_REQUESTED,
        AuditAction.RETRY_REQUESTED,
        AuditAction.SESSION_RESET,
    ]
    assert len({a.id for a in everything}) == 4
    first = everything[0]
    assert (first.at, first.room, first.actor, first.detail, first.run_id, first.message_id) == (
        1.0,
        ROOM,
        ALICE,
        "!status",
        None,
        None,
    )
    assert everything[3].room is None
    assert [a.at for a in await store.audit_trail(AuditFilter(room=ROOM))] == [1.0, 2.0]
    assert [a.at for a in await store.audit_trail(AuditFilter(run_id=RunId("r1")))] == [2.0, 3.0]
    assert [a.at for a in await store.audit_trail(AuditFilter(room=ROOM, run_id=RunId("r1")))] == [
        2.0
    ]
    assert [a.at for a in await store.audit_trail(AuditFilter(message_id=MessageId(7)))] == [4.0]


async def test_audit_counts_per_message_in_coalesced_run(store: InspectableStore) -> None:
    msgs = await accept_many(store, 3)
    rid = await start(store, "r1", msgs)
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.SUCCEEDED), 9.0))
    for m in msgs:
        trail = await store.audit_trail(AuditFilter(message_id=m.id))
        assert actions(trail) == {
            AuditAction.MESSAGE_ACCEPTED: 1,
            AuditAction.MESSAGE_DISPATCHED: 1,
        }
    assert actions(await store.audit_trail(AuditFilter(run_id=rid))) == {
        AuditAction.MESSAGE_DISPATCHED: 3,
        AuditAction.RUN_STARTED: 1,
        AuditAction.RUN_FINISHED: 1,
    }


# Retention


async def test_prune_keeps_live_work(store: InspectableStore) -> None:
    old_pending = await accept(store, "$p", at=10.0)
    old_dispatched = await accept(store, "$d", at=11.0)
    running = await start(store, "running", [old_dispatched], at=12.0)
    old_done = await accept(store, "$x", at=13.0)
    finished = await start(store, "finished", [old_done], at=14.0)
    await store.finish_run(RunEnding(finished, RunReport(status=RunStatus.SUCCEEDED), 15.0))
    await store.audit(AuditEntry(AuditAction.COMMAND, 1000.0, detail="recent"))

    deleted = await store.prune(older_than=500.0)

    assert await store.pending_messages() == [old_pending]
    assert await store.messages([old_pending.id, old_dispatched.id, old_done.id]) == [
        old_pending,
        old_dispatched,
    ]
    still_running = await store.get_run(running)
    assert still_running is not None
    assert still_running.status is RunStatus.RUNNING
    assert await store.running_runs() == [still_running]
    # The finished run lost its only message, so it went too.
    assert await store.get_run(finished) is None
    assert [a.detail for a in await store.audit_trail()] == ["recent"]
    # Old audit rows: 3 accepted, 2 dispatched, 2 run started, 1 run finished.
    old_audit = 3 + 2 + 2 + 1
    assert deleted == old_audit + 1 + 1
    # A pruned message's id may arrive again and is a new message then.
    assert await store.accept(inbound("$x"), 2000.0) is not None


async def test_prune_keeps_recent_and_runs_with_surviving_messages(
    store: InspectableStore,
) -> None:
    old = await accept(store, "$old", at=10.0)
    new = await accept(store, "$new", at=900.0)
    rid = await start(store, "r1", [old, new], at=901.0)
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.FAILED), 902.0))

    await store.prune(older_than=500.0)

    assert await store.messages([old.id, new.id]) == [new]
    run = await store.get_run(rid)
    assert run is not None
    assert run.message_ids == (new.id,)
    assert len(await store.audit_trail()) == 5  # all but old's "accepted"


async def test_ids_are_not_reused_after_prune(store: InspectableStore) -> None:
    newest = await accept(store, "$1", at=10.0)
    await store.complete_command(newest.id)
    assert await store.prune(older_than=500.0) == 2  # the message and its audit row
    later = await accept(store, "$2", at=600.0)
    assert later.id > newest.id


async def test_prune_of_nothing(store: InspectableStore) -> None:
    await accept_many(store, 2, at=100.0)
    assert await store.prune(older_than=50.0) == 0


# Lifecycle


async def test_ping_and_close(store: InspectableStore) -> None:
    await store.ping()
    await store.close()
    with pytest.raises(StoreError):
        await store.ping()
    with pytest.raises(StoreError):
        await store.accept(inbound("$1"), 1.0)


# Outbox


def answer(text: str = "the answer", room: RoomKey = ROOM) -> Reply:
    return Reply(
        room=room,
        text=text,
        kind=ReplyKind.RESULT,
        in_reply_to=ExternalMessageId("$last"),
        thread="t1",
        anchor=ExternalMessageId("$first"),
    )


async def started_run(store: InspectableStore, run_id: str = "run-1") -> RunId:
    [message] = await accept_many(store, 1)
    await store.start_run(RunId(run_id), Batch(ROOM, (message,)), 110.0)
    return RunId(run_id)


async def test_finish_run_records_the_outcome_and_the_replies_together(
    store: InspectableStore,
) -> None:
    run_id = await started_run(store)
    replies = [answer("one"), answer("two", room=OTHER_ROOM)]
    entries = await store.finish_run(
        RunEnding(run_id, RunReport(RunStatus.SUCCEEDED), 120.0, replies)
    )
    assert [e.reply for e in entries] == replies
    assert entries[0].id < entries[1].id
    assert all(e.state is DeliveryState.PENDING for e in entries)
    assert all((e.parts_done, e.attempts, e.run_id) == (0, 0, run_id) for e in entries)
    assert len({e.key for e in entries}) == 2
    assert await store.undelivered() == entries
    # Only the first report counts, replies included: a second call records
    # nothing and hands back the first call's entries still pending.
    again = await store.finish_run(
        RunEnding(run_id, RunReport(RunStatus.FAILED), 130.0, [answer("x")])
    )
    assert again == entries
    assert await store.undelivered() == entries


async def test_finish_run_keeps_the_session_in_the_same_transaction(
    store: InspectableStore,
) -> None:
    messages = await accept_many(store, 3)

    async def started(run_id: str, index: int) -> RunId:
        await store.start_run(RunId(run_id), Batch(ROOM, (messages[index],)), 110.0)
        return RunId(run_id)

    first = await started("run-1", 0)
    report = RunReport(RunStatus.SUCCEEDED, session_id=SessionId("s-1"))
    await store.finish_run(RunEnding(first, report, 120.0, keep_session=True))
    assert await store.get_session(ROOM) == SessionId("s-1")
    # Not kept (a !reset came during the run), or no session: the room's stays as it is.
    second = await started("run-2", 1)
    other = RunReport(RunStatus.SUCCEEDED, session_id=SessionId("s-2"))
    await store.finish_run(RunEnding(second, other, 130.0))
    assert await store.get_session(ROOM) == SessionId("s-1")
    third = await started("run-3", 2)
    await store.finish_run(RunEnding(third, RunReport(RunStatus.FAILED), 140.0, keep_session=True))
    assert await store.get_session(ROOM) == SessionId("s-1")
    # Only the first report counts, the session too.
    await store.finish_run(RunEnding(first, other, 150.0, keep_session=True))
    assert await store.get_session(ROOM) == SessionId("s-1")


async def test_a_run_outcome_with_unstorable_text_records_nothing(
    store: InspectableStore,
) -> None:
    run_id = await started_run(store)
    with pytest.raises(StoreError):
        await store.finish_run(
            RunEnding(
                run_id, RunReport(RunStatus.SUCCEEDED), 120.0, [answer("half an emoji \ud83d")]
            )
        )
    assert (await store.get_run(run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert await store.undelivered() == []


async def test_delivery_progress_attempts_and_end(store: InspectableStore) -> None:
    [entry, other] = await store.enqueue([answer("a"), answer("b")], 5.0)
    assert entry.run_id is None
    await store.delivery_progress(entry.id, 2)
    await store.delivery_progress(entry.id, 1)  # a late report never goes back
    await store.delivery_attempted(entry.id, 9.0)
    [now, _] = await store.undelivered()
    assert (now.parts_done, now.attempts, now.next_attempt_at) == (2, 1, 9.0)
    assert now.key == entry.key
    await store.delivery_finished(entry.id, DeliveryState.DELIVERED, 10.0)
    await store.delivery_finished(other.id, DeliveryState.FAILED, 10.0)
    assert await store.undelivered() == []
    with pytest.raises(StoreError):
        await store.delivery_progress(12345, 1)


async def test_prune_keeps_pending_deliveries(store: InspectableStore) -> None:
    [done, pending] = await store.enqueue([answer("a"), answer("b")], 5.0)
    await store.delivery_finished(done.id, DeliveryState.DELIVERED, 6.0)
    assert await store.prune(older_than=100.0) == 1
    assert [e.id for e in await store.undelivered()] == [pending.id]


# What !retry offers


async def fail(
    store: InspectableStore,
    run_id: str,
    messages: list[Message],
    status: RunStatus = RunStatus.FAILED,
    at: float = 300.0,
) -> RunId:
    rid = await start(store, run_id, messages, at=at - 1)
    await store.finish_run(RunEnding(rid, RunReport(status=status), at))
    return rid


async def offered(store: InspectableStore, room: RoomKey = ROOM) -> list[RunId]:
    return [r.id for r in await store.retryable_runs(room)]


@pytest.mark.parametrize("status", [s for s in RunStatus if s is not RunStatus.RUNNING])
async def test_retryable_status_is_offered(store: InspectableStore, status: RunStatus) -> None:
    [a] = await accept_many(store, 1)
    rid = await fail(store, "r1", [a], status)
    assert await offered(store) == ([rid] if status.retryable else [])
    assert await offered(store, OTHER_ROOM) == []


async def test_offer_survives_recovered_messages_but_not_a_later_conversation(
    store: InspectableStore,
) -> None:
    interrupted = await accept(store, "$1", at=100.0)
    queued = await accept(store, "$2", at=101.0)  # waiting when the bridge died
    r1 = await fail(store, "r1", [interrupted], RunStatus.INTERRUPTED, at=300.0)
    # The re-queued message runs first, and succeeds: the offer stands.
    await fail(store, "r2", [queued], RunStatus.SUCCEEDED, at=310.0)
    assert await offered(store) == [r1]
    # A later conversation in another room changes nothing here.
    elsewhere = await accept(store, "$3", at=400.0, room=OTHER_ROOM)
    await fail(store, "r3", [elsewhere], RunStatus.SUCCEEDED, at=410.0)
    assert await offered(store) == [r1]
    # A message sent after the run ended fails: the offer stands too.
    later = await accept(store, "$4", at=400.0)
    r4 = await fail(store, "r4", [later], RunStatus.FAILED, at=420.0)
    assert await offered(store) == [r1, r4]
    # One sent after both ended succeeds: the user moved on.
    moved_on = await accept(store, "$5", at=500.0)
    await fail(store, "r5", [moved_on], RunStatus.SUCCEEDED, at=510.0)
    assert await offered(store) == []


async def test_requeue_run_takes_the_failed_messages_once(store: InspectableStore) -> None:
    msgs = await accept_many(store, 2)
    other = await accept(store, "$other")
    r1 = await fail(store, "r1", msgs)
    r2 = await fail(store, "r2", [other], RunStatus.TIMED_OUT, at=301.0)
    assert await offered(store) == [r1, r2]

    assert await store.requeue_run(r1) == msgs
    assert await store.pending_messages() == msgs
    assert await offered(store) == [r2]  # while re-queued, not offered twice
    assert await store.requeue_run(r1) == []
    assert await store.requeue_run(RunId("nope")) == []

    # The retry fails again: now the retry is offered, not the original.
    r3 = await fail(store, "r3", msgs, at=400.0)
    assert await offered(store) == [r2, r3]
    assert await store.requeue_run(r1) == []


async def test_requeue_run_refuses_a_run_the_room_moved_past(store: InspectableStore) -> None:
    # The rule of the offer is the rule of the re-queue: whoever asks (`!retry RUN`, the
    # retry after a usage limit), a run no longer offered is not run again.
    [limited] = await accept_many(store, 1)
    r1 = await fail(store, "r1", [limited], at=300.0)
    moved_on = await accept(store, "$later", at=400.0)
    await fail(store, "r2", [moved_on], RunStatus.SUCCEEDED, at=410.0)
    assert await offered(store) == []
    assert await store.requeue_run(r1) == []
    assert await store.message_states([limited.id]) == {limited.id: MessageState.FAILED}


async def test_dropped_messages_withdraw_the_offer(store: InspectableStore) -> None:
    msgs = await accept_many(store, 2)
    r1 = await fail(store, "r1", msgs)
    requeued = await store.requeue_run(r1)
    await store.mark_dropped([m.id for m in requeued], BOB, 310.0)
    assert await offered(store) == []


# Edits and deletions of pending messages


async def test_pending_message_by_transport_id(store: InspectableStore) -> None:
    a = await accept(store, "$1")
    b = await accept(store, "$1", room=OTHER_ROOM)
    assert await store.pending_message(ROOM, ExternalMessageId("$1")) == a
    assert await store.pending_message(OTHER_ROOM, ExternalMessageId("$1")) == b
    assert await store.pending_message(SLACK_ROOM, ExternalMessageId("$1")) is None
    assert await store.pending_message(ROOM, ExternalMessageId("$2")) is None
    await start(store, "r1", [a])
    assert await store.pending_message(ROOM, ExternalMessageId("$1")) is None


async def test_edit_pending_replaces_the_text_once(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    edited = await store.edit_pending(a.id, "better", ALICE, 150.0)
    assert edited is not None
    assert (edited.id, edited.text, edited.external_id) == (a.id, "better", a.external_id)
    assert await store.pending_messages() == [edited, b]
    assert await store.messages([a.id]) == [edited]
    # Redelivered: nothing changes, no second audit row.
    assert await store.edit_pending(a.id, "better", ALICE, 151.0) is None
    trail = await store.audit_trail(AuditFilter(message_id=a.id))
    assert [(r.action, r.actor, r.at, r.detail) for r in trail] == [
        (AuditAction.MESSAGE_ACCEPTED, ALICE, 100.0, ""),
        (AuditAction.MESSAGE_EDITED, ALICE, 150.0, ""),
    ]
    assert "better" not in str(trail)  # the audit trail never holds message text


async def test_edit_or_delete_after_dispatch_changes_nothing(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    rid = await start(store, "r1", [a])
    assert await store.edit_pending(a.id, "too late", ALICE, 250.0) is None
    assert await store.delete_pending(a.id, BOB, 250.0) is None
    await store.finish_run(RunEnding(rid, RunReport(status=RunStatus.FAILED), 260.0))
    assert await store.edit_pending(a.id, "too late", ALICE, 270.0) is None
    assert await store.delete_pending(a.id, BOB, 270.0) is None
    assert await store.edit_pending(MessageId(10_000), "x", ALICE, 270.0) is None
    assert await store.delete_pending(MessageId(10_000), BOB, 270.0) is None
    assert await store.messages([a.id]) == [a]
    assert await store.message_states([a.id, b.id]) == {
        a.id: MessageState.FAILED,
        b.id: MessageState.PENDING,
    }
    assert not {AuditAction.MESSAGE_EDITED, AuditAction.MESSAGE_DELETED} & set(
        actions(await store.audit_trail())
    )


async def test_delete_pending_drops_it_once(store: InspectableStore) -> None:
    a, b = await accept_many(store, 2)
    deleted = await store.delete_pending(a.id, BOB, 150.0)
    assert deleted == a
    assert await store.pending_messages() == [b]
    assert await store.message_states([a.id]) == {a.id: MessageState.DROPPED}
    assert await store.pending_message(ROOM, a.external_id) is None
    assert await store.delete_pending(a.id, BOB, 151.0) is None
    assert await store.edit_pending(a.id, "after", ALICE, 152.0) is None
    trail = await store.audit_trail(AuditFilter(message_id=a.id))
    assert [(r.action, r.actor, r.at) for r in trail] == [
        (AuditAction.MESSAGE_ACCEPTED, ALICE, 100.0),
        (AuditAction.MESSAGE_DELETED, BOB, 150.0),
    ]
    # A redelivery of the deleted message is still a duplicate: it never comes back.
    assert await store.accept(inbound(str(a.external_id)), 160.0) is None


# The registry of live runs

BEYOND_32_BITS = 2**40
"""Supervisor start times and journal offsets are big integers on every backend."""


def live(run_id: RunId, n: int = 1) -> LiveRun:
    """A supervisor's whereabouts; ``n`` tells one registration from another."""
    return LiveRun(
        run_id=run_id,
        supervisor_pid=1000 + n,
        supervisor_start=BEYOND_32_BITS + n,
        claude_pid=2000 + n,
        run_dir=f"/var/lib/chatbridge/runs/{run_id}/{n}",
        host=f"host-{n}",
    )


async def test_a_registered_run_is_listed_with_its_room_and_pid(store: InspectableStore) -> None:
    [message] = await accept_many(store, 1)
    other = await accept(store, "$s", room=SLACK_ROOM)
    first = await start(store, "run-1", [message])
    second = await start(store, "run-2", [other])
    await store.register_live_run(live(first), 210.0)
    await store.register_live_run(live(second, 2), 211.0)
    assert await store.live_runs() == [
        RegisteredRun(live(first), ROOM, 0, 210.0),
        # The room is the run's, told apart from ROOM by its transport alone.
        RegisteredRun(live(second, 2), SLACK_ROOM, 0, 211.0),
    ]
    run = await store.get_run(first)
    assert run is not None
    assert (run.pid, run.status) == (2001, RunStatus.RUNNING)


async def test_a_reattach_replaces_the_row_and_keeps_the_delivered_offset(
    store: InspectableStore,
) -> None:
    rid = await started_run(store)
    await store.register_live_run(live(rid, 1), 210.0)
    await store.set_delivered_offset(rid, 500)
    await store.register_live_run(live(rid, 2), 300.0)
    # What the room saw stays seen: a reattach must not show it again.
    assert await store.live_runs() == [RegisteredRun(live(rid, 2), ROOM, 500, 300.0)]
    run = await store.get_run(rid)
    assert run is not None
    assert run.pid == live(rid, 2).claude_pid


async def test_an_unregistered_run_stays_running_with_no_row_and_no_pid(
    store: InspectableStore,
) -> None:
    """A try of the run whose claude is gone is undone: as if never registered."""
    rid = await started_run(store)
    other = await start(store, "run-other", [await accept(store, "$other")])
    await store.register_live_run(live(rid, 1), 210.0)
    await store.register_live_run(live(other, 2), 211.0)
    await store.unregister_live_run(rid)
    assert await store.live_runs() == [RegisteredRun(live(other, 2), ROOM, 0, 211.0)]
    run = await store.get_run(rid)
    assert run is not None
    assert (run.pid, run.status) == (None, RunStatus.RUNNING)
    await store.unregister_live_run(rid)  # (again: nothing to do)
    await store.unregister_live_run(RunId("nope"))
    # A run that ended keeps what its end recorded.
    await store.finish_run(RunEnding(other, RunReport(RunStatus.SUCCEEDED), 220.0))
    await store.unregister_live_run(other)
    ended = await store.get_run(other)
    assert ended is not None
    assert (ended.pid, ended.status) == (2002, RunStatus.SUCCEEDED)


async def test_registering_a_run_that_is_not_running_raises_and_records_nothing(
    store: InspectableStore,
) -> None:
    with pytest.raises(StoreError):
        await store.register_live_run(live(RunId("nope")), 210.0)
    assert await store.get_run(RunId("nope")) is None
    finished = await started_run(store)
    await store.finish_run(RunEnding(finished, RunReport(RunStatus.SUCCEEDED), 220.0))
    with pytest.raises(StoreError):
        await store.register_live_run(live(finished), 230.0)
    assert await store.live_runs() == []
    run = await store.get_run(finished)
    assert run is not None
    assert (run.pid, run.status) == (None, RunStatus.SUCCEEDED)


async def test_registering_again_after_the_end_raises(store: InspectableStore) -> None:
    """A reattach that lost the race with the run's end must not bring its row back."""
    rid = await started_run(store)
    await store.register_live_run(live(rid, 1), 210.0)
    await store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED), 220.0))
    with pytest.raises(StoreError):
        await store.register_live_run(live(rid, 2), 230.0)
    assert await store.live_runs() == []
    run = await store.get_run(rid)
    assert run is not None
    assert run.pid == live(rid, 1).claude_pid


async def test_the_delivered_offset_only_rises(store: InspectableStore) -> None:
    rid = await started_run(store)
    await store.register_live_run(live(rid), 210.0)
    await store.set_delivered_offset(rid, 100)
    await store.set_delivered_offset(rid, 50)  # a late report never goes back
    [registered] = await store.live_runs()
    assert registered.delivered_offset == 100
    await store.set_delivered_offset(rid, BEYOND_32_BITS)
    [registered] = await store.live_runs()
    assert registered.delivered_offset == BEYOND_32_BITS


async def test_the_delivered_offset_of_a_run_not_registered_is_ignored(
    store: InspectableStore,
) -> None:
    running = await started_run(store)  # running, never registered
    await store.set_delivered_offset(running, 100)
    await store.set_delivered_offset(RunId("nope"), 100)
    assert await store.live_runs() == []
    # Nor does it linger to be picked up by a later registration.
    await store.register_live_run(live(running), 210.0)
    [registered] = await store.live_runs()
    assert registered.delivered_offset == 0


async def test_finish_run_removes_the_row_also_when_retried(store: InspectableStore) -> None:
    messages = await accept_many(store, 2)
    interrupted = await start(store, "run-1", [messages[0]])
    going_on = await start(store, "run-2", [messages[1]])
    await store.register_live_run(live(interrupted, 1), 210.0)
    await store.register_live_run(live(going_on, 2), 211.0)
    # Recovery reports a run whose supervisor is gone as interrupted.
    entries = await store.finish_run(
        RunEnding(interrupted, RunReport(RunStatus.INTERRUPTED), 220.0, [answer("cut short")])
    )
    assert [r.live.run_id for r in await store.live_runs()] == [going_on]
    # A retry after a lost acknowledgement: the same answer, the registry as it was.
    again = await store.finish_run(RunEnding(interrupted, RunReport(RunStatus.INTERRUPTED), 221.0))
    assert again == entries
    assert [r.live.run_id for r in await store.live_runs()] == [going_on]
    await store.finish_run(RunEnding(going_on, RunReport(RunStatus.SUCCEEDED), 230.0))
    assert await store.live_runs() == []


async def test_runs_ending_together_all_leave_the_registry(store: InspectableStore) -> None:
    """On the SQL stores these ends share one transaction (group commit)."""
    messages = await accept_many(store, 5)
    runs = [await start(store, f"run-{i}", [m]) for i, m in enumerate(messages)]
    for i, rid in enumerate(runs):
        await store.register_live_run(live(rid, i), 210.0 + i)
    await asyncio.gather(
        *(
            store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED), 220.0))
            for rid in runs[:4]
        )
    )
    assert [r.live.run_id for r in await store.live_runs()] == [runs[4]]


async def test_live_runs_come_oldest_registration_first(store: InspectableStore) -> None:
    messages = await accept_many(store, 4)
    a, b, c, d = [await start(store, f"run-{i}", [m]) for i, m in enumerate(messages)]
    # Registered out of start order; b and c at the same time.
    await store.register_live_run(live(d), 230.0)
    await store.register_live_run(live(c), 220.0)
    await store.register_live_run(live(b), 220.0)
    await store.register_live_run(live(a), 240.0)

    async def order() -> list[RunId]:
        return [r.live.run_id for r in await store.live_runs()]

    # A tie goes by start order.
    assert await order() == [b, c, d, a]
    # A reattach is a registration of its own.
    await store.register_live_run(live(b, 2), 250.0)
    assert await order() == [c, d, a, b]


async def test_prune_keeps_registered_runs(store: InspectableStore) -> None:
    old = await accept(store, "$old", at=10.0)
    rid = await start(store, "run-1", [old], at=11.0)
    await store.register_live_run(live(rid), 12.0)
    await store.prune(older_than=500.0)
    assert [r.live.run_id for r in await store.live_runs()] == [rid]
    await store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED), 13.0))
    await store.prune(older_than=500.0)
    assert await store.get_run(rid) is None
    assert await store.live_runs() == []


async def test_a_file_post_is_recorded_once_per_key(store: InspectableStore) -> None:
    post = replace(answer("the comment"), file="/state/files/k/report.txt")
    [entry] = await store.enqueue_once(post, "cbf-one", 10.0)
    assert entry.key == "cbf-one"
    assert entry.reply == post
    assert await store.enqueue_once(post, "cbf-one", 11.0) == []  # seen again: nothing
    await store.delivery_finished(entry.id, DeliveryState.DELIVERED, 12.0)
    assert await store.enqueue_once(post, "cbf-one", 13.0) == []  # also once delivered
    [other] = await store.enqueue_once(post, "cbf-two", 14.0)
    assert other.id > entry.id
    assert [e.key for e in await store.undelivered()] == ["cbf-two"]
    [plain] = await store.enqueue([answer()], 15.0)
    assert plain.reply.file is None
