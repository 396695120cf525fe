"""``RunControl``: talking to a running claude, and the run's end rule.

The caller creates it and hands it to ``run_claude`` / ``attach_claude``, which bind it once
the supervisor is reached; then it sends user messages, answers permission requests and
makes control requests. The end rule: a run is over when a ``result`` came and every message
sent was taken before it; from the ``eof`` on, :meth:`RunControl.send` raises
:class:`InputClosed`. Its state is fed from the journal, so a reattach rebuilds it
(docs/live-runs.md, "The runner's API (`runner/`)").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.command import control_request, control_response, new_uuid, user_message
from runner.events import (
    ControlAnswer,
    MessageTaken,
    PermissionAsked,
    PermissionCancelled,
    Result,
    StreamEvent,
)

CONTROL_TIMEOUT_S = 10.0
"""How long a control request waits for claude's answer (``initialize`` takes ~270 ms cold)."""


class InputClosed(Exception):
    """The run takes no more input: its stdin was closed (the last result came with
    nothing pending, or claude exited), or it was never bound (a version 1 run)."""


class MessageTooLong(InputClosed):
    """A user message whose line is too long for the run: claude echoes it whole, and an
    echo over ``max_line_bytes`` is unreadable (the run would fail, the message unanswered)."""


ECHO_SLACK_BYTES = 16 * 1024
"""What claude's echo of a user message adds to its line (session id, flags...), with room."""


def too_long(line: bytes, max_line_bytes: int) -> bool:
    """Whether claude's echo of the user message ``line`` may exceed ``max_line_bytes``."""
    return len(line) + ECHO_SLACK_BYTES > max_line_bytes


class ControlError(Exception):
    """claude answered a control request with an error, or not in time."""


@dataclass(frozen=True)
class Allow:
    """Let the tool run with ``updated_input``; ``permissions``: rules to add for the
    session (claude's ``suggestions``: "allow for this session")."""

    updated_input: Mapping[str, Any]
    permissions: Sequence[Mapping[str, Any]] = field(default=())


@dataclass(frozen=True)
class Deny:
    """Refuse the tool use; claude sees ``message``."""

    message: str


Decision = Allow | Deny

Writer = Callable[[bytes], bool]
"""Writes whole lines to claude's stdin (through the supervisor); False if it cannot."""


