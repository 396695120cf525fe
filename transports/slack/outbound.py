"""Replies, edits, status reactions and file downloads: core types in, Web API calls out.

A ``429`` becomes :class:`RateLimited` (nothing here sleeps), a refusal no retry can help
:class:`Undeliverable`, anything else :class:`TransportError`. Replies are idempotent: every
part carries metadata naming its delivery key and index, and when an earlier attempt's
outcome is unknown the recent messages are searched before posting again
(docs/deployment.md, "Slack app").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bridge.core import stages
from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    UserId,
)
from bridge.core.transport import (
    TOOL_ASKED,
    ApprovalAction,
    Asked,
    Delivery,
    Outbound,
    RateLimited,
    RoomBinding,
    RunPhase,
    TransportError,
    Undeliverable,
)
from transports.slack.approvals import approval_fits, closed_blocks, fitted, request_blocks
from transports.slack.files import STUB_PREFIX, attachments, download, may_have_token
from transports.slack.inbound import SLACK
from transports.slack.mrkdwn import to_mrkdwn
from transports.slack.settings import SlackSettings
from transports.slack.web import AUTH_ERRORS, error_code, retry_after_seconds
from transports.text import split_markdown

log = logging.getLogger(__name__)

PHASE_REACTIONS: Mapping[RunPhase, str] = {
    RunPhase.RECEIVED: "eyes",
    RunPhase.RUNNING: "hourglass_flowing_sand",
    RunPhase.DONE: "white_check_mark",
    RunPhase.FAILED: "x",
    RunPhase.STOPPED: "octagonal_sign",
}
ASSISTANT_STATUS = {
    RunPhase.RECEIVED: "is reading your message…",
    RunPhase.RUNNING: "is working on it…",
}
"""An assistant thread's status line per phase; the others clear it (the answer is there)."""

METADATA_EVENT = "chatbridge_reply_part"
"""``metadata.event_type`` of every part of a reply posted with a delivery key."""

# Errors that mean the reaction is already in the wanted state.
_HARMLESS_REACTION_ERRORS = frozenset({"already_reacted", "no_reaction"})
# Slack's answers that no retry of the same call can change.
PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "msg_too_long",
        "no_text",
        "too_many_attachments",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        "cannot_reply_to_message",
        "thread_locked",
        "invalid_blocks",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "metadata_too_large",
        "message_not_found",
        "cant_update_message",
        "edit_window_closed",
        "file_uploads_disabled",
        "file_upload_size_restricted",
        # A malformed call is malformed on every attempt.
        "invalid_arguments",
        "invalid_arg_name",
        "invalid_array_arg",
        "invalid_charset",
        "invalid_form_data",
        "invalid_post_type",
        "missing_post_type",
        "invalid_json",
        "json_not_object",
        "invalid_ts",
        "thread_not_found",
    }
)
# Answers after which the call may still have taken effect.
_UNSURE_ERRORS = frozenset(
    {"request_timeout", "internal_error", "fatal_error", "service_unavailable"}
)
_MIN_PIECE = 40
"""No piece is split below this; five-fold escaping of it still fits any limit (>= 200)."""
LOOKUP_PAGES = 5
"""Pages of history searched for parts of an unsure delivery (the residual window)."""
REMEMBERED_PHASES = 2048
"""Messages whose last phase reaction is remembered (to be removed at the next phase)."""
REMEMBERED_DELIVERIES = 4096
"""Delivery keys remembered as tried in this process."""


class OutcomeUnknown(TransportError):
    """The call failed in a way that leaves open whether Slack carried it out."""


