"""A tool use's input as a person is shown it: every field, nothing silently cut.

:func:`render` turns a tool name and input into a :class:`ToolView` of labelled parts, each one
whole field, unknown keys included; :meth:`ToolView.markdown` gives the whole or, with a
``limit``, a shortened form that says what is left out and where. What cannot be shown
faithfully carries a ``problem``: never approved blind. Pure apart from reading the edited
file (docs/live-runs.md, "What a person sees").
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.live.approval_text import code_block, code_span

FIELD_LIMIT = 200
"""A one-line string field up to this length is shown inline; a longer one as a block."""
FILE_LIMIT_BYTES = 2_000_000
"""An edited file larger than this is not read: its diff cannot be shown."""
WHOLE_LIMIT = 1_000_000
"""Characters of a whole rendering beyond which no room can be shown it."""
ELSEWHERE = "the whole is in the file posted with this request"


@dataclass(frozen=True, slots=True)
class Part:
    """One field of the input: ``label`` and the whole ``text``; ``info`` is a code
    block's info string (``sh``, ``diff``), None for an inline value."""

    label: str
    text: str
    info: str | None = None
    key: bool = False
    """The label is a key of the input (claude's text, shown escaped), not the bridge's."""


@dataclass(frozen=True, slots=True)
class ToolView:
    """What a tool use will do, as shown (see the module doc)."""

    tool_name: str
    parts: tuple[Part, ...]
    problem: str | None = None
    """Why the input cannot be shown faithfully; None when it can."""

    def markdown(self, limit: int | None = None) -> str:
        """The parts as Markdown: whole, or each block cut to ``limit`` characters
        (head and tail, saying how much is not shown and that the whole is elsewhere)."""
        lines = []
        for part in self.parts:
            label = _key_label(part.label) if part.key else part.label
            if part.info is None:
                lines.append(f"{label}: {code_span(part.text, None)}")
                continue
            text = part.text if limit is None else ends(part.text, limit)
            lines.append(f"{label}:\n{code_block(text, part.info)}")
        return "\n".join(lines) if lines else "(no input)"

    def pointer(self) -> str:
        """In place of the parts, when even shortened they do not fit: how much there is."""
        return (
            f"[{len(self.parts)} fields, {self.size} characters: not shown here, too"
            f" many to fit; {ELSEWHERE}]"
        )

    @property
    def size(self) -> int:
        """Characters of all the parts' text and keys (what "how much there is" counts)."""
        return sum(len(p.text) + (len(p.label) if p.key else 0) for p in self.parts)

    @property
    def digest(self) -> str:
        """sha256 of the whole rendering: what the person was shown."""
        return hashlib.sha256(self.markdown().encode("utf-8", "surrogatepass")).hexdigest()


