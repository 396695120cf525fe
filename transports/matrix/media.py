"""Files in Matrix rooms: ``m.file`` / ``m.image`` / ``m.audio`` / ``m.video``, plain or
encrypted, described at the edge and fetched when their run is prepared.

An :class:`~bridge.core.model.Attachment` ``ref`` is JSON: ``{"url": "mxc://..."}``, plus
``"file"`` (key, iv, SHA-256 hash) in an encrypted room. An encrypted file is kept only if
its hash matches; the size limit is checked before and after the download
(docs/deployment.md, "Inside the Matrix transport"; docs/files-and-context.md, "Files in").
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from nio import AsyncClient, DownloadError, EncryptionError
from nio.crypto.attachments import decrypt_attachment

from bridge.core.model import Attachment
from bridge.core.transport import FileTooLarge, TransportError

MATRIX = "matrix"
MEDIA_TYPES = frozenset({"m.file", "m.image", "m.audio", "m.video"})


def attachment_of(content: dict[str, Any]) -> Attachment | None:
    """The file a message's ``content`` carries; None if it carries none that can be fetched."""
    if content.get("msgtype") not in MEDIA_TYPES:
        return None
    file = content.get("file")
    encrypted = isinstance(file, dict)
    url = file.get("url") if isinstance(file, dict) else content.get("url")
    if not isinstance(url, str) or not url.startswith("mxc://"):
        return None
    if encrypted and not _usable_keys(file):
        return None
    info = content.get("info")
    info = info if isinstance(info, dict) else {}
    mime = info.get("mimetype")
    size = info.get("size")
    ref: dict[str, Any] = {"url": url}
    if encrypted:
        ref["file"] = file
    return Attachment(
        name=file_name(content),
        mime=mime if isinstance(mime, str) and mime else "application/octet-stream",
        size=size if isinstance(size, int) and size >= 0 else None,
        ref=json.dumps(ref, separators=(",", ":")),
    )


def file_name(content: dict[str, Any]) -> str:
    """The file's name: ``filename`` where given, else the body (older clients' convention)."""
    for key in ("filename", "body"):
        value = content.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return "file"


def caption(content: dict[str, Any]) -> str:
    """The text sent with a file: its body, when a ``filename`` says the body is not the name."""
    body, name = content.get("body"), content.get("filename")
    if isinstance(body, str) and isinstance(name, str) and name and body != name:
        return body
    return ""


def _usable_keys(file: Any) -> bool:
    key = file.get("key") if isinstance(file, dict) else None
    hashes = file.get("hashes") if isinstance(file, dict) else None
    return (
        isinstance(key, dict)
        and isinstance(key.get("k"), str)
        and isinstance(hashes, dict)
        and isinstance(hashes.get("sha256"), str)
        and isinstance(file.get("iv"), str)
    )


async def fetch(client: AsyncClient, attachment: Attachment, dest: Path, limit: int) -> None:
    """Download (and decrypt) ``attachment`` into ``dest``; see the module doc for the limit."""
    try:
        ref = json.loads(attachment.ref)
        url = ref["url"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TransportError(MATRIX, "not a file reference of this transport") from exc
    response = await client.download(mxc=url)
    if isinstance(response, DownloadError):
        raise TransportError(
            MATRIX, f"download refused: {response.status_code or response.message}"
        )
    body = response.body
    if not isinstance(body, bytes):
        raise TransportError(MATRIX, "download gave no content")
    if len(body) > limit:  # AES-CTR: the ciphertext is as long as the file
        raise FileTooLarge(MATRIX, limit)
    file = ref.get("file")
    if isinstance(file, dict):
        try:
            body = decrypt_attachment(body, file["key"]["k"], file["hashes"]["sha256"], file["iv"])
        except (EncryptionError, KeyError, TypeError, ValueError) as exc:
            raise TransportError(MATRIX, "the encrypted file failed its check") from exc
    await asyncio.to_thread(dest.write_bytes, body)
