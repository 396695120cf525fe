"""Files shared with a batch's messages, fetched into the run's inbox when the run is prepared.

The inbox is ``.chatbridge/inbox/<run id>/`` in the room's working directory (0700 folders,
0600 files, opened without following a link). Each file is fetched through its transport
within the room's limits, under a safe unique name (:func:`safe_name`); an image counts as
one only by its bytes (:func:`image_type`); the prompt says what was not kept and why
(docs/files-and-context.md, "Files in").
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import errno
import logging
import os
import stat
import struct
import unicodedata
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.core.model import Attachment, Batch, MessageId, RunId, TransportName
from bridge.core.private import FILE_MODE, open_private_dirs
from bridge.core.transport import FileTooLarge, Transport, TransportError
from bridge.metrics import Metrics
from runner import PromptImage

log = logging.getLogger(__name__)

INBOX = Path(".chatbridge") / "inbox"
"""Where a room's runs find their files, relative to the room's working directory."""
FETCH_TIMEOUT_S = 120.0
"""One file's download gives up after this long (the run starts without it)."""
FETCH_TOTAL_S = 300.0
"""All of a run's files together give up after this long: a batch of many files on a
stalling server would otherwise hold the run back for the per-file limit times each."""
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Control, format, surrogate, unassigned characters and line/paragraph separators."""
MAX_NAME_CHARS = 120
"""A kept file name is cut to this many characters (its extension kept)."""
MAX_NAME_BYTES = 200
"""...and to this many bytes of UTF-8: filesystems refuse a name over 255 bytes, and
120 characters of a non-Latin script can be 480; the rest leaves room for ``-2``."""


@dataclass(frozen=True, slots=True)
class FetchedFile:
    """What became of one attachment: ``path`` (relative to the cwd) or why there is none."""

    message_id: MessageId
    attachment: Attachment
    path: Path | None
    size: int | None
    """Bytes written; for a file not kept, the size the transport reported."""
    missing_reason: str = ""
    shown: bool = False
    """An image also sent to claude as image content (see :func:`shown_images`)."""


def safe_name(name: str) -> str:
    """``name`` as a plain file name: never a path, never hidden, never empty.

    Separators (``/``, ``\\``) and control characters become ``_``; leading
    dots and spaces go (so no ``..``, no hidden file); what is left is cut to
    :data:`MAX_NAME_CHARS` (and :data:`MAX_NAME_BYTES`), keeping a short extension.
    """
    cleaned = "".join(
        "_" if ch in "/\\" or unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch
        for ch in unicodedata.normalize("NFC", name)
    )
    cleaned = cleaned.strip().lstrip(". ").rstrip(" ")
    if len(cleaned) > MAX_NAME_CHARS or len(cleaned.encode()) > MAX_NAME_BYTES:
        stem, dot, ext = cleaned.rpartition(".")
        if dot and 0 < len(ext) <= 10:
            tail = len(ext.encode()) + 1
            cleaned = _cut(stem, MAX_NAME_CHARS - len(ext) - 1, MAX_NAME_BYTES - tail) + "." + ext
        else:
            cleaned = _cut(cleaned, MAX_NAME_CHARS, MAX_NAME_BYTES)
    return cleaned or "file"


def _cut(text: str, chars: int, size: int) -> str:
    """``text`` cut to at most ``chars`` characters and ``size`` bytes of UTF-8
    (never inside a character)."""
    return text[:chars].encode()[:size].decode(errors="ignore")


class _Names:
    """Unique names within one inbox: a second ``a.png`` becomes ``a-2.png``."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def claim(self, name: str) -> str:
        base = safe_name(name)
        stem, dot, ext = base.rpartition(".")
        if not dot or not stem:
            stem, dot, ext = base, "", ""
        candidate, n = base, 1
        # Case-folded: two names differing in case are one file on some filesystems.
        while candidate.casefold() in self._taken:
            n += 1
            candidate = f"{stem}-{n}{dot}{ext}"
        self._taken.add(candidate.casefold())
        return candidate


@dataclass(frozen=True, slots=True)
class FileLimits:
    max_file_bytes: int
    max_message_bytes: int


