"""Files shared in chat are private to chatbridge's user, never written through a link
planted in the room's directory, and shown to claude as images only when their bytes
are images (docs/operations.md, "Files and permissions")."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import Attachment, ReplyKind
from bridge.file_posts import copy_file
from bridge.transcripts import write_atomically
from tests.bridge.chat_room import serving
from tests.bridge.harness import ECHO, write_config
from tests.bridge.test_files import NOTES, PNG, FileRoom, console_room, inbox_path, with_files


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    mask: int = request.param
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def test_a_shared_file_and_its_folders_are_private_to_the_user(
    tmp_path: Path, umask: int
) -> None:
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(with_files(chat.room, "f-1", NOTES))
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    path = tmp_path / inbox_path(prompt, "notes.txt")
    assert path.read_bytes() == b"hello notes"
    folders = [path.parent, path.parent.parent, path.parent.parent.parent]
    assert [mode(p) for p in [path, *folders]] == [0o600, 0o700, 0o700, 0o700]
    assert mode(tmp_path / "bridge.db") == 0o600


async def test_an_inbox_link_planted_in_the_room_is_not_followed_and_the_prompt_says_so(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".chatbridge").mkdir()
    (tmp_path / ".chatbridge" / "inbox").symlink_to(elsewhere)
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(with_files(chat.room, "f-1", NOTES, text="read it"))
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    assert "notes.txt" in prompt
    assert "could not be made safely" in prompt
    assert list(elsewhere.rglob("*")) == []


async def test_a_file_declared_an_image_is_shown_as_one_only_if_its_bytes_are(
    tmp_path: Path,
) -> None:
    record = tmp_path / "claude.json"
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, env=env))
    fake = b"#!/bin/sh\necho not a picture\n"
    chat = FileRoom(console_room(settings), "local", {"fake": fake, "img": PNG})
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("fake.png", "image/png", len(fake), "fake"),
        Attachment("real.jpg", "image/jpeg", len(PNG), "img"),  # a PNG declared a JPEG
        text="what is in the pictures?",
    )
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(sent)
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    assert "shown to you as an image" not in prompt
    assert inbox_path(prompt, "fake.png")
    content = json.loads(record.read_text())["content"]
    assert content == prompt  # text only: no image content went with it


def test_a_restored_transcript_and_its_new_folders_are_private(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "config" / "projects" / "-srv-room" / "session.jsonl"
    write_atomically(target, b'{"type":"user","message":"the password"}\n')
    folders = [target.parent, target.parent.parent, target.parent.parent.parent]
    assert [mode(p) for p in [target, *folders]] == [0o600, 0o700, 0o700, 0o700]


def test_a_file_claude_sends_is_copied_privately(tmp_path: Path, umask: int) -> None:
    room = tmp_path / "room"
    room.mkdir()
    (room / "report.txt").write_bytes(b"numbers")
    into = tmp_path / "state" / "files" / "cbf-1"
    copy = copy_file(room, room / "report.txt", into, 1024)
    assert copy.read_bytes() == b"numbers"
    assert [mode(p) for p in [copy, into, into.parent, into.parent.parent]] == [0o600] + [0o700] * 3
