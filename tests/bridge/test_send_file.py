"""Files claude posts with ``send_file``: through the service, the bridge's own check,
and exactly once across a restart (docs/files.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bridge.config import Settings, load_settings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    Reply,
    RoomId,
    RoomKey,
    RunId,
    TransportName,
    UserId,
)
from bridge.core.transport import Duplex, RateLimited, TransportError
from bridge.metrics import Metrics
from bridge.outbound.outbox import Outbox
from bridge.runs.file_posts import FILES_DIR, FilePosts, copy_file, post_key, send_file_rules
from bridge.runs.request import run_request
from bridge.service import open_store
from bridge.store.base import Store
from runner.events import ToolResult, ToolUse
from runner.mcp_server import QUALIFIED_TOOL, NotSendable, check_sendable
from tests.bridge.harness import ConsoleSession, run_console, write_config
from tests.bridge.real_claude import real_claude_config
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin

ROOM = RoomKey(TransportName("console"), RoomId("console"))


def no_copies(state_dir: Path) -> bool:
    files = state_dir / FILES_DIR
    return not files.exists() or not any(files.iterdir())


def send_env(*inputs: dict[str, str]) -> dict[str, str]:
    return {"FAKE_CLAUDE_SEND_FILE": json.dumps(list(inputs)), "FAKE_CLAUDE_RESULT": "All sent."}


async def test_a_file_claude_sends_is_posted_before_the_answer(tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("the numbers\n")
    config = write_config(
        tmp_path, env=send_env({"path": "report.txt", "comment": "Here is the report."})
    )
    out = await run_console(config, ["send me the report"])
    assert "[file] report.txt (12 bytes)\nHere is the report.\n" in out
    assert out.index("[file] report.txt") < out.index("All sent.")
    # The bridge's copy went once the post was delivered.
    assert no_copies(tmp_path / "state")


async def test_refused_paths_post_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.txt").write_text("TOP-SECRET-CONTENT")
    (work / "link").symlink_to(tmp_path / "secret.txt")
    config = write_config(
        tmp_path,
        {"defaults": {"cwd": work, "max_send_file_bytes": 3}},
        env=send_env(
            {"path": "../secret.txt"},
            {"path": "link"},
            {"path": "/etc/hostname"},
            {"path": "big.txt"},
        ),
    )
    (work / "big.txt").write_text("four")
    out = await run_console(config, ["send them"])
    assert "[file]" not in out
    assert "TOP-SECRET-CONTENT" not in out
    assert "All sent." in out


async def test_send_file_needs_approval_when_the_room_says_so(tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("x")
    config = write_config(
        tmp_path,
        {"defaults": {"send_files_need_approval": True}},
        env=send_env({"path": "report.txt"}),
    )
    settings = load_settings(config)
    room = settings.room(ROOM)
    assert room is not None
    assert send_file_rules(room) == ()
    out = await run_console(settings, ["send it"])
    assert "[file]" not in out  # refused by claude's rules (print mode asks nobody)


def test_the_run_request_carries_the_tool_and_the_limit(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, {"defaults": {"max_send_file_bytes": "2M"}}))
    room = settings.room(ROOM)
    assert room is not None
    request = run_request(settings, room, RunId("r"), "hi", None)
    assert request.send_file_max_bytes == 2 * 1024 * 1024
    assert QUALIFIED_TOOL in request.allowed_tools
    off = load_settings(write_config(tmp_path, {"defaults": {"send_files": False}}))
    room = off.room(ROOM)
    assert room is not None
    request = run_request(off, room, RunId("r"), "hi", None)
    assert request.send_file_max_bytes is None
    assert QUALIFIED_TOOL not in request.allowed_tools


# -- the bridge's side, against a real SQLite store --------------------------------


class Posted(Duplex):
    """Keeps what it was asked to post (and a copy of each file's bytes)."""

    name = TransportName("console")

    def __init__(self) -> None:
        self.files: list[tuple[str, bytes, str]] = []
        self.texts: list[str] = []

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        assert reply.file is not None
        path = Path(reply.file)
        self.files.append((path.name, path.read_bytes(), reply.text))
        return ExternalMessageId(f"f{len(self.files)}")

    async def send(self, reply: Reply, delivery: object = None) -> ExternalMessageId | None:
        self.texts.append(reply.text)
        return ExternalMessageId(f"t{len(self.texts)}")


def batch() -> Batch:
    message = Message(MessageId(1), ROOM, UserId("u"), "send it", ExternalMessageId("m1"), 0.0)
    return Batch(ROOM, (message,))


def use(path: str, use_id: str = "toolu_1") -> tuple[ToolUse, ToolResult]:
    return (
        ToolUse(use_id, QUALIFIED_TOOL, {"path": path, "comment": "see"}),
        ToolResult(use_id, "queued", False),
    )


async def posts(settings: Settings, store: Store, outbox: Outbox) -> FilePosts:
    return FilePosts(store, outbox, Metrics(), settings.runner.state_dir)


async def see_all(files: FilePosts, settings: Settings, events: tuple[ToolUse, ToolResult]) -> None:
    room = settings.room(ROOM)
    assert room is not None
    watcher = files.watch(RunId("run-1"), batch(), room)
    for event in events:
        post = watcher.see(event)
        if post is not None:
            await post


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(write_config(tmp_path))


async def test_the_bridge_checks_again_and_tells_the_room(
    settings: Settings, tmp_path: Path
) -> None:
    # The tool said "queued" (a forged or stale result): the bridge's own check decides.
    store = await open_store(settings)
    try:
        outbox = Outbox(store, {}, Metrics())
        await see_all(await posts(settings, store, outbox), settings, use("../elsewhere/x.txt"))
        [entry] = await store.undelivered()
        assert entry.reply.file is None
        assert "outside the working directory" in entry.reply.text
        assert entry.key == post_key(RunId("run-1"), "toolu_1")
    finally:
        await store.close()


async def test_a_restart_between_the_tool_result_and_the_post_posts_once(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "report.txt").write_text("first")
    store = await open_store(settings)
    try:
        # Recorded, then the process dies before the outbox delivers (no transport).
        await see_all(
            await posts(settings, store, Outbox(store, {}, Metrics())), settings, use("report.txt")
        )
        (tmp_path / "report.txt").write_text("edited later")
    finally:
        await store.close()

    store = await open_store(settings)
    transport = Posted()
    outbox = Outbox(store, {transport.name: transport}, Metrics())
    try:
        async with asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(outbox.serve())
            # The reattached run replays its journal: the same tool use again.
            await see_all(await posts(settings, store, outbox), settings, use("report.txt"))
            assert await outbox.drain(30)
            serving.cancel()
    finally:
        await store.close()
    assert transport.files == [("report.txt", b"first", "see")]  # as it was when sent
    assert no_copies(settings.runner.state_dir)


async def test_a_crash_after_the_copy_posts_the_copy(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("changed since")
    key = post_key(RunId("run-1"), "toolu_1")
    left = settings.runner.state_dir / FILES_DIR / key
    left.mkdir(parents=True)
    (left / "report.txt").write_text("as copied")
    store = await open_store(settings)
    try:
        await see_all(
            await posts(settings, store, Outbox(store, {}, Metrics())), settings, use("report.txt")
        )
        [entry] = await store.undelivered()
        assert entry.reply.file is not None
        assert Path(entry.reply.file).read_text() == "as copied"
    finally:
        await store.close()


async def test_a_replay_after_delivery_records_nothing(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("x")
    store = await open_store(settings)
    transport = Posted()
    outbox = Outbox(store, {transport.name: transport}, Metrics())
    try:
        async with asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(outbox.serve())
            files = await posts(settings, store, outbox)
            await see_all(files, settings, use("report.txt"))
            assert await outbox.drain(30)
            await see_all(files, settings, use("report.txt"))
            assert await store.undelivered() == []
            serving.cancel()
    finally:
        await store.close()
    assert len(transport.files) == 1
    assert no_copies(settings.runner.state_dir)


async def test_a_failed_tool_result_posts_nothing(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("x")
    store = await open_store(settings)
    try:
        tool_use, _ = use("report.txt")
        refused = ToolResult(tool_use.id, "not sent", True)
        await see_all(
            await posts(settings, store, Outbox(store, {}, Metrics())),
            settings,
            (tool_use, refused),
        )
        assert await store.undelivered() == []
    finally:
        await store.close()


async def test_a_lost_copy_is_given_up(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("x")
    store = await open_store(settings)
    transport = Posted()
    try:
        await see_all(
            await posts(settings, store, Outbox(store, {}, Metrics())), settings, use("report.txt")
        )
        [entry] = await store.undelivered()
        assert entry.reply.file is not None
        Path(entry.reply.file).unlink()  # the state directory was cleaned by hand
        outbox = Outbox(store, {transport.name: transport}, Metrics())
        async with asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(outbox.serve())
            assert await outbox.drain(30)
            serving.cancel()
    finally:
        await store.close()
    assert transport.files == []
    # The room is told (claude was told the file was queued).
    assert any("Could not post the file `report.txt`" in t for t in transport.texts)


class Throttled(Posted):
    """Rate-limits the first upload, fails the second with a network error, then posts."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        self.attempts += 1
        if self.attempts == 1:
            raise RateLimited("console", 0.5)
        if self.attempts == 2:
            raise TransportError("console", "connection reset")
        return await super().send_file(reply, key)


async def test_a_file_post_waits_out_rate_limits_and_retries_like_an_answer(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "report.txt").write_text("x")
    store = await open_store(settings)
    transport = Throttled()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    outbox = Outbox(store, {transport.name: transport}, Metrics(), sleep=sleep, retry_base_s=0.1)
    try:
        async with asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(outbox.serve())
            await see_all(await posts(settings, store, outbox), settings, use("report.txt"))
            assert await outbox.drain(30)
            serving.cancel()
    finally:
        await store.close()
    assert transport.attempts == 3
    assert transport.files == [("report.txt", b"x", "see")]
    assert waits[0] == 0.5  # what the server asked
    assert len(waits) == 2


async def test_a_state_directory_that_cannot_take_the_copy_tells_the_room(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "report.txt").write_text("x")
    settings.runner.state_dir.mkdir(parents=True, exist_ok=True)
    (settings.runner.state_dir / FILES_DIR).write_text("a file where a directory belongs")
    store = await open_store(settings)
    try:
        await see_all(
            await posts(settings, store, Outbox(store, {}, Metrics())), settings, use("report.txt")
        )
        [entry] = await store.undelivered()
        assert entry.reply.file is None
        assert "could not copy it" in entry.reply.text
    finally:
        await store.close()


async def test_with_need_approval_each_send_is_asked_in_the_room(tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("approved bytes")
    config = write_config(
        tmp_path,
        {"defaults": {"approve_tools": True, "send_files_need_approval": True}},
        env={**send_env({"path": "report.txt", "comment": "ok"}), "FAKE_CLAUDE_NO_TOOL": "1"},
    )
    async with asyncio.timeout(30), ConsoleSession(load_settings(config)) as bridge:
        bridge.send("send it")
        await bridge.wait_for("Claude asks to use")
        assert "[file]" not in bridge.out.getvalue()  # it waits for the room
        bridge.send("!approve")
        out = await bridge.wait_for("All sent.")
    assert "mcp__chatbridge__send_file" in out
    assert out.index("[file] report.txt (14 bytes)") < out.index("All sent.")


@pytest.mark.slow
@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_the_real_claude_sends_a_file_through_the_service(tmp_path: Path) -> None:
    (tmp_path / "report.txt").write_text("from the real CLI\n")
    script = [
        Turn(tools=(ToolCall(QUALIFIED_TOOL, {"path": "report.txt", "comment": "Here."}),)),
        Turn(text="All sent."),
    ]
    async with ModelServer(script) as server:
        config = real_claude_config(tmp_path, server)
        out = await run_console(config, ["send me the report"])
    assert "[file] report.txt (18 bytes)\nHere.\n" in out
    assert out.index("[file] report.txt") < out.index("All sent.")


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(
    tmp_path: Path,
) -> None:
    """Between the check and the copy, ``sub`` becomes a link to a directory outside
    the cwd holding a file of the same name: the copy refuses, and reads nothing."""
    cwd, outside = tmp_path / "cwd", tmp_path / "outside"
    (cwd / "sub").mkdir(parents=True)
    outside.mkdir()
    (cwd / "sub" / "notes.txt").write_text("inside")
    (outside / "notes.txt").write_text("a secret")
    sendable = check_sendable(cwd, "sub/notes.txt", 1000)
    (cwd / "sub" / "notes.txt").unlink()
    (cwd / "sub").rmdir()
    (cwd / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(NotSendable, match="a link now"):
        copy_file(cwd.resolve(), sendable.path, tmp_path / "copies" / "k", 1000)
    assert not (tmp_path / "copies").exists() or not any((tmp_path / "copies").rglob("*.txt"))


def test_a_checked_file_is_copied_from_beneath_the_cwd(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "r.txt").write_text("data")
    sendable = check_sendable(tmp_path, "a/b/r.txt", 1000)
    copy = copy_file(tmp_path.resolve(), sendable.path, tmp_path / "copies" / "k", 1000)
    assert copy.read_text() == "data"
