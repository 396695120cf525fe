"""Replies, edits and status reactions: core types in, Web API calls out."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey
from bridge.core.transport import Delivery, RoomBinding, RunPhase, TransportError
from transports.slack.mrkdwn import to_mrkdwn
from transports.text import split_markdown

log = logging.getLogger(__name__)

PHASE_REACTIONS: Mapping[RunPhase, str] = {
    RunPhase.RECEIVED: "eyes",
    RunPhase.RUNNING: "hourglass_flowing_sand",
    RunPhase.DONE: "white_check_mark",
    RunPhase.FAILED: "x",
    RunPhase.STOPPED: "octagonal_sign",
}

# Errors that mean the reaction is already in the wanted state.
_HARMLESS_REACTION_ERRORS = frozenset({"already_reacted", "no_reaction"})


def _error_code(exc: SlackApiError) -> str:
    response: Any = exc.response
    try:
        return str(response.get("error", "unknown"))
    except AttributeError:
        return "unknown"


class SlackOutbound:
    """Everything the bridge says in Slack, through one Web API client.

    Remembers the last phase reaction it put on each message (bounded), so a
    phase change removes the previous reaction instead of piling them up.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        rooms: Mapping[RoomId, RoomBinding],
        *,
        message_limit: int,
        upload_threshold: int,
        remembered_phases: int = 2048,
    ) -> None:
        self._client = client
        self._rooms = rooms
        self._limit = message_limit
        self._upload_threshold = upload_threshold
        self._phases: OrderedDict[tuple[str, str], RunPhase] = OrderedDict()
        self._remembered = remembered_phases

    def thread_for(self, reply: Reply) -> str | None:
        """The thread a reply goes to: its own, else the batch's if the room answers in threads."""
        if reply.thread:
            return reply.thread
        binding = self._rooms.get(reply.room.room_id)
        if binding is not None and binding.reply_in_thread and reply.anchor:
            return str(reply.anchor)
        return None

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post ``reply``: split below the message limit, or uploaded as a file when long."""
        channel = reply.room.room_id
        thread = self.thread_for(reply)
        if (
            reply.kind is ReplyKind.RESULT
            and self._upload_threshold
            and len(reply.text) > self._upload_threshold
        ):
            return await self._upload(channel, thread, reply.text)
        last: ExternalMessageId | None = None
        for chunk in split_markdown(reply.text, self._limit):
            last = await self._post(channel, thread, to_mrkdwn(chunk))
        return last

    async def _post(self, channel: str, thread: str | None, text: str) -> ExternalMessageId:
        args: dict[str, Any] = {"channel": channel, "text": text, "mrkdwn": True}
        if thread:
            args["thread_ts"] = thread
        response = await self._call("chat.postMessage", **args)
        return ExternalMessageId(str(response["ts"]))

    async def _upload(
        self, channel: str, thread: str | None, text: str
    ) -> ExternalMessageId | None:
        comment = f"The answer is long ({len(text):,} characters), so it is attached as a file."
        args: dict[str, Any] = {
            "channel": channel,
            "content": text,
            "filename": "answer.md",
            "title": "answer.md",
            "initial_comment": comment,
        }
        if thread:
            args["thread_ts"] = thread
        response = await self._call("files_upload_v2", **args)
        return _shared_ts(response, channel)

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace a posted message's text (cut to the message limit: an edit is one message)."""
        chunks = split_markdown(text, self._limit) or [" "]
        await self._call(
            "chat.update", channel=room.room_id, ts=message_id, text=to_mrkdwn(chunks[0])
        )

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """Show ``phase`` as a reaction on each message, replacing the previous phase's."""
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
            while len(self._phases) > self._remembered:
                self._phases.popitem(last=False)

    async def _react(self, method: str, channel: str, ts: str, name: str) -> None:
        try:
            await self._client.api_call(
                method, json={"channel": channel, "timestamp": ts, "name": name}
            )
        except SlackApiError as exc:
            if _error_code(exc) in _HARMLESS_REACTION_ERRORS:
                return
            raise TransportError("slack", f"{method} failed: {_error_code(exc)}") from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError("slack", f"{method} failed: {exc!r}") from exc

    async def _call(self, method: str, **kwargs: Any) -> Mapping[str, Any]:
        """Call a Web API method; Slack's error objects become :class:`TransportError`."""
        try:
            if method == "files_upload_v2":
                response = await self._client.files_upload_v2(**kwargs)
            else:
                response = await self._client.api_call(method, json=kwargs)
        except SlackApiError as exc:
            raise TransportError("slack", f"{method} failed: {_error_code(exc)}") from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError("slack", f"{method} failed: {exc!r}") from exc
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
