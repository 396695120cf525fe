"""Splitting long Markdown into chunks a chat event can carry.

Chat systems cap the size of one message, so a long answer goes out as
several. Cutting at an arbitrary character breaks rendering (an unclosed code
fence turns the rest of the answer into code), so :func:`split_markdown`
cuts only between blocks: paragraphs, or whole fenced code blocks. A code
block that is itself too long becomes several complete fenced blocks, each
reopened with the original fence line so the info string (language) stays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MIN_LIMIT = 32
"""Below this, a fence line pair would not leave room for any code."""


@dataclass(frozen=True, slots=True)
class _Block:
    text: str
    fence_open: str | None = None
    """The opening fence line, for a fenced code block."""
    fence_close: str | None = None
    body: tuple[str, ...] = ()


def split_markdown(text: str, limit: int) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` characters.

    Chunks end at paragraph boundaries (blank lines) and never inside a
    fenced code block. A paragraph longer than ``limit`` is cut at line ends,
    then at spaces, and only as a last resort inside a word; a code block
    longer than ``limit`` is cut between lines into complete fenced blocks.
    Empty or blank text gives no chunks.

    Raises ``ValueError`` when ``limit`` is too small to hold a fenced line.
    """
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit must be at least {_MIN_LIMIT}, got {limit}")
    text = text.strip("\n")
    if not text.strip():
        return []
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    for block in _blocks(text):
        pieces.extend(_fit(block, limit))
    return _pack(pieces, limit)


def _blocks(text: str) -> list[_Block]:
    """Paragraphs and fenced code blocks, in order; blank lines dropped between them."""
    blocks: list[_Block] = []
    para: list[str] = []
    lines = text.split("\n")
    i = 0

    def flush_para() -> None:
        if para:
            blocks.append(_Block("\n".join(para)))
            para.clear()

    while i < len(lines):
        line = lines[i]
        opening = _FENCE_OPEN.match(line)
        if opening and not (opening["fence"][0] == "`" and "`" in opening["info"]):
            flush_para()
            fence = opening["fence"]
            closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
            body: list[str] = []
            i += 1
            close_line: str | None = None
            while i < len(lines):
                if closing.match(lines[i]):
                    close_line = lines[i]
                    break
                body.append(lines[i])
                i += 1
            # An unterminated fence runs to the end of the text (CommonMark);
            # closing it explicitly renders the same and keeps chunks valid.
            close = close_line if close_line is not None else opening["indent"] + fence
            whole = "\n".join([line, *body, close])
            blocks.append(_Block(whole, fence_open=line, fence_close=close, body=tuple(body)))
            i += 1
        elif not line.strip():
            flush_para()
            i += 1
        else:
            para.append(line)
            i += 1
    flush_para()
    return blocks


def _fit(block: _Block, limit: int) -> list[str]:
    """The block as one piece, or several pieces of at most ``limit`` each."""
    if len(block.text) <= limit:
        return [block.text]
    if block.fence_open is None or block.fence_close is None:
        return _cut_prose(block.text, limit)
    return _cut_code(block.fence_open, block.fence_close, block.body, limit)


def _cut_code(opening: str, closing: str, body: tuple[str, ...], limit: int) -> list[str]:
    overhead = len(opening) + len(closing) + 2  # two newlines around the body
    room = limit - overhead
    if room < 1:
        # A pathological info string: keep only the fence characters.
        match = _FENCE_OPEN.match(opening)
        if match is not None:
            opening = match["indent"] + match["fence"]
        room = limit - (len(opening) + len(closing) + 2)
    lines: list[str] = []
    for line in body:
        # A single code line longer than the room can only be cut inside the line.
        lines.extend(line[i : i + room] for i in range(0, max(len(line), 1), room))
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        added = len(line) + (1 if current else 0)
        if current and size + added > room:
            chunks.append("\n".join([opening, *current, closing]))
            current, size = [], 0
            added = len(line)
        current.append(line)
        size += added
    if current or not chunks:
        chunks.append("\n".join([opening, *current, closing]))
    return chunks


def _cut_prose(text: str, limit: int, separators: tuple[str, ...] = ("\n", " ")) -> list[str]:
    """Cut a paragraph at line ends, then at spaces, then anywhere."""
    if len(text) <= limit:
        return [text]
    if not separators:
        return [text[i : i + limit] for i in range(0, len(text), limit)]
    separator, finer = separators[0], separators[1:]
    out: list[str] = []
    current = ""
    for part in text.split(separator):
        candidate = f"{current}{separator}{part}" if current else part
        if len(candidate) <= limit:
            current = candidate
            continue
        if current:
            out.append(current)
        current = ""
        if len(part) <= limit:
            current = part
        else:
            out.extend(_cut_prose(part, limit, finer))
    if current:
        out.append(current)
    return [piece for piece in out if piece.strip()]


def _pack(pieces: list[str], limit: int) -> list[str]:
    """Join consecutive pieces with blank lines while they fit in ``limit``."""
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        candidate = f"{current}\n\n{piece}" if current else piece
        if len(candidate) <= limit:
            current = candidate
        else:
            chunks.append(current)
            current = piece
    if current:
        chunks.append(current)
    return chunks