def input_digest(tool_input: Mapping[str, Any]) -> str:
    """sha256 of the input's canonical JSON: the input an answer applies to."""
    canonical = json.dumps(tool_input, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")


def _key_label(key: str) -> str:
    """A key as a label: a plain name as it is, anything else as a code span (escaped:
    no markup, line break or terminal escape of claude's reaches the room)."""
    return key if _PLAIN_KEY.fullmatch(key) else code_span(key, None)


def ends(text: str, limit: int) -> str:
    """``text``, or its head and tail around a line saying what is left out."""
    if len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[len(text) - limit // 3 :]
    left_out = len(text) - len(head) - len(tail)
    lines = text.count("\n") + 1
    note = f"[… {left_out} of {len(text)} characters ({lines} lines) not shown here: {ELSEWHERE} …]"
    return f"{head}\n{note}\n{tail}"


def render(tool_name: str, tool_input: Mapping[str, Any], cwd: Path | None = None) -> ToolView:
    """The view of ``tool_name`` used with ``tool_input``; relative paths are read under ``cwd``."""
    parts: list[Part] = []
    problems: list[str] = []
    used: set[str] = set()
    path = tool_input.get("file_path")
    if tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        parts.append(Part("Command", tool_input["command"], "sh"))
        used.add("command")
    elif tool_name in ("Edit", "MultiEdit", "Write") and isinstance(path, str):
        parts.append(Part("File", path))
        used.add("file_path")
        change = _change(tool_name, tool_input, _resolve(path, cwd))
        if change is not None:
            parts += change.parts
            used |= change.used
            if change.problem:
                problems.append(change.problem)
    for key, value in tool_input.items():
        if key not in used:
            parts.append(_field(key, value))
    if any("\0" in p.text or "\0" in p.label for p in parts):
        problems.append("the input holds binary data (NUL characters)")
    view = ToolView(tool_name, tuple(parts))
    if view.size > WHOLE_LIMIT:
        problems.append(f"the input is too large to show ({view.size} characters)")
    return ToolView(tool_name, tuple(parts), "; ".join(problems) or None)


def _field(key: str, value: object) -> Part:
    if isinstance(value, str):
        if "\n" in value or len(value) > FIELD_LIMIT:
            return Part(key, value, "", key=True)
        return Part(key, value, key=True)
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if len(compact) <= FIELD_LIMIT:
        return Part(key, compact, key=True)
    return Part(key, json.dumps(value, ensure_ascii=False, indent=2), "json", key=True)


def _resolve(path: str, cwd: Path | None) -> Path | None:
    candidate = Path(path)
    if candidate.is_absolute():
        return candidate
    return None if cwd is None else cwd / candidate


@dataclass(frozen=True, slots=True)
class _Change:
    parts: tuple[Part, ...]
    used: frozenset[str]
    problem: str | None = None


def _change(tool_name: str, tool_input: Mapping[str, Any], path: Path | None) -> _Change | None:
    """The diff of the file as it is now, or None to show the fields as they are."""
    current, unread = _read(path)
    if unread is not None and (unread.startswith("binary") or unread == "too large"):
        return _Change((), frozenset(), f"the file cannot be shown as a diff ({unread})")
    if tool_name == "Write":
        content = tool_input.get("content")
        if not isinstance(content, str):
            return None
        if current is None:
            note = "" if unread is None else f" (the file could not be read: {unread})"
            return _Change((Part(f"New content{note}", content, ""),), frozenset({"content"}))
        return _Change(
            (Part("Change", _diff(current, content, path), "diff"),), frozenset({"content"})
        )
    edits = _edits(tool_name, tool_input)
    if edits is None:
        return None
    used = frozenset({"edits"} if tool_name == "MultiEdit" else {"old_string", "new_string"})
    if current is not None:
        # As the CLI: old_string's "\n" matches the file's "\r\n" (kept in the file).
        current = current.replace("\r\n", "\n")
        after, missing, curly = _apply(current, edits)
        if missing is None:
            label = "Change"
            if curly:
                label += (
                    " (found in the file with its curly quotes; claude may write the"
                    " new text's quotes curly too)"
                )
            return _Change((Part(label, _diff(current, after, path), "diff"),), used)
        why = f"`old_string` of edit {missing + 1} is not in the file as it is now"
    else:
        why = f"the file could not be read: {unread or 'it does not exist'}"
    # Not applicable to the file as it is: each replacement on its own, saying why.
    pieces = [_diff(e.old, e.new, None) for e in edits]
    return _Change((Part(f"Change ({why})", "\n".join(pieces), "diff"),), used)


@dataclass(frozen=True, slots=True)
class _Edit:
    old: str
    new: str
    every: bool


def _edits(tool_name: str, tool_input: Mapping[str, Any]) -> list[_Edit] | None:
    """The replacements of an Edit or a MultiEdit; None when the input is not as expected
    (then every field is shown as it is)."""
    if tool_name == "Edit":
        items: Sequence[object] = [tool_input]
    else:
        raw = tool_input.get("edits")
        if not isinstance(raw, list):
            return None
        items = raw
    edits = []
    for item in items:
        if not isinstance(item, Mapping):
            return None
        old, new = item.get("old_string"), item.get("new_string")
        if not isinstance(old, str) or not isinstance(new, str):
            return None
        if tool_name == "MultiEdit" and set(item) - {"old_string", "new_string", "replace_all"}:
            return None  # a key nobody knows: the edits are shown as they are
        edits.append(_Edit(old, new, item.get("replace_all") is True))
    return edits


def _apply(text: str, edits: list[_Edit]) -> tuple[str, int | None, bool]:
    """``text`` after the edits as the CLI makes them, the index of the first that does
    not apply (or None), and whether one was found only through curly quotes."""
    curly = False
    for index, edit in enumerate(edits):
        old = _as_in(text, edit.old)
        if not old:
            return text, index, curly
        curly = curly or old != edit.old
        # As the CLI: an old_string replaced by nothing takes its line's newline along.
        if not edit.new and not old.endswith("\n") and old + "\n" in text:
            old += "\n"
        text = text.replace(old, edit.new, -1 if edit.every else 1)
    return text, None, curly


_STRAIGHT = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _as_in(text: str, old: str) -> str:
    """``old`` as it is in ``text``: itself, or (as the CLI finds it) the text that
    reads as ``old`` once curly quotes are straightened; "" if neither is there."""
    if not old or old in text:
        return old
    at = text.translate(_STRAIGHT).find(old.translate(_STRAIGHT))
    return "" if at < 0 else text[at : at + len(old)]


def _read(path: Path | None) -> tuple[str | None, str | None]:
    """The file's text, or None and why (None, None: it does not exist)."""
    if path is None:
        return None, "a relative path and no working directory"
    try:
        # Non-blocking: a FIFO swapped in for the file must not hold the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, "not a regular file"  # a device may never end
            data = f.read(FILE_LIMIT_BYTES + 1)
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    if len(data) > FILE_LIMIT_BYTES:
        return None, "too large"
    if b"\0" in data:
        return None, "binary (NUL bytes)"
    try:
        return data.decode(), None
    except UnicodeDecodeError:
        return None, "binary (not UTF-8)"


def _diff(before: str, after: str, path: Path | None) -> str:
    name = str(path) if path is not None else ""
    # Lines end at "\n" only: another separator (CR, U+2028...) stays in its line and
    # shows as an escape, as it is no line break to most programs that read the file.
    lines = difflib.unified_diff(
        before.split("\n"),
        after.split("\n"),
        f"a{name}" if name else "before",
        f"b{name}" if name else "after",
        lineterm="",
    )
    return "\n".join(lines) or "(no change)"