class RunControl:
    """One run's input side: see the module doc. Not thread-safe: use it from the run's loop."""

    def __init__(self, *, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        self._write: Writer | None = None
        self._close: Callable[[], None] | None = None
        self._max_line_bytes: int | None = None
        self._sent: set[str] = set()
        self._taken: set[str] = set()
        self._settled = False
        self._reserved: set[str] = set()
        """Messages promised to the run and not sent yet (see :meth:`reserve`)."""
        self._kept = asyncio.Event()
        """Set while no promise is outstanding."""
        self._kept.set()
        self._attached = asyncio.Event()
        """Set once bound, or unbound (see :meth:`attached`)."""
        self._withdrawn = asyncio.Event()
        """Set when a promise was withdrawn (see :meth:`withdraw`)."""
        self._after_result = False
        """A message was sent or taken since the last result (see :attr:`last_result_answers`)."""
        self._results = 0
        """Results seen so far."""
        self._closed = False
        self._asked: dict[str, PermissionAsked] = {}
        self._answered: set[str] = set()
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # Our request ids are told apart from claude's (and from an earlier bridge's).
        self._prefix = f"cb-{uuid.uuid4().hex[:12]}-"
        self._ids = itertools.count(1)
        self.history_end = 0
        """The journal offset up to which a reattach replays history (0: a run started
        here): the end rule is not acted on before it, so a result there that nothing
        was pending at may still be followed by a message (sent as claude printed it)."""
        self._read = 0

    # -- the caller's side --

    @property
    def accepting(self) -> bool:
        """Whether the run takes input now (bound, stdin still open)."""
        return self._write is not None and not self._closed

    @property
    def pending(self) -> tuple[PermissionAsked, ...]:
        """Permission requests claude waits on, oldest first (rebuilt on a reattach)."""
        return tuple(a for rid, a in self._asked.items() if rid not in self._answered)

    def send(self, text: str, reserved: str | None = None) -> str:
        """Send a user message into the running session; return its uuid.

        claude folds it into the running turn (one result answers both) or
        starts a new turn with it. Raises :class:`InputClosed` once the run
        takes no more input: the caller makes a follow-up run of it instead.
        ``reserved``: the uuid :meth:`reserve` gave for it (its promise is kept now).
        """
        uid = reserved if reserved is not None else new_uuid()
        self._reserved.discard(uid)
        if not self._reserved:
            self._kept.set()
        line = self._line(text, uid)
        self._put(line)
        self._note_sent(uid)
        return uid

    def promise(self, uid: str) -> None:
        """Promise the run a message recorded before this bridge attached to it, before
        it is known whether it was sent (a reattach: :meth:`sent` tells once the journal's
        history is read); the end rule waits for it. :meth:`send` or :meth:`withdraw`
        settles it."""
        self._reserved.add(uid)
        self._kept.clear()

    def sent(self, uid: str) -> bool:
        """Whether the user message ``uid`` was written into the run (by any bridge)."""
        return uid in self._sent

    async def attached(self) -> None:
        """Wait until the run takes input, or never will (bound after the replay, or over)."""
        await self._attached.wait()

    def reserve(self, text: str, uid: str | None = None) -> str:
        """Promise the run the user message ``text``, to be sent later with :meth:`send`
        (after the caller recorded it: record, then send); its uuid. Until then the end
        rule cannot hold (a message is coming), so the run still takes it when it is
        sent, unless its input was closed meanwhile (a stop, claude's exit). Raises
        :class:`InputClosed` (:class:`MessageTooLong`) as :meth:`send` would now.
        ``uid``: the uuid to send it under (one a restart can find again)."""
        uid = uid if uid is not None else new_uuid()
        self._line(text, uid)
        if not self.accepting:
            raise InputClosed("the run takes no more input")
        self._reserved.add(uid)
        self._kept.clear()
        return uid

    def withdraw(self, uid: str) -> None:
        """Take back the promise :meth:`reserve` gave as ``uid``: the message is not sent
        (its record failed). The end rule it held may hold now: the runner looks again
        (:meth:`promise_withdrawn`)."""
        if uid not in self._reserved:
            return
        self._reserved.discard(uid)
        if not self._reserved:
            self._kept.set()
        self._withdrawn.set()

    async def promise_withdrawn(self) -> None:
        """Wait until a promise is withdrawn (the runner's side of :meth:`withdraw`)."""
        await self._withdrawn.wait()
        self._withdrawn.clear()

    @property
    def promised(self) -> bool:
        """A message is promised to the run and not sent yet: a result now may answer
        the run, or an earlier turn (the promise, kept or withdrawn, tells)."""
        return bool(self._reserved)

    @property
    def read_offset(self) -> int:
        """How far the runner has read the run's journal (:meth:`note_read`)."""
        return self._read

    async def promises_kept(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every :meth:`reserve` to be sent; whether they were
        (a run left to its supervisor first lets its promised messages in)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._kept.wait()
        except TimeoutError:
            return False
        return True

    def _line(self, text: str, uid: str) -> bytes:
        line = user_message(text, uid)
        if self._max_line_bytes is not None and too_long(line, self._max_line_bytes):
            # Sent, it would end the run unreadable, this message never answered.
            raise MessageTooLong(f"the message is too long for the run ({len(line)} bytes)")
        return line

    @property
    def messages_sent(self) -> int:
        """User messages written into the run so far (its prompt included)."""
        return len(self._sent)

    def answer(self, request_id: str, decision: Decision) -> bool:
        """Answer claude's permission request; False if it was answered already (or is unknown).

        Raises :class:`InputClosed` if the run takes no more input.
        """
        if request_id not in self._asked or request_id in self._answered:
            return False
        response: dict[str, Any]
        match decision:
            case Allow(updated_input=updated, permissions=permissions):
                response = {"behavior": "allow", "updatedInput": dict(updated)}
                if permissions:
                    response["updatedPermissions"] = [dict(p) for p in permissions]
            case Deny(message=message):
                response = {"behavior": "deny", "message": message}
        self._put(control_response(request_id, response))
        self._answered.add(request_id)
        return True

    async def interrupt(self) -> bool:
        """Abort claude's running turn (it ends with a ``result``, ``terminal_reason``
        ``aborted_tools`` / ``aborted_streaming``); False if the run takes no input."""
        if not self.accepting:
            return False
        await self.request("interrupt")
        return True

    def set_model(self, name: str) -> Coroutine[Any, Any, dict[str, Any]]:
        """Switch the session's model from the next request on; "" goes back to claude's
        default (the request without a model, as the CLI takes it). Written at once
        (see :meth:`start`); await the result for claude's answer."""
        if name:
            return self.start("set_model", model=name)
        return self.start("set_model")

    def set_permission_mode(self, mode: str) -> Coroutine[Any, Any, dict[str, Any]]:
        """Switch the session's permission mode (``default``, ``acceptEdits``, ``plan``...);
        written at once, as :meth:`set_model`."""
        return self.start("set_permission_mode", mode=mode)

    async def request(self, subtype: str, **fields: object) -> dict[str, Any]:
        """A control request; claude's answer. Raises :class:`ControlError` on an error
        answer or none within the timeout, :class:`InputClosed` if the run takes no input."""
        return await self.start(subtype, **fields)

    def start(self, subtype: str, **fields: object) -> Coroutine[Any, Any, dict[str, Any]]:
        """Write a control request now (:class:`InputClosed` now if the run takes no
        input); the awaitable returned gives claude's answer as :meth:`request` does.

        A caller that must not wait on claude (a command, in the intake) writes
        the request and leaves the answer to a task of its own: a claude that
        stops answering then holds up nothing else.
        """
        request_id, future = self._begin(subtype, **fields)
        return self._answer_of(subtype, request_id, future)

    async def _answer_of(
        self, subtype: str, request_id: str, future: asyncio.Future[dict[str, Any]]
    ) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await future
        except TimeoutError:
            raise ControlError(
                f"claude did not answer {subtype} within {self._timeout_s:g} s"
            ) from None
        finally:
            self._waiting.pop(request_id, None)

    def interrupt_now(self) -> None:
        """Write an ``interrupt`` at once, without waiting for its answer: what is sent
        next goes in after it (claude ends the running turn, then takes that as a new
        one). Raises :class:`InputClosed` if the run takes no input."""
        request_id, future = self._begin("interrupt")

        def forget(done: asyncio.Future[dict[str, Any]]) -> None:
            self._waiting.pop(request_id, None)
            if not done.cancelled():
                done.exception()  # an error answer only means there was no turn to end

        future.add_done_callback(forget)

    def _begin(self, subtype: str, **fields: object) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        request_id = f"{self._prefix}{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._put(control_request(request_id, subtype, **fields))
        self._waiting[request_id] = future
        return request_id, future

    def _put(self, line: bytes) -> None:
        if self._write is None or self._closed or not self._write(line):
            raise InputClosed("the run takes no more input")

    # -- the runner's side --

    def bind(
        self, write: Writer, close: Callable[[], None], *, max_line_bytes: int | None = None
    ) -> None:
        """The runner reached the run's supervisor (protocol version 2): input goes there.
        ``max_line_bytes``: the run's cap on a stdout line (a message's echo is one)."""
        self._write, self._close = write, close
        self._max_line_bytes = max_line_bytes
        self._attached.set()

    def unbind(self) -> None:
        """The run is over (or left to its supervisor): no more input, nobody answers."""
        self._closed = True
        self._write = self._close = None
        self._attached.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ControlError("the run ended"))

    @property
    def replaying(self) -> bool:
        """A reattach still reads the journal's history: what the run took is not known
        yet (its stdin may have been closed while no bridge was there)."""
        return self._read < self.history_end

    def note_read(self, offset: int) -> None:
        """The journal was read up to ``offset``."""
        self._read = offset

    @property
    def settled(self) -> bool:
        """A result came after every message sent was taken, none is promised
        (:meth:`reserve`), and stdin is still open."""
        return self._settled and not self._closed and not self._reserved

    @property
    def last_result_answers(self) -> bool:
        """No message was sent, nor taken by claude, after the last result: that result
        answers all the run was given (a message taken after it began a turn whose
        result did not come; one sent after it was not answered)."""
        return not self._after_result

    @property
    def closed(self) -> bool:
        return self._closed

    def close_input(self) -> None:
        """End the run's input (the end rule held): ``eof`` to claude."""
        close = self._close
        self._closed = True
        if close is not None:
            close()

    def note_closed(self) -> None:
        """claude's stdin was closed (``stdin_closed``: ours, the supervisor's, or its exit)."""
        self._closed = True

    def note_in(self, payload: bytes) -> None:
        """Lines written to claude's stdin, from the journal (``in``): ours again, or an
        earlier bridge's, which rebuilds what it sent and answered."""
        for line in payload.split(b"\n"):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            kind = obj.get("type")
            if kind == "user" and isinstance(obj.get("uuid"), str):
                self._note_sent(obj["uuid"])
            elif kind == "control_response":
                response = obj.get("response")
                if isinstance(response, dict) and isinstance(response.get("request_id"), str):
                    self._answered.add(response["request_id"])

    def note(self, event: StreamEvent) -> None:
        """An event of claude's stdout, in the journal's order."""
        match event:
            case MessageTaken(uuid=uid):
                self._taken.add(uid)
                self._after_result = True
            case Result():
                self._results += 1
                self._settled = self._sent <= self._taken
                self._after_result = False
            case PermissionAsked(request_id=request_id):
                self._asked[request_id] = event
            case PermissionCancelled(request_id=request_id):
                self._answered.add(request_id)  # withdrawn: nothing to answer any more
            case ControlAnswer(request_id=request_id) if request_id in self._waiting:
                future = self._waiting[request_id]
                if not future.done():
                    if event.ok:
                        future.set_result(event.response)
                    else:
                        future.set_exception(ControlError(event.error or "error"))
            case _:
                pass  # an echo of an answer of ours, or of an earlier bridge's request

    def _note_sent(self, uid: str) -> None:
        if uid in self._sent:
            return
        first = not self._sent
        self._sent.add(uid)
        if first and self._results:
            # The run's own prompt, recorded only after claude's result (the
            # supervisor records a message once all of it is through, and a big
            # one may still be arriving): that result can only answer it, since
            # claude had nothing else. Not a message sent after the answer.
            self._taken.add(uid)
            return
        self._settled = False
        self._after_result = True
