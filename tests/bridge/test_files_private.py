"""Files shared in chat are private to chatbridge's user, never written through a link
planted in the room's directory, and shown to claude as images only when their bytes
are images (docs/operations.md, "Files and permissions")."""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.config import Settings, load_settings
from bridge.core.model import Attachment, RoomKey
from bridge.runs.file_posts import copy_file
from bridge.runs.inbox import image_type
from bridge.runs.transcripts import write_atomically
from tests.bridge.file_rooms import (
    NOTES,
    PNG,
    FileRoom,
    console_room,
    inbox_path,
    prompt_of,
    with_files,
)
from tests.bridge.harness import ECHO, write_config
from tests.file_modes import mode


async def test_a_shared_file_and_its_folders_are_private_to_the_user(
    tmp_path: Path, umask: int
) -> None:
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    prompt = await prompt_of(settings, chat, with_files(chat.room, "f-1", NOTES))
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
    prompt = await prompt_of(settings, chat, with_files(chat.room, "f-1", NOTES, text="read it"))
    assert "notes.txt" in prompt
    assert "could not be made safely" in prompt
    assert list(elsewhere.rglob("*")) == []


def recorded(tmp_path: Path) -> tuple[Settings, Path]:
    """The settings of a service whose fake claude records what it is sent (in the path)."""
    record = tmp_path / "claude.json"
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    return load_settings(write_config(tmp_path, env=env)), record


async def test_a_file_declared_an_image_is_shown_as_one_only_if_its_bytes_are(
    tmp_path: Path,
) -> None:
    settings, record = recorded(tmp_path)
    fake = b"#!/bin/sh\necho not a picture\n"
    chat = FileRoom(console_room(settings), "local", {"fake": fake, "img": PNG})
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("fake.png", "image/png", len(fake), "fake"),
        Attachment("real.jpg", "image/jpeg", len(PNG), "img"),  # a PNG declared a JPEG
        text="what is in the pictures?",
    )
    prompt = await prompt_of(settings, chat, sent)
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


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


_IHDR = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0))
_JPEG_SOF = b"\xff\xc0\0\x0b\x08\0\x01\0\x01\x01\x01\x11\0"
_JPEG = b"\xff\xd8\xff\xe0\0\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0" + _JPEG_SOF + b"\xff\xd9"
_WEBP_BODY = b"WEBPVP8L\x05\0\0\0\x2f\0\0\0\0\0"
_WEBP = b"RIFF" + struct.pack("<I", len(_WEBP_BODY)) + _WEBP_BODY


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (PNG, "image/png"),
        (PNG + b"PK\x03\x04 a zip after it", "image/png"),  # what follows IEND is not read
        (b"\x89PNG\r\n\x1a\n", None),  # the signature alone
        (b"\x89PNG\r\n\x1a\n" + _IHDR, None),  # no image data, no end
        (PNG[:-20], None),  # cut short
        (PNG[:19] + b"\x02" + PNG[20:], None),  # a chunk whose checksum fails (width 2)
        (_JPEG, "image/jpeg"),
        (b"\xff\xd8\xff\xe0\0\x10JFIF", None),  # cut inside its first segment
        (b"\xff\xd8\xff<script>alert(1)</script>", None),
        (b"GIF87a\x01\0\x01\0\0\0\0;", "image/gif"),
        (b"GIF89a\x01\0\x01\0\0\0\0;", "image/gif"),
        (b"GIF89a\x01\0", None),  # its screen descriptor cut
        (b"GIF89a\0\0\0\0\0\0\0;", None),  # no pixels
        (_WEBP, "image/webp"),
        (_WEBP[:-4], None),  # shorter than its RIFF header says
        (b"RIFF\x24\0\0\0WEBPVP8 ", None),
        (b"RIFF\x24\0\0\0WAVEfmt ", None),  # a RIFF that is sound
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
        (b"\x89PN", None),
        (b"", None),
    ],
)
def test_an_image_type_is_read_from_the_first_bytes(data: bytes, kind: str | None) -> None:
    assert image_type(data) == kind


class SwappingRoom(FileRoom):
    """A chat whose download is raced: while it runs, something in the room's directory
    (a tool left running by an earlier run) replaces the new inbox file by ``swap``."""

    def __init__(
        self, room: RoomKey, files: dict[str, bytes], swap: Callable[[Path], None]
    ) -> None:
        super().__init__(room, "local", files)
        self.swap = swap
        self.root: Path | None = None

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        assert self.root is not None
        (planted,) = (self.root / ".chatbridge" / "inbox").rglob(attachment.name)
        planted.unlink()
        self.swap(planted)
        await super().fetch_attachment(attachment, dest, limit_bytes)


@pytest.mark.parametrize("link", ["symbolic", "hard"])
async def test_a_link_swapped_in_for_an_inbox_file_while_it_downloads_is_not_written_through(
    tmp_path: Path, link: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")

    def swap(path: Path) -> None:
        if link == "symbolic":
            path.symlink_to(victim)
        else:
            os.link(victim, path)

    settings = load_settings(write_config(tmp_path))
    chat = SwappingRoom(console_room(settings), {"ref-notes": b"chat text!!"}, swap)
    chat.root = tmp_path
    prompt = await prompt_of(settings, chat, with_files(chat.room, "f-1", NOTES, text="read it"))
    assert victim.read_bytes() == b"keep me"
    assert "notes.txt" in prompt
    assert "replaced while it was downloaded" in prompt


class MovingRoom(FileRoom):
    """A chat whose download is followed at once by a swap of the run's inbox folder
    for a link to another folder holding a file of the same name."""

    def __init__(self, room: RoomKey, files: dict[str, bytes], elsewhere: Path) -> None:
        super().__init__(room, "local", files)
        self.elsewhere = elsewhere
        self.root: Path | None = None

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        await super().fetch_attachment(attachment, dest, limit_bytes)
        assert self.root is not None
        (run_inbox,) = (self.root / ".chatbridge" / "inbox").iterdir()
        run_inbox.rename(run_inbox.with_name("moved"))
        run_inbox.symlink_to(self.elsewhere)


async def test_an_image_is_read_back_without_following_a_link_swapped_in_after_its_download(
    tmp_path: Path,
) -> None:
    settings, record = recorded(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    large = PNG + b"\0" * 4_000_000  # over the images' budget: never to be read whole
    (elsewhere / "real.png").write_bytes(large)
    chat = MovingRoom(console_room(settings), {"img": PNG}, elsewhere)
    chat.root = tmp_path
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("real.png", "image/png", len(PNG), "img"),
        text="what is in the picture?",
    )
    prompt = await prompt_of(settings, chat, sent)
    assert "shown to you as an image" not in prompt
    content = json.loads(record.read_text())["content"]
    assert content == prompt  # text only: nothing read through the link went with it


@pytest.mark.parametrize("declared", ["Image/PNG", "image/png; name=pic.png", " image/png"])
async def test_a_declared_image_type_is_read_as_media_types_are_case_and_parameters_aside(
    tmp_path: Path, declared: str
) -> None:
    settings, record = recorded(tmp_path)
    chat = FileRoom(console_room(settings), "local", {"img": PNG})
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("pic.png", declared, len(PNG), "img"),
        text="what is in the picture?",
    )
    prompt = await prompt_of(settings, chat, sent)
    assert "shown to you as an image" in prompt
    (image,) = [c for c in json.loads(record.read_text())["content"] if c["type"] == "image"]
    assert image["source"]["media_type"] == "image/png"