class Inbox:
    """Fetches a batch's files through their transports (one per run preparation)."""

    def __init__(
        self,
        transports: Mapping[TransportName, Transport],
        metrics: Metrics,
        fetch_timeout_s: float = FETCH_TIMEOUT_S,
        fetch_total_s: float = FETCH_TOTAL_S,
    ) -> None:
        self._transports = transports
        self._metrics = metrics
        self._timeout = fetch_timeout_s
        self._total = fetch_total_s

    async def fetch(
        self, run_id: RunId, batch: Batch, cwd: Path, limits: FileLimits
    ) -> list[FetchedFile]:
        """Fetch every file of ``batch`` into the run's inbox, in message order.

        Never raises for a file: one that cannot be had is reported as missing.
        """
        if not any(m.attachments for m in batch.messages):
            return []
        inbox = INBOX / run_id
        try:
            inbox_fd = open_private_dirs(cwd, inbox.parts)
        except OSError as exc:
            # A link planted in the room's directory (by an earlier run) must not
            # send the files elsewhere: none is written, the prompt says why.
            log.warning("run %s: its inbox %s was refused: %s", run_id, inbox, exc)
            reason = f"not written: {inbox} could not be made safely ({exc.strerror})"
            return [
                self._missing(m.id, a, "failed", reason)
                for m in batch.messages
                for a in m.attachments
            ]
        try:
            names = _Names()
            deadline = asyncio.get_running_loop().time() + self._total
            fetched: list[FetchedFile] = []
            transport = self._transports.get(batch.room.transport)
            for message in batch.messages:
                left = limits.max_message_bytes
                for attachment in message.attachments:
                    one = await self._one(
                        transport,
                        message.id,
                        attachment,
                        (inbox, inbox_fd),
                        names,
                        limits,
                        left,
                        deadline,
                    )
                    if one.path is not None and one.size is not None:
                        left -= one.size
                    fetched.append(one)
            return fetched
        finally:
            os.close(inbox_fd)

    def _missing(
        self, message_id: MessageId, attachment: Attachment, outcome: str, reason: str
    ) -> FetchedFile:
        self._metrics.files.labels(outcome).inc()
        return FetchedFile(message_id, attachment, None, attachment.size, reason)

    async def _one(  # noqa: PLR0917 (one file's whole context)
        self,
        transport: Transport | None,
        message_id: MessageId,
        attachment: Attachment,
        inbox_at: tuple[Path, int],
        names: _Names,
        limits: FileLimits,
        left: int,
        deadline: float,
    ) -> FetchedFile:
        limit = min(limits.max_file_bytes, left)

        def missing(outcome: str, reason: str) -> FetchedFile:
            return self._missing(message_id, attachment, outcome, reason)

        if limit <= 0 or (attachment.size is not None and attachment.size > limit):
            return missing("too_large", _too_large(limits, left))
        if transport is None:
            return missing("failed", "its chat is not connected")
        inbox, inbox_fd = inbox_at
        name = names.claim(attachment.name)
        relative = inbox / name
        # The transport writes the file created here, through its own fd (not by its
        # name): whatever is renamed, linked or planted in the inbox meanwhile, what it
        # writes cannot land anywhere else.
        dest = Path(f"/proc/self/fd/{inbox_fd}") / name
        try:
            file_fd = os.open(name, _NEW_PRIVATE_FILE, FILE_MODE, dir_fd=inbox_fd)
        except OSError as exc:
            log.warning("could not create a file of message %s: %s", message_id, exc)
            return missing("failed", f"could not be written ({exc.strerror})")
        try:
            now = asyncio.get_running_loop().time()
            # Past the run's deadline this gives up at once: the later files are named as
            # timed out, and claude starts.
            async with asyncio.timeout_at(min(now + self._timeout, deadline)):
                await transport.outbound.fetch_attachment(
                    attachment, Path(f"/proc/self/fd/{file_fd}"), limit
                )
            size = _still_named(file_fd, name, inbox_fd)
        except asyncio.CancelledError:
            _remove(dest)  # the run was stopped while preparing: no part file stays
            raise
        except FileTooLarge:
            _remove(dest)
            return missing("too_large", _too_large(limits, left))
        except (TransportError, OSError, TimeoutError) as exc:
            _remove(dest)
            # The transport's message never holds a token; the file name is the sender's.
            log.warning("could not fetch a file of message %s: %s", message_id, exc)
            reason = "the download timed out" if isinstance(exc, TimeoutError) else str(exc)
            return missing("failed", f"could not be downloaded ({reason})")
        except Exception:
            # A transport's bug costs this file, not the run.
            _remove(dest)
            log.exception("fetching a file of message %s failed inside chatbridge", message_id)
            return missing("failed", "could not be downloaded (an error in chatbridge)")
        finally:
            os.close(file_fd)
        self._metrics.files.labels("fetched").inc()
        return FetchedFile(message_id, attachment, relative, size)


def _still_named(fd: int, name: str, inbox_fd: int) -> int:
    """The size of the file open as ``fd``; raises OSError unless ``name`` in the inbox
    is still that file (it was replaced while it downloaded: its name now leads elsewhere)."""
    info = os.fstat(fd)
    try:
        named = os.stat(name, dir_fd=inbox_fd, follow_symlinks=False)
    except FileNotFoundError:
        named = None
    if named is None or (named.st_dev, named.st_ino) != (info.st_dev, info.st_ino):
        raise OSError(errno.EEXIST, "it was replaced while it was downloaded")
    return info.st_size


