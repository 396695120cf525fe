"""The prompt of a batch: who wrote what, what it replies to, which files came with it.

Chat text, display names, quoted replies and file names are untrusted and never pass for a
line chatbridge writes: every line of a message is quoted (``> ``, split at every line break
Python knows), names are cleaned (bridge.runs.display_names), reply quotes and file names are
JSON strings. A batch of one plain message is its text alone
(docs/files-and-context.md, "The prompt").
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from bridge.core.model import Batch, Message
from bridge.core.synthetic import is_synthetic
from bridge.runs.display_names import clean_display_name
from bridge.runs.inbox import FetchedFile, human_size

QUOTE_CHARS = 300
"""A replied-to message is quoted up to this many characters."""
NAME_CHARS = 64
_NOT_IN_IDS = re.compile(r"[\s()\[\]<>\"`]+")
_MIME = re.compile(r"[^A-Za-z0-9.+/-]")
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""Every character ``str.splitlines`` breaks at."""


def build_prompt(batch: Batch, files: Sequence[FetchedFile] = ()) -> str:
    """The prompt for ``batch``; ``files``: what became of its files (bridge.runs.inbox)."""
    plain = not files and not any(m.attachments or m.reply_to_text for m in batch.messages)
    # A schedule's or webhook's message is always attributed: no one in the room asked.
    if len(batch.messages) == 1 and plain and not is_synthetic(batch.first):
        return batch.first.text
    parts = []
    if files:
        parts.append(
            "Files shared in the chat are saved under the working directory at the"
            " paths below; read them as needed."
        )
    parts.extend(_message(m, [f for f in files if f.message_id == m.id]) for m in batch.messages)
    return "\n\n".join(parts)


def _message(message: Message, files: Sequence[FetchedFile]) -> str:
    who = author(message)
    verb = "wrote" if message.text.strip() or not message.attachments else "shared files"
    header = f"{who} {verb}"
    if message.reply_to_text:
        header += f", replying to {quote(message.reply_to_text)}"
    lines = [header + ":"]
    if message.text.strip():
        lines += ["> " + line for line in message.text.splitlines()]
    lines += [file_line(f) for f in files]
    # Files the run has no record of (none fetched for this message): still named.
    if not files:
        lines += [
            f"File {_json(a.name)} ({_mime(a.mime)}): not available" for a in message.attachments
        ]
    return "\n".join(lines)


def author(message: Message) -> str:
    """``Alice (@alice:hs)``: the display name, if any, then the id that no name can fake.

    A name loses brackets, quotes and ``@`` (also their fullwidth and other
    look-alikes), so it cannot hold an id of its own: ``Alice (@alice:hs)`` or
    its fullwidth form as Eve's display name reads ``Alice alice:hs (@eve:hs)``.
    """
    sender = _clean(message.sender, 255)
    name = clean_display_name(message.sender_name or "", NAME_CHARS)
    if not name or name == sender:
        return sender
    return f"{name} ({sender})"


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` shortened to ``limit`` characters, as a JSON string on one line."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return _json(flat)


def file_line(file: FetchedFile) -> str:
    a = file.attachment
    mime = _mime(a.mime)
    if file.path is None:
        size = "" if file.size is None else f", {human_size(file.size)}"
        return (
            f"File {_json(a.name)} ({mime}{size}) not downloaded:"
            f" {_one_line(file.missing_reason)[:300]}"
        )
    size = "" if file.size is None else f", {human_size(file.size)}"
    shown = ", shown to you as an image" if file.shown else ""
    return f"File {_json(str(file.path))} ({mime}{size}){shown}"


def _json(text: str) -> str:
    """``text`` as a JSON string that no reader splits into lines."""
    out = json.dumps(text, ensure_ascii=False)
    for ch in _LINE_BREAKS:
        out = out.replace(ch, f"\\u{ord(ch):04x}")
    return out


def _one_line(text: str) -> str:
    return " ".join("".join(ch for ch in text if ch.isprintable() or ch.isspace()).split())


def _clean(text: str, limit: int) -> str:
    printable = "".join(ch for ch in text if ch.isprintable() or ch.isspace())
    return " ".join(_NOT_IN_IDS.sub(" ", printable).split())[:limit].strip()


def _mime(mime: str) -> str:
    return _MIME.sub("", mime)[:100] or "application/octet-stream"