def translate(method: str, exc: Exception) -> TransportError:
    """A Web API failure as the transport contract's error."""
    if isinstance(exc, SlackApiError):
        response: Any = exc.response
        status = getattr(response, "status_code", 200)
        code = error_code(exc)
        if status == 429 or code == "ratelimited":
            headers = getattr(response, "headers", None) or {}
            return RateLimited("slack", retry_after_seconds(headers), f"{method} rate limited")
        if code in AUTH_ERRORS:
            # Loud: every answer is being lost until someone fixes the app.
            log.error(
                "slack refused the bot's token for %s (%s): the bot cannot post until the"
                " token or the app's scopes are fixed and the bridge restarted",
                method,
                code,
            )
            return Undeliverable("slack", f"{method} refused: {code}")
        if code in PERMANENT_ERRORS:
            return Undeliverable("slack", f"{method} refused: {code}")
        if status >= 500 or code in _UNSURE_ERRORS:
            return OutcomeUnknown("slack", f"{method} failed: {code} (HTTP {status})")
        return TransportError("slack", f"{method} failed: {code}")
    return OutcomeUnknown("slack", f"{method} failed: {exc!r}")


@dataclass(frozen=True, slots=True)
class _Part:
    text: str
    """Markdown of this part; the whole reply for an upload."""
    upload: bool = False


