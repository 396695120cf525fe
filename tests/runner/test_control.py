"""RunControl alone: the end rule's bookkeeping, answers, control requests (no process)."""

from __future__ import annotations

import asyncio
import json

import pytest

from runner import Allow, ControlError, Deny, InputClosed, RunControl
from runner.command import control_response, user_message
from runner.events import ControlAnswer, MessageTaken, PermissionAsked, PermissionCancelled, Result

RESULT = Result("success", False, "ok", None, None, None, None, ())


def asked(request_id: str) -> PermissionAsked:
    return PermissionAsked(request_id, "Bash", {"command": "touch x"}, "toolu_1", "", ())


def bound() -> tuple[RunControl, list[bytes], list[str]]:
    control = RunControl(timeout_s=0.2)
    written: list[bytes] = []
    closed: list[str] = []

    def write(line: bytes) -> bool:
        written.append(line)
        control.note_in(line)  # as the journal's ``in`` record brings it back
        return True

    control.bind(write, lambda: closed.append("eof"))
    return control, written, closed


def test_unbound_takes_no_input() -> None:
    control = RunControl()
    assert not control.accepting
    with pytest.raises(InputClosed):
        control.send("hi")


def test_the_end_rule_waits_for_every_message_to_be_taken() -> None:
    control, _, closed = bound()
    first = control.send("first")
    second = control.send("second")
    control.note(MessageTaken(first))
    control.note(RESULT)  # the second was not taken before it
    assert not control.settled
    control.note(MessageTaken(second))
    assert not control.settled  # taken after the result: its own result is to come
    control.note(RESULT)
    assert control.settled
    control.close_input()
    assert closed == ["eof"]
    assert not control.accepting
    with pytest.raises(InputClosed):
        control.send("late")


def test_a_replayed_journal_rebuilds_the_state() -> None:
    control = RunControl()  # unbound: what a reattach reads before it binds
    control.note_in(user_message("prompt", "u-1"))
    control.note(MessageTaken("u-1"))
    control.note(asked("r-1"))
    control.note(asked("r-2"))
    control.note_in(control_response("r-1", {"behavior": "allow", "updatedInput": {}}))
    control.note(PermissionCancelled("r-2"))
    control.note(asked("r-3"))
    assert control.pending == (asked("r-3"),)
    control.note_in(user_message("steer", "u-2"))
    control.note(RESULT)
    assert not control.settled  # u-2 was never taken


def test_the_prompt_recorded_after_the_result_is_what_the_result_answered() -> None:
    """A big prompt is recorded once all of it has gone through the supervisor; a claude
    that answers without reading it all puts its result first in the journal."""
    control = RunControl()
    control.note(RESULT)
    control.note_in(user_message("a big prompt", "u-1"))
    assert control.last_result_answers
    assert control.settled
    # A message after the answer is one: the next result must answer it.
    control.note_in(user_message("more", "u-2"))
    assert not control.last_result_answers
    assert not control.settled


def test_answers_once_and_as_the_cli_expects() -> None:
    control, written, _ = bound()
    control.note(asked("r-1"))
    control.note(asked("r-2"))
    assert control.answer("r-1", Allow({"command": "ls"}, [{"type": "addRules"}]))
    assert not control.answer("r-1", Deny("twice"))
    assert not control.answer("unknown", Deny("no"))
    assert control.answer("r-2", Deny("not now"))
    first, second = (json.loads(line)["response"] for line in written)
    assert first["response"] == {
        "behavior": "allow",
        "updatedInput": {"command": "ls"},
        "updatedPermissions": [{"type": "addRules"}],
    }
    assert second["response"] == {"behavior": "deny", "message": "not now"}
    assert control.pending == ()


async def test_control_requests_await_their_answer() -> None:
    control, written, _ = bound()
    task = asyncio.create_task(control.set_model("opus"))
    await asyncio.sleep(0)  # the request is written synchronously at the task's start
    request = json.loads(written[-1])
    assert request["request"] == {"subtype": "set_model", "model": "opus"}
    control.note(ControlAnswer("someone-else", True, {}, ""))  # an echo: ignored
    control.note(ControlAnswer(request["request_id"], True, {"model": "opus"}, ""))
    await task

    # No model: back to claude's default (the CLI takes the request without one).
    default = asyncio.create_task(control.set_model(""))
    await asyncio.sleep(0)
    request = json.loads(written[-1])
    assert request["request"] == {"subtype": "set_model"}
    control.note(ControlAnswer(request["request_id"], True, {"model": "claude-x"}, ""))
    await default

    failing = asyncio.create_task(control.set_permission_mode("bogus"))
    await asyncio.sleep(0)
    rid = json.loads(written[-1])["request_id"]
    control.note(ControlAnswer(rid, False, {}, "invalid_mode"))
    with pytest.raises(ControlError, match="invalid_mode"):
        await failing

    with pytest.raises(ControlError, match="did not answer"):
        await control.interrupt()  # nobody answers within the timeout


async def test_a_promised_message_holds_the_end_rule_until_it_is_sent() -> None:
    control, written, _ = bound()
    prompt = control.send("the prompt")
    control.note(MessageTaken(prompt))
    promised = control.reserve("steered")
    assert written == [user_message("the prompt", prompt)]  # nothing written yet
    assert control.messages_sent == 1
    control.note(RESULT)  # the prompt's turn ended while the steered one was recorded
    assert not control.settled  # not the run's end: a message is coming
    assert not await control.promises_kept(0.01)
    assert control.send("steered", promised) == promised
    assert await control.promises_kept(0.01)
    assert written[-1] == user_message("steered", promised)
    control.note(MessageTaken(promised))
    control.note(RESULT)
    assert control.settled


def test_a_promise_is_refused_when_the_run_takes_no_input() -> None:
    control, _, _ = bound()
    control.close_input()
    with pytest.raises(InputClosed):
        control.reserve("too late")
