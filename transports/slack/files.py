"""Files shared in Slack: described from a message's ``files`` at the edge, fetched later.

A file's :class:`~bridge.core.model.Attachment` ``ref`` is its
``url_private_download`` (or ``url_private``): Slack serves it to the bot's
token (scope ``files:read``). Slack sometimes sends only a stub of a file
(``file_access: check_file_info``, no URL): its ref is then
``slack-file:<id>``, and the URL is looked up with ``files.info`` when it is
fetched. The token is sent only to Slack's own hosts
(``*.slack.com``) or the host of the configured ``api_url`` (a test server),
never to whatever URL an event might carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bridge.core.model import Attachment
from bridge.core.transport import FileTooLarge, RateLimited, TransportError
from transports.slack.web import retry_after_seconds

SLACK = "slack"
CHUNK_BYTES = 64 * 1024
STUB_PREFIX = "slack-file:"


def attachments(event: Mapping[str, Any]) -> tuple[Attachment, ...]:
    """The files of a message event that can be fetched (deleted or external ones cannot)."""
    found = []
    files = event.get("files")
    for file in files if isinstance(files, list) else ():
        if not isinstance(file, Mapping):
            continue
        if file.get("mode") == "tombstone":
            continue  # deleted
        url = file.get("url_private_download") or file.get("url_private")
        if not isinstance(url, str) or not url:
            file_id = file.get("id")
            if not isinstance(file_id, str) or not file_id:
                continue
            url = STUB_PREFIX + file_id
        name = file.get("name") or file.get("title") or file.get("id") or "file"
        mime = file.get("mimetype")
        size = file.get("size")
        found.append(
            Attachment(
                name=str(name),
                mime=mime if isinstance(mime, str) and mime else "application/octet-stream",
                size=size if isinstance(size, int) and size >= 0 else None,
                ref=url,
            )
        )
    return tuple(found)


def may_have_token(url: str, api_url: str) -> bool:
    """Whether the bot's token may be sent to ``url``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    api = urlsplit(api_url)
    if host == (api.hostname or "").lower() and parts.port == api.port:
        return parts.scheme == api.scheme
    return parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com"))


async def download(
    session: aiohttp.ClientSession, token: str, attachment: Attachment, dest: Path, limit: int
) -> None:
    """Stream the file to ``dest``; raises :class:`FileTooLarge` past ``limit`` bytes."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with session.get(attachment.ref, headers=headers) as response:
            if response.status == 429:
                raise RateLimited(SLACK, retry_after_seconds(response.headers))
            if response.status != 200:
                raise TransportError(SLACK, f"the file server answered {response.status}")
            served = response.headers.get("Content-Type", "")
            if served.startswith("text/html") and not attachment.mime.startswith("text/html"):
                # Slack's answer to a token without files:read is its login page.
                raise TransportError(
                    SLACK,
                    "Slack served a web page: does the bot have files:read?",
                )
            written = 0
            with dest.open("wb") as out:
                async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                    written += len(chunk)
                    if written > limit:
                        raise FileTooLarge(SLACK, limit)
                    out.write(chunk)
    except aiohttp.ClientError as exc:
        raise TransportError(SLACK, f"download failed: {type(exc).__name__}") from exc