class SlackOutbound(Outbound):
    """Everything the bridge says in Slack, and the files it fetches, through one Web API
    client (its token and URL).

    Remembers the last phase reaction it put on each message (bounded), so a
    phase change removes the previous reaction instead of piling them up,
    and which delivery keys it has already tried in this process (bounded),
    so only a delivery with an unknown earlier outcome costs a history lookup.
    """

    name = SLACK

    def __init__(
        self,
        client: AsyncWebClient,
        rooms: Mapping[RoomId, RoomBinding],
        settings: SlackSettings,
    ) -> None:
        """``settings``: the message limit, the upload threshold and ``assistant``."""
        self._client = client
        self._rooms = rooms
        self._settings = settings
        self._assistant = settings.assistant
        """Status lines for phases; turned off for good once Slack refuses one."""
        self._phases: OrderedDict[tuple[str, str], RunPhase] = OrderedDict()
        # key -> True when every earlier attempt in this process ended in a
        # known outcome; False when one may have posted without our knowing.
        self._tried: OrderedDict[str, bool] = OrderedDict()
        self.lookups = 0
        """History lookups made for unsure deliveries (a test hook and a metric)."""

    def thread_for(self, reply: Reply) -> str | None:
        """The thread a reply goes to: its own, else the batch's if the room answers in threads."""
        if reply.thread:
            return reply.thread
        binding = self._rooms.get(reply.room.room_id)
        if binding is not None and binding.reply_in_thread and reply.anchor:
            return str(reply.anchor)
        return None

    def parts(self, reply: Reply) -> list[_Part]:
        """How ``reply`` is sent: the same parts on every attempt (deterministic)."""
        threshold = self._settings.upload_threshold
        if reply.kind is ReplyKind.RESULT and threshold and len(reply.text) > threshold:
            return [_Part(reply.text, upload=True)]
        return [_Part(chunk) for chunk in self._chunks(reply.text)]

    def _chunks(self, text: str) -> list[str]:
        """``text`` in pieces whose rendering (mrkdwn, escaped) fits the message limit.

        Escaping grows text (``&`` is sent as ``&amp;``, five characters), so
        a piece is measured as sent; one that does not fit is split again,
        smaller by the growth it showed. Deterministic, like the split itself.
        """
        limit = self._settings.message_limit
        pending = split_markdown(text, limit)
        chunks: list[str] = []
        while pending:
            chunk = pending.pop(0)
            sent = len(to_mrkdwn(chunk))
            if sent <= limit or len(chunk) <= _MIN_PIECE:
                chunks.append(chunk)
                continue
            smaller = max(_MIN_PIECE, min(len(chunk) - 1, len(chunk) * limit // sent))
            pending[:0] = split_markdown(chunk, smaller)
        return chunks

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post ``reply``: split below the message limit, or uploaded as a file when long.

        With ``delivery``: parts before ``parts_done`` are skipped, each part
        posted is reported through ``part_sent``, and a part an earlier
        attempt may have posted is looked up first instead of posted twice.
        Returns the last part's ts.
        """
        channel = reply.room.room_id
        thread = self.thread_for(reply)
        parts = self.parts(reply)
        start = delivery.parts_done if delivery is not None else 0
        found: dict[int, ExternalMessageId] = {}
        if delivery is not None and start < len(parts) and self._unsure(delivery.key):
            found = await self._find_parts(channel, thread, delivery.key)
            stages.stamp("history_looked_up")
        last: ExternalMessageId | None = None
        for index in range(start, len(parts)):
            if delivery is not None:
                # From here until the outbox has recorded this part, the
                # outcome is open: a post that fails unclearly, is cancelled
                # (it may have reached Slack), or whose record fails leaves
                # the key unsure, and the next attempt looks history up first.
                self._tried_with(delivery.key, known=False)
            ts = found.get(index)
            if ts is None:
                try:
                    ts = await self._send_part(channel, thread, parts[index], delivery, index)
                except OutcomeUnknown:
                    raise
                except TransportError:
                    # Slack answered, refusing: nothing was posted.
                    if delivery is not None:
                        self._tried_with(delivery.key, known=True)
                    raise
            if delivery is not None:
                await delivery.part_sent(index, ts)
                self._tried_with(delivery.key, known=True)
            last = ts
        return last

    def _unsure(self, key: str) -> bool:
        """Whether an attempt this process knows nothing about may have posted parts.

        A key not tried in this process may be a retry after a restart, so
        it is looked up once; after that only an unknown outcome looks again.
        """
        return not self._tried.get(key, False)

    def _tried_with(self, key: str, known: bool) -> None:
        self._tried[key] = known
        self._tried.move_to_end(key)
        while len(self._tried) > REMEMBERED_DELIVERIES:
            self._tried.popitem(last=False)

    async def _send_part(
        self,
        channel: str,
        thread: str | None,
        part: _Part,
        delivery: Delivery | None,
        index: int,
    ) -> ExternalMessageId:
        if part.upload:
            name = _upload_name(delivery.key if delivery is not None else None)
            return await self._upload(channel, thread, part.text, name)
        return await self._post(channel, thread, to_mrkdwn(part.text), delivery, index)

    async def _post(
        self,
        channel: str,
        thread: str | None,
        text: str,
        delivery: Delivery | None = None,
        index: int = 0,
    ) -> ExternalMessageId:
        args: dict[str, Any] = {"mrkdwn": True}
        if delivery is not None:
            args["metadata"] = {
                "event_type": METADATA_EVENT,
                "event_payload": {"key": delivery.key, "part": index},
            }
        response = await self._as_written("chat.postMessage", channel, text, thread=thread, **args)
        return ExternalMessageId(str(response["ts"]))

    async def _find_parts(
        self, channel: str, thread: str | None, key: str
    ) -> dict[int, ExternalMessageId]:
        """Parts of delivery ``key`` already in the conversation, by index."""
        self.lookups += 1
        found: dict[int, ExternalMessageId] = {}
        upload_name = _upload_name(key)
        args: dict[str, Any] = {"channel": channel, "include_all_metadata": True, "limit": 200}
        method = "conversations.history"
        if thread:
            method = "conversations.replies"
            args["ts"] = thread
        for _ in range(LOOKUP_PAGES):
            response = await self._call(method, **args)
            for message in response.get("messages") or ():
                index = _part_index(message, key, upload_name)
                if index is not None and "ts" in message:
                    found.setdefault(index, ExternalMessageId(str(message["ts"])))
            cursor = (response.get("response_metadata") or {}).get("next_cursor")
            if not cursor or not response.get("has_more", True):
                break
            args["cursor"] = cursor
        if found:
            log.info("slack delivery %s: %d part(s) were already posted", key, len(found))
        self._tried_with(key, known=True)
        return found

    async def _upload(
        self, channel: str, thread: str | None, text: str, name: str
    ) -> ExternalMessageId:
        comment = f"The answer is long ({len(text):,} characters), so it is attached as a file."
        ts = await self._share(channel, thread, name, comment, content=text)
        if ts is None:
            # Uploaded, but Slack did not say where: a retry would find it by name.
            raise OutcomeUnknown("slack", "files_upload_v2 did not report the message ts")
        return ts

    async def _share(
        self, channel: str, thread: str | None, name: str, comment: str, **data: str | bytes
    ) -> ExternalMessageId | None:
        """Upload ``data`` (``content`` or ``file``) as ``name`` into the conversation
        (files upload v2: ``files.getUploadURLExternal``, the upload,
        ``files.completeUploadExternal``); the ts of the message sharing it, if Slack said."""
        args: dict[str, Any] = {"channel": channel, "filename": name, "title": name, **data}
        if comment:
            args["initial_comment"] = comment
        if thread:
            args["thread_ts"] = thread
        response = await self._call("files_upload_v2", **args)
        return _shared_ts(response, channel)

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId:
        """Upload the file ``reply.file`` with ``reply.text`` as its comment (rendered like
        any text), where :meth:`send` would post ``reply``; the ts of the message sharing it.

        Slack has no idempotency key for uploads, and the file keeps its own name, so
        unlike a long answer's upload it cannot be looked up: an attempt whose outcome
        is unknown (a timeout after the upload) may show the file twice.
        """
        path = Path(reply.file or "")
        channel = reply.room.room_id
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise Undeliverable("slack", f"cannot read the file to post: {exc}") from exc
        comment = to_mrkdwn(reply.text) if reply.text else ""
        ts = await self._share(channel, self.thread_for(reply), path.name, comment, file=data)
        # Uploaded and shared even when Slack did not say where: retrying would post it again.
        return ts if ts is not None else ExternalMessageId("")

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace a posted message's text (cut to the message limit: an edit is one message)."""
        await self._as_written("chat.update", room.room_id, self._one_message(text), ts=message_id)

    def _one_message(self, text: str) -> str:
        """``text`` as one message's mrkdwn (cut to the message limit)."""
        chunks = self._chunks(text) or [" "]
        return to_mrkdwn(chunks[0])

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId:
        """Post an approval request with its buttons (see :mod:`.approvals`); returns its ts.

        One message, whatever the length (the buttons belong to one): a long
        text is cut to what a section holds.
        """
        # The notification's text: the same safe rendering as the section's.
        text = fitted(request.text)
        response = await self._as_written(
            "chat.postMessage",
            request.room.room_id,
            text,
            thread=self.thread_for(request),
            blocks=request_blocks(text, ref, asked),
            mrkdwn=True,
        )
        return ExternalMessageId(str(response["ts"]))

    async def answer_action(self, action: ApprovalAction, text: str) -> None:
        """An ephemeral message: only the person who clicked sees it."""
        await self.ephemeral(action.room, action.sender, text)

    async def ephemeral(self, room: RoomKey, user: UserId, text: str) -> None:
        """Post ``text`` in ``room`` (its thread, if any) visible to ``user`` only
        (``chat.postEphemeral``)."""
        await self._as_written(
            "chat.postEphemeral",
            room.room_id,
            self._one_message(text),
            thread=room.thread or None,
            user=user,
        )

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        """Measured as sent: after rendering and escaping (``&`` becomes ``&amp;``)."""
        return approval_fits(text)

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace an approval request by its outcome; the buttons go with the old blocks.

        (``chat.update`` without ``blocks`` would keep the old ones, buttons included.)
        """
        rendered = fitted(text)
        await self._as_written(
            "chat.update", room.room_id, rendered, ts=message_id, blocks=closed_blocks(rendered)
        )

    # set_typing: Slack has no typing indicator for bots; the ``running`` reaction shows activity.

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """Show ``phase``: an assistant's thread status line, else a reaction on each
        message, replacing the previous phase's."""
        if self._assistant and room.thread and await self._status(room, phase):
            return
        name = PHASE_REACTIONS[phase]
        for ts in message_ids:
            key = (room.room_id, str(ts))
            previous = self._phases.get(key)
            if previous is phase:
                continue
            if previous is not None:
                await self._react("reactions.remove", room.room_id, ts, PHASE_REACTIONS[previous])
            await self._react("reactions.add", room.room_id, ts, name)
            self._phases[key] = phase
            self._phases.move_to_end(key)
            while len(self._phases) > REMEMBERED_PHASES:
                self._phases.popitem(last=False)

    async def _status(self, room: RoomKey, phase: RunPhase) -> bool:
        """The thread's status line for ``phase`` (cleared at the end); False when Slack
        refuses it (not an assistant thread, no scope): reactions from then on."""
        status = ASSISTANT_STATUS.get(phase, "")
        try:
            await self._client.api_call(
                "assistant.threads.setStatus",
                json={"channel_id": room.room_id, "thread_ts": room.thread, "status": status},
            )
        except SlackApiError as exc:
            log.warning(
                "assistant.threads.setStatus refused (%s): phases are shown as reactions",
                error_code(exc),
            )
            self._assistant = False
            return False
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise translate("assistant.threads.setStatus", exc) from exc
        return True

    async def _react(self, method: str, channel: str, ts: str, name: str) -> None:
        try:
            await self._client.api_call(
                method, json={"channel": channel, "timestamp": ts, "name": name}
            )
        except SlackApiError as exc:
            if error_code(exc) in _HARMLESS_REACTION_ERRORS:
                return
            raise translate(method, exc) from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise translate(method, exc) from exc

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        """Download a shared file with the bot's token (only from Slack's hosts, see .files)."""
        if attachment.ref.startswith(STUB_PREFIX):
            attachment = await self._file_info(attachment)
        if not may_have_token(attachment.ref, self._client.base_url):
            raise TransportError(SLACK, "the file is not on a Slack host")
        token = self._client.token or ""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=30)) as session:
            await download(session, token, attachment, dest, limit_bytes)

    async def _file_info(self, stub: Attachment) -> Attachment:
        """The attachment a file stub stands for, with its URL (``files.info``)."""
        try:
            response = await self._client.files_info(file=stub.ref.removeprefix(STUB_PREFIX))
        except SlackApiError as exc:
            raise TransportError(SLACK, f"files.info failed: {error_code(exc)}") from exc
        found = attachments({"files": [response.get("file")]})
        if not found or found[0].ref.startswith(STUB_PREFIX):
            raise TransportError(SLACK, "files.info gave no download URL")
        return found[0]

    async def _as_written(
        self, method: str, channel: str, text: str, *, thread: str | None = None, **args: Any
    ) -> Mapping[str, Any]:
        """Call ``method`` with ``text`` shown as written (in ``thread``, if any).

        parse=none and link_names=false: Slack must not turn "@here" or "#general"
        typed as text into a broadcast or a channel link.
        """
        if thread:
            args["thread_ts"] = thread
        return await self._call(
            method, channel=channel, text=text, parse="none", link_names=False, **args
        )

    async def _call(self, method: str, **kwargs: Any) -> Mapping[str, Any]:
        """Call a Web API method; failures become the contract's errors (see :func:`translate`)."""
        try:
            if method == "files_upload_v2":
                response = await self._client.files_upload_v2(**kwargs)
            else:
                response = await self._client.api_call(method, json=kwargs)
        except (SlackApiError, SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise translate(method, exc) from exc
        data: Mapping[str, Any] = response.data if isinstance(response.data, dict) else {}
        return data


def _shared_ts(response: Mapping[str, Any], channel: str) -> ExternalMessageId | None:
    """The ts of the message that shares an uploaded file in ``channel``, if Slack says."""
    for file in response.get("files") or ():
        shares = file.get("shares") or {}
        for visibility in ("public", "private"):
            for share in (shares.get(visibility) or {}).get(channel) or ():
                if "ts" in share:
                    return ExternalMessageId(str(share["ts"]))
    return None


def _upload_name(key: str | None) -> str:
    """The file name of an uploaded answer: carries a digest of the delivery key to find it by."""
    if key is None:
        return "answer.md"
    return f"answer-{hashlib.sha256(key.encode()).hexdigest()[:12]}.md"


def _part_index(message: Mapping[str, Any], key: str, upload_name: str) -> int | None:
    """The part of delivery ``key`` that ``message`` is, if it is one."""
    metadata = message.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get("event_type") == METADATA_EVENT:
        payload = metadata.get("event_payload")
        if isinstance(payload, Mapping) and payload.get("key") == key:
            part = payload.get("part")
            return part if isinstance(part, int) else None
    for file in message.get("files") or ():
        if isinstance(file, Mapping) and upload_name in (file.get("name"), file.get("title")):
            return 0  # an upload is the whole reply
    return None