_NEW_PRIVATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""A file of the inbox is created new (0600) before the transport writes it: never an
existing file, never through a link."""


def _too_large(limits: FileLimits, left: int) -> str:
    if limits.max_file_bytes <= left:
        return f"larger than the limit of {human_size(limits.max_file_bytes)} per file"
    return f"over the limit of {human_size(limits.max_message_bytes)} for the files of one message"


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # not a file (a folder planted there): left as it is
        log.warning("could not remove %s: %s", path, exc)


def human_size(size: int) -> str:
    """``size`` bytes for people: ``512 B``, ``12.3 KB``, ``4.0 MB`` (powers of 1024)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types the model accepts as image content."""
IMAGE_MAX_BYTES = 3_750_000
"""An image larger than this is only named, not shown: base64 makes it 5 MB, the API's
limit per image."""
MAX_IMAGES = 20
"""At most this many images are shown with one prompt."""


def media_type(declared: str) -> str:
    """A declared media type as it compares: its parameters aside, lower case (RFC 2045:
    ``Image/PNG; name=a.png`` is ``image/png``)."""
    return declared.split(";", 1)[0].strip().lower()


def image_type(data: bytes) -> str | None:
    """The image type ``data`` is (one of :data:`IMAGE_TYPES`), or None.

    Not by its first bytes alone: its structure must be whole as far as it can be
    checked cheaply (a PNG's chunks and their checksums up to ``IEND``, a JPEG's
    segments up to its frame header, a GIF's screen, a WebP's RIFF length), so a
    file cut short or a signature before other content is no image (the model's
    API refuses an image it cannot decode).
    """
    if data.startswith(_PNG_SIGNATURE):
        return "image/png" if _whole_png(data) else None
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg" if _jpeg_frame(data) else None
    if data[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack_from("<HH", data, 6) if len(data) >= 13 else (0, 0)
        return "image/gif" if width and height else None
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 20:
        (riff_size,) = struct.unpack_from("<I", data, 4)
        whole = riff_size >= 12 and len(data) >= 8 + riff_size
        return "image/webp" if whole and data[12:16] in _WEBP_CHUNKS else None
    return None


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_WEBP_CHUNKS = (b"VP8 ", b"VP8L", b"VP8X")
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
"""The JPEG markers that start a frame (SOFn; not DHT, JPG, DAC)."""


def _whole_png(data: bytes) -> bool:
    """Whether ``data``'s chunks are whole, their checksums right, from ``IHDR`` to ``IEND``."""
    offset = len(_PNG_SIGNATURE)
    first = True
    while offset + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        end = offset + 12 + length
        if end > len(data):
            return False
        (crc,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(data[offset + 4 : end - 4]) != crc or first != (kind == b"IHDR"):
            return False
        if kind == b"IEND":
            return True
        first = False
        offset = end
    return False


def _jpeg_frame(data: bytes) -> bool:
    """Whether ``data``'s segments lead whole to a frame header of a non-empty image."""
    offset = 2
    while offset + 4 <= len(data) and data[offset] == 0xFF:
        if data[offset + 1] == 0xFF:  # a fill byte before a marker
            offset += 1
            continue
        marker = data[offset + 1]
        (length,) = struct.unpack_from(">H", data, offset + 2)
        if length < 2 or offset + 2 + length > len(data):
            return False
        if marker in _JPEG_FRAMES:
            if length < 8:
                return False
            height, width = struct.unpack_from(">HH", data, offset + 5)
            return bool(height and width)
        offset += 2 + length
    return False


def _read_back(cwd: Path, path: Path, size: int) -> bytes:
    """The file ``path`` of the inbox as it was written: reached as it was made, folder
    by folder without following a link, and only if it is still the regular file of
    ``size`` bytes (nothing swapped in since can make it read more, or block). Raises
    OSError otherwise."""
    folder = open_private_dirs(cwd, path.parent.parts)
    try:
        fd = os.open(path.name, _READ_BACK, dir_fd=folder)
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            raise OSError(errno.ESTALE, "it changed since it was downloaded")
        return file.read(size)


_READ_BACK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""(Non-blocking: a FIFO swapped in does not hold the run back.)"""


async def shown_images(
    cwd: Path, fetched: Sequence[FetchedFile], budget_bytes: int
) -> tuple[list[FetchedFile], list[PromptImage]]:
    """The images among ``fetched`` that go to claude as image content, within
    ``budget_bytes`` (raw) in all, and ``fetched`` with those marked ``shown``.

    The budget keeps the prompt's line, which claude echoes, under the runner's
    line limit. The others are named only, and claude can read them from disk.
    """
    images: list[PromptImage] = []
    marked = list(fetched)
    for index, file in enumerate(fetched):
        if (
            file.path is None
            or file.size is None
            or media_type(file.attachment.mime) not in IMAGE_TYPES
            or file.size > min(IMAGE_MAX_BYTES, budget_bytes)
            or len(images) >= MAX_IMAGES
        ):
            continue
        try:
            data = await asyncio.to_thread(_read_back, cwd, file.path, file.size)
        except OSError as exc:
            log.warning("could not read back an image of the run: %s", exc)
            continue
        declared = media_type(file.attachment.mime)
        if image_type(data) != declared:
            # Only named: claude reads it from disk as the file it is.
            log.info("a file declared %s is not one by its content", file.attachment.mime)
            continue
        budget_bytes -= len(data)
        images.append(PromptImage(declared, base64.b64encode(data).decode("ascii")))
        marked[index] = dataclasses.replace(file, shown=True)
    return marked, images
