"""Files shared with messages: fetched into the run's inbox when the run is prepared,
named in the prompt (the fake claude answers with the prompt it got); a file with
no text is a message too."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import subprocess
import time
from pathlib import Path

from bridge.config import load_settings
from bridge.core.model import (
    Attachment,
    ReplyKind,
)
from bridge.core.transport import Accepted
from bridge.host.worktrees import slug
from bridge.service import open_store
from tests.bridge.chat_room import serving
from tests.bridge.file_rooms import (
    NOTES,
    PNG,
    FileRoom,
    console_room,
    inbox_path,
    prompt_of,
    with_files,
)
from tests.bridge.harness import ECHO, rows, write_config


async def test_a_file_without_text_runs_with_the_file_in_its_inbox(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        assert await chat.sink(with_files(chat.room, "f-1", NOTES)) is Accepted.ACCEPTED
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    assert "Local Person (local) shared files:" in prompt
    path = inbox_path(prompt, "notes.txt")
    assert f'File "{path}" (text/plain, 11 B)' in prompt
    assert (tmp_path / path).read_bytes() == b"hello notes"
    assert rows(tmp_path, "select state from messages") == [("done",)]


async def test_files_over_a_limit_are_not_downloaded_and_the_prompt_says_so(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        write_config(
            tmp_path, {"defaults": {"max_file_bytes": 100, "max_message_files_bytes": 150}}
        )
    )
    files = {"big": b"x" * 101, "unsized": b"y" * 500, "a": b"a" * 90, "b": b"b" * 90, "c": b"c"}
    chat = FileRoom(console_room(settings), "local", files)
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("big.bin", "application/octet-stream", 101, "big"),
        Attachment("unsized.bin", "application/octet-stream", None, "unsized"),
        Attachment("a.txt", "text/plain", 90, "a"),
        Attachment("b.txt", "text/plain", 90, "b"),  # 90 + 90 > 150 for one message
        Attachment("c.txt", "text/plain", 1, "c"),
        Attachment("gone.txt", "text/plain", 1, "gone"),
        text="look at these",
    )
    async with serving(settings, chat) as (service, _room):
        assert chat.sink is not None
        assert await chat.sink(sent) is Accepted.ACCEPTED
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
        counts = {
            outcome: service.parts.metrics.registry.get_sample_value(
                "chatbridge_files_total", {"outcome": outcome}
            )
            for outcome in ("fetched", "too_large", "failed")
        }
    assert counts == {"fetched": 2, "too_large": 3, "failed": 1}
    [prompt] = chat.texts(ReplyKind.RESULT)
    assert "big" not in chat.fetched  # its reported size was enough to refuse it
    assert 'File "big.bin" (application/octet-stream, 101 B) not downloaded: larger than' in prompt
    assert 'File "unsized.bin" (application/octet-stream) not downloaded: larger than' in prompt
    assert (tmp_path / inbox_path(prompt, "a.txt")).read_bytes() == b"a" * 90
    assert 'File "b.txt" (text/plain, 90 B) not downloaded: over the limit' in prompt
    assert (tmp_path / inbox_path(prompt, "c.txt")).read_bytes() == b"c"
    assert 'File "gone.txt" (text/plain, 1 B) not downloaded: could not be downloaded' in prompt
    inbox = next((tmp_path / ".chatbridge" / "inbox").iterdir())
    assert sorted(p.name for p in inbox.iterdir()) == ["a.txt", "c.txt"]  # no partial file left


async def test_hostile_file_names_stay_inside_the_inbox_and_are_unique(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    files = {"1": b"one", "2": b"two", "3": b"three"}
    chat = FileRoom(console_room(settings), "local", files)
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("../../escape.txt", "text/plain", 3, "1"),
        Attachment("..", "text/plain", 3, "2"),
        Attachment("escape.txt", "text/plain", 5, "3"),
    )
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(sent)
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    inbox = next((tmp_path / ".chatbridge" / "inbox").iterdir())
    assert sorted(p.name for p in inbox.iterdir()) == ["_.._escape.txt", "escape.txt", "file"]
    assert not (tmp_path / "escape.txt").exists()


async def test_files_of_bots_and_strangers_are_ignored(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        bot = with_files(chat.room, "f-2", NOTES, sender_is_bot=True)
        stranger = with_files(chat.room, "f-3", NOTES, sender="stranger")
        assert await chat.sink(bot) is Accepted.IGNORED
        assert await chat.sink(stranger) is Accepted.IGNORED
        await chat.say("and now some text")
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    assert chat.texts(ReplyKind.RESULT) == ["and now some text"]
    assert chat.fetched == []


async def test_files_pending_at_a_crash_run_after_the_restart(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    try:
        await store.accept(with_files(console_room(settings), "f-1", NOTES), time.time())
    finally:
        await store.close()
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (_, _room):
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    assert (tmp_path / inbox_path(prompt, "notes.txt")).read_bytes() == b"hello notes"


async def test_images_are_shown_to_claude_as_image_content(tmp_path: Path) -> None:
    record = tmp_path / "claude.json"
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, env=env))
    chat = FileRoom(console_room(settings), "local", {"img": PNG, "doc": b"text"})
    sent = with_files(
        console_room(settings),
        "f-1",
        Attachment("dot.png", "image/png", len(PNG), "img"),
        Attachment("doc.txt", "text/plain", 4, "doc"),
        text="what is in the picture?",
    )
    prompt = await prompt_of(settings, chat, sent)
    png = inbox_path(prompt, "dot.png")
    assert f'File "{png}" (image/png, {len(PNG)} B), shown to you as an image' in prompt
    assert f'File "{inbox_path(prompt, "doc.txt")}" (text/plain, 4 B)' in prompt.splitlines()
    content = json.loads(record.read_text())["content"]
    assert content[0] == {"type": "text", "text": prompt}
    assert content[1:] == [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(PNG).decode(),
            },
        }
    ]


async def test_a_stop_while_files_are_fetched_leaves_no_part_file(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    chat = FileRoom(console_room(settings), "local", {})
    chat.hang = True
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(with_files(chat.room, "f-1", NOTES))
        await chat.hanging.wait()
        await chat.say("!stop")
        await chat.wait_until(lambda: rows(tmp_path, "select status from runs") == [("stopped",)])
    inbox = next((tmp_path / ".chatbridge" / "inbox").iterdir())
    assert list(inbox.iterdir()) == []
    assert chat.texts(ReplyKind.RESULT) == []


async def test_a_message_with_files_is_not_steered_but_runs_after_with_its_files(
    tmp_path: Path,
) -> None:
    tools = tmp_path / "tools.jsonl"
    gate = tmp_path / "gate"
    env = {**ECHO, "FAKE_CLAUDE_TOOL_LOG": str(tools), "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate)}
    config = {
        "defaults": {"during_run": "steer"},
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
    }
    settings = load_settings(write_config(tmp_path, config, env=env))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    async with serving(settings, chat) as (service, _room):
        assert chat.sink is not None
        await chat.say("first")
        # The run's tool is running: claude takes steered messages now (a file
        # the fake writes; nothing to await on).
        async with asyncio.timeout(30):
            while not tools.exists():
                await asyncio.sleep(0.02)
        await chat.sink(with_files(chat.room, "f-1", NOTES, text="and this file"))
        # Until the dispatcher offered it to the run (its batch gathers first): the run
        # either took it or gave it back to wait for its turn.
        async with asyncio.timeout(30):
            while True:
                status = service.parts.dispatcher.status(chat.room)
                if status.steering == 0 and (status.steered or status.waiting):
                    break
                await asyncio.sleep(0.02)
        assert (status.steered, status.waiting) == (0, 1)
        gate.touch()
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 2)
    first, second = chat.texts(ReplyKind.RESULT)
    assert "and this file" not in first
    assert "> and this file" in second
    assert (tmp_path / inbox_path(second, "notes.txt")).read_bytes() == b"hello notes"
    assert rows(tmp_path, "select count(*) from runs") == [(2,)]


async def test_a_threads_files_land_in_its_worktree_and_do_not_keep_it_from_a_reset(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@example.com"],
        ["config", "user.name", "t"],
        ["commit", "-q", "--allow-empty", "-m", "first"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    config = {
        "dispatcher": {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 1},
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    settings = load_settings(write_config(tmp_path, config))
    chat = FileRoom(console_room(settings), "local", {"ref-notes": b"hello notes"})
    tree = repo / ".chatbridge" / "worktrees" / slug("t1")
    sent = dataclasses.replace(with_files(chat.room, "f-1", NOTES, text="read it"), thread="t1")
    async with serving(settings, chat) as (service, _room):
        assert chat.sink is not None
        await chat.sink(sent)
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
        # The answer comes before the run has ended: a reset then would keep the worktree.
        async with asyncio.timeout(30):
            while service.parts.dispatcher.status(chat.room.in_thread("t1")).running is not None:
                await asyncio.sleep(0.02)
        [prompt] = chat.texts(ReplyKind.RESULT)
        # Where claude runs: the thread's worktree, not the room's checkout.
        assert (tree / inbox_path(prompt, "notes.txt")).read_bytes() == b"hello notes"
        assert not (repo / ".chatbridge" / "inbox").exists()
        await chat.say("!reset", thread="t1")
        await chat.wait_until(lambda: any("worktree" in t for t in chat.texts(ReplyKind.NOTICE)))
    [said] = [t for t in chat.texts(ReplyKind.NOTICE) if "worktree" in t]
    assert "Removed the thread's worktree" in said
