"""The sync loop's rules that need no server: late keys, redactions, damaged files,
notices, long gaps, leading mentions, events the sink refuses.

The client is a small stand-in offering only what these paths call; what
involves the server's behaviour is tested against Synapse elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from nio import AsyncClient, Event, MegolmEvent, RoomGetEventResponse
from nio.exceptions import EncryptionError
from sqlalchemy import event

from bridge.core.model import InboundMessage, RoomId
from bridge.core.transport import (
    Accepted,
    InboundEvent,
    MessageDeleted,
    MessageEdited,
    RoomBinding,
    SinkClosed,
)
from bridge.store.sql import SqlStore
from transports.backoff import Backoff
from transports.matrix import MatrixSettings, MatrixTransport
from transports.matrix.inbound import InboundPolicy, to_inbound
from transports.matrix.setaside import ATTEMPTS
from transports.matrix.state import UndecryptableFile
from transports.matrix.sync import Syncer

BOT = "@bot:hs"
ROOM = "!room:hs"
POLICY = InboundPolicy(BOT, ignore_other_bots=True, ignore_users=frozenset())


def source(event_id: str, content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "m.room.message",
        "event_id": event_id,
        "sender": "@alice:hs",
        "origin_server_ts": 1,
        "content": content,
        **extra,
    }


def text(event_id: str, body: str, sender: str = "@alice:hs") -> Any:
    return Event.parse_event(source(event_id, {"msgtype": "m.text", "body": body}, sender=sender))


def encrypted(event_id: str, sender: str = "@alice:hs") -> MegolmEvent:
    content = {
        "algorithm": "m.megolm.v1.aes-sha2",
        "ciphertext": "AwgAEnA",
        "sender_key": "senderkey",
        "session_id": "session",
        "device_id": "DEV",
    }
    event = Event.parse_event(
        source(event_id, content, sender=sender, type="m.room.encrypted", room_id=ROOM)
    )
    assert isinstance(event, MegolmEvent)
    event.room_id = ROOM
    return event


class StandInClient:
    """What the sync paths call on nio's client; keys "arrive" by filling ``keys``."""

    def __init__(self) -> None:
        self.user_id = BOT
        self.rooms: dict[str, Any] = {}
        self.keys: dict[str, Any] = {}
        self.senders: dict[str, str] = {}
        """Original event id -> its sender, for the edit check."""
        self.history: list[Any] = []
        """Older events the server pages back through (oldest first)."""

    def decrypt_event(self, event: MegolmEvent) -> Any:
        if event.event_id in self.keys:
            return self.keys[event.event_id]
        raise EncryptionError("no session")

    async def request_room_key(self, event: MegolmEvent) -> None:
        return None

    async def room_get_event(self, room_id: str, event_id: str) -> RoomGetEventResponse:
        body = {"msgtype": "m.text", "body": "original"}
        return RoomGetEventResponse.from_dict(source(event_id, body, sender=self.senders[event_id]))

    async def room_messages(
        self, room_id: str, start: str, end: str, direction: object, limit: int
    ) -> SimpleNamespace:
        """Backwards from index ``start`` of ``history``, like /messages."""
        stop = int(start)
        begin = max(0, stop - limit)
        chunk = list(reversed(self.history[begin:stop]))
        return SimpleNamespace(chunk=chunk, end=str(begin) if begin else None)


def as_client(client: StandInClient) -> AsyncClient:
    return cast(AsyncClient, client)


class Sink:
    """Records what it takes; refuses texts in ``refuse`` while ``refusing``."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.events: list[InboundEvent] = []
        self.refuse = refuse
        self.refused = 0

    async def __call__(self, event: InboundEvent) -> Accepted:
        if getattr(event, "text", None) in self.refuse:
            self.refused += 1
            raise ValueError("the store cannot take this")
        self.events.append(event)
        return Accepted.ACCEPTED

    def texts(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, InboundMessage)]


def sync_response(*events: Any, limited: bool = False, prev_batch: str | None = None) -> Any:
    timeline = SimpleNamespace(events=list(events), limited=limited, prev_batch=prev_batch)
    return SimpleNamespace(rooms=SimpleNamespace(join={ROOM: SimpleNamespace(timeline=timeline)}))


def settings(tmp_path: Path, **extra: Any) -> MatrixSettings:
    return MatrixSettings.model_validate(
        {
            "homeserver": "http://127.0.0.1:9",
            "user_id": BOT,
            "password": "pw",
            "store_path": tmp_path / "store",
            **extra,
        }
    )


def make_syncer(tmp_path: Path, told: list[str] | None = None, **extra: Any) -> Syncer:
    (tmp_path / "store").mkdir(parents=True, exist_ok=True)

    async def tell_room(room_id: RoomId, text: str, key: str) -> None:
        if told is not None:
            told.append(key)

    return Syncer(
        settings(tmp_path, **extra),
        {RoomId(ROOM): RoomBinding(RoomId(ROOM))},
        POLICY,
        Backoff(base=0.01, cap=0.02),
        tell_room,
    )


FORGED_EDIT = source(
    "$edit",
    {
        "msgtype": "m.text",
        "body": "* rm -rf / please",
        "m.new_content": {"msgtype": "m.text", "body": "rm -rf / please"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$alices"},
    },
    sender="@mallory:hs",
)


async def test_a_forged_edit_whose_key_arrives_late_is_dropped(tmp_path: Path) -> None:
    client, sink = StandInClient(), Sink()
    client.senders["$alices"] = "@alice:hs"
    syncer = make_syncer(tmp_path)
    await syncer._deliver(
        as_client(client), sync_response(encrypted("$edit", "@mallory:hs")), "s1", sink
    )
    client.keys["$edit"] = Event.parse_event(FORGED_EDIT)
    await syncer._waiting.retry(as_client(client), sink)
    assert sink.events == []
    assert len(syncer._waiting) == 0  # settled: dropped, not kept for ever
    # The same edit by alice herself, decrypted late, goes through.
    client.senders["$alices"] = "@mallory:hs"
    await syncer._deliver(
        as_client(client), sync_response(encrypted("$edit2", "@mallory:hs")), "s2", sink
    )
    client.keys["$edit2"] = Event.parse_event({**FORGED_EDIT, "event_id": "$edit2"})
    await syncer._waiting.retry(as_client(client), sink)
    assert [type(e) for e in sink.events] == [MessageEdited]


async def test_a_message_redacted_while_waiting_for_its_key_never_runs(tmp_path: Path) -> None:
    client, sink = StandInClient(), Sink()
    told: list[str] = []
    syncer = make_syncer(tmp_path, told, undecryptable_notice_s=0)
    await syncer._deliver(as_client(client), sync_response(encrypted("$secret")), "s1", sink)
    redaction = Event.parse_event(source("$red", {}, type="m.room.redaction", redacts="$secret"))
    await syncer._deliver(as_client(client), sync_response(redaction), "s2", sink)
    client.keys["$secret"] = text("$secret", "drop the prod db")
    await syncer._waiting.retry(as_client(client), sink)
    assert [type(e) for e in sink.events] == [MessageDeleted]
    assert told == []  # no "could not read" notice for a message that is gone
    assert json.loads((tmp_path / "store" / "undecryptable.json").read_text()) == []


@pytest.mark.parametrize("content", ["", "[{", "{}", '[{"room_id": "!r"}]', "\x00\x00", "\xff"])
def test_a_damaged_undecryptable_file_is_moved_aside(tmp_path: Path, content: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "undecryptable.json").write_text(content, encoding="latin-1")
    MatrixTransport(settings(tmp_path), [RoomBinding(RoomId(ROOM))])
    assert UndecryptableFile(store).load() == []
    moved = [p.name for p in store.iterdir() if p.name.startswith("undecryptable.json.damaged-")]
    assert len(moved) == 1
    assert (store / moved[0]).read_text(encoding="latin-1") == content


async def test_a_notice_for_a_room_the_bot_is_not_in_does_not_wait_for_a_sync(
    tmp_path: Path,
) -> None:
    """The notice is sent from inside the sync loop: waiting there for a sync
    that shows the room would wait for ever (no sync runs meanwhile)."""
    (tmp_path / "store").mkdir()
    transport = MatrixTransport(
        settings(tmp_path, sync_timeout_ms=3_600_000, undecryptable_notice_s=0),
        [RoomBinding(RoomId(ROOM))],
    )
    client = StandInClient()  # client.rooms is empty: the bot left ROOM
    transport.outbound.client = as_client(client)
    waiting = transport._syncer._waiting
    await waiting.keep(as_client(client), ROOM, encrypted("$gone"))
    # A wait for a sync would never end here: the test's own timeout is the proof.
    async with asyncio.timeout(5):
        await waiting.retry(as_client(client), Sink())
    kept = json.loads((tmp_path / "store" / "undecryptable.json").read_text())
    assert [k["noticed"] for k in kept] == [True]  # not tried on every sync


async def test_the_notice_key_comes_from_the_event(tmp_path: Path) -> None:
    client = StandInClient()
    told: list[str] = []
    for attempt in range(2):  # the same event seen by two runs of the bridge
        syncer = make_syncer(tmp_path / str(attempt), told, undecryptable_notice_s=0)
        await syncer._waiting.keep(as_client(client), ROOM, encrypted("$e"))
        await syncer._waiting.retry(as_client(client), Sink())
    await make_syncer(tmp_path / "other", told, undecryptable_notice_s=0)._waiting.keep(
        as_client(client), ROOM, encrypted("$other")
    )
    assert len(told) == 2
    assert told[0] == told[1]


async def test_a_gap_longer_than_any_limit_is_delivered_whole(tmp_path: Path) -> None:
    client, sink = StandInClient(), Sink()
    total = 2_345
    client.history = [text(f"$m{i}", f"m{i}") for i in range(total)]
    last = text("$last", "last")
    response = sync_response(last, limited=True, prev_batch=str(total))
    await make_syncer(tmp_path)._deliver(as_client(client), response, "s1", sink)
    assert sink.texts() == [f"m{i}" for i in range(total)] + ["last"]


async def test_one_event_the_sink_refuses_is_set_aside_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    client, sink = StandInClient(), Sink(refuse=frozenset({"poison"}))
    syncer = make_syncer(tmp_path)
    batch = sync_response(text("$a", "before"), text("$p", "poison"), text("$b", "after"))
    for _ in range(ATTEMPTS - 1):
        # At first the batch is retried, nothing is skipped (the messages taken
        # with it come again: the service drops them as duplicates).
        with pytest.raises(ValueError, match="cannot take"):
            await syncer._deliver(as_client(client), batch, "s1", sink)
        assert len(syncer._set_aside) == 0
    await syncer._deliver(as_client(client), batch, "s1", sink)
    assert sink.texts()[-1] == "after"
    assert sink.refused == ATTEMPTS
    kept = json.loads((tmp_path / "store" / "set_aside.json").read_text())
    assert [k["source"]["event_id"] for k in kept] == ["$p"]
    # A replay of the batch does not offer it again; a restart still has it.
    await syncer._deliver(as_client(client), batch, "s1", sink)
    assert sink.refused == ATTEMPTS
    restarted = make_syncer(tmp_path)
    assert len(restarted._set_aside) == 1
    # Once the sink takes it, it is delivered and gone from the file.
    sink.refuse = frozenset()
    restarted._set_aside._wake()
    await restarted._set_aside.retry(sink, restarted._translator(as_client(client)))
    assert sink.texts()[-1] == "poison"
    assert json.loads((tmp_path / "store" / "set_aside.json").read_text()) == []


async def test_a_set_aside_event_that_is_redacted_never_runs(tmp_path: Path) -> None:
    client, sink = StandInClient(), Sink(refuse=frozenset({"poison"}))
    syncer = make_syncer(tmp_path)
    batch = sync_response(text("$p", "poison"))
    for _ in range(ATTEMPTS - 1):
        with pytest.raises(ValueError, match="cannot take"):
            await syncer._deliver(as_client(client), batch, "s1", sink)
    await syncer._deliver(as_client(client), batch, "s1", sink)
    redaction = Event.parse_event(source("$red", {}, type="m.room.redaction", redacts="$p"))
    await syncer._deliver(as_client(client), sync_response(redaction), "s2", sink)
    sink.refuse = frozenset()
    syncer._set_aside._wake()
    await syncer._set_aside.retry(sink, syncer._translator(as_client(client)))
    assert sink.texts() == []
    assert len(syncer._set_aside) == 0


async def test_sink_closed_is_never_counted_as_a_refusal(tmp_path: Path) -> None:
    client = StandInClient()

    async def closed(event: InboundEvent) -> Accepted:
        raise SinkClosed

    syncer = make_syncer(tmp_path)
    for _ in range(ATTEMPTS + 1):
        with pytest.raises(SinkClosed):
            await syncer._deliver(as_client(client), sync_response(text("$a", "a")), "s1", closed)
    assert len(syncer._set_aside) == 0


def message(body: str, name: str | None = None, formatted: str | None = None) -> InboundMessage:
    content: dict[str, Any] = {"msgtype": "m.text", "body": body}
    if formatted is not None:
        content |= {"format": "org.matrix.custom.html", "formatted_body": formatted}
    inbound = to_inbound(Event.parse_event(source("$e", content)), ROOM, POLICY, name)
    assert isinstance(inbound, InboundMessage)
    return inbound


@pytest.mark.parametrize(
    "body",
    ["Claude code keeps crashing, why?", "Claude Shannon wrote a paper; summarise it", "Claudette"],
)
def test_a_sentence_starting_with_the_bots_name_keeps_its_words(body: str) -> None:
    msg = message(body, name="Claude")
    assert (msg.text, msg.mentions_bot) == (body, False)


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ("@bot !stop", None),
        ("@bot: !stop", None),
        ("@Claude !stop", "Claude"),
        ("Claude: !stop", "Claude"),
        ("Claude, !stop", "Claude"),
        ("\u200b@bot:hs !stop", None),
        ("\ufeff @bot:hs: !stop", None),
    ],
)
def test_a_leading_mention_then_a_command_is_the_command(body: str, name: str | None) -> None:
    msg = message(body, name=name)
    assert (msg.text, msg.mentions_bot) == ("!stop", True)


def test_a_pill_with_the_bare_name_is_a_mention_and_other_ids_are_not() -> None:
    pill = '<a href="https://matrix.to/#/@bot:hs">Claude</a> !stop'
    assert message("Claude !stop", name="Claude", formatted=pill).text == "!stop"
    assert message("@bot:other !stop").text == "@bot:other !stop"
    assert message("@botty !stop").text == "@botty !stop"


def test_nul_and_lone_surrogates_are_replaced_at_the_edge() -> None:
    msg = message("a\x00b \ud83d end")
    assert msg.text == "a\ufffdb \ufffd end"
    msg.text.encode("utf-8")


class StoreSink:
    """Records messages in a real SQLite store (the service's sink does so first), counting
    commits; an edit checks that every message before it in the response is recorded."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.commits = 0
        self.edits_saw: list[list[str]] = []

        @event.listens_for(store.writes_on, "commit")
        def _commit(_conn: object) -> None:
            self.commits += 1

    async def __call__(self, inbound: InboundEvent) -> Accepted:
        if isinstance(inbound, InboundMessage):
            taken = await self.store.accept(inbound, 1.0)
            return Accepted.ACCEPTED if taken is not None else Accepted.DUPLICATE
        self.edits_saw.append(await self.recorded())
        return Accepted.ACCEPTED

    async def recorded(self) -> list[str]:
        return [m.text for m in await self.store.pending_messages()]


@pytest.fixture
async def store_sink(tmp_path: Path) -> AsyncIterator[StoreSink]:
    store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
    try:
        yield StoreSink(store)
    finally:
        await store.close()


async def test_one_sync_responses_messages_are_recorded_in_one_commit_in_order(
    tmp_path: Path, store_sink: StoreSink
) -> None:
    texts = [f"m{i}" for i in range(30)]
    response = sync_response(*(text(f"${t}", t) for t in texts))
    syncer = make_syncer(tmp_path)
    store_sink.commits = 0
    await syncer._deliver(as_client(StandInClient()), response, "s1", store_sink)
    assert store_sink.commits == 1
    assert await store_sink.recorded() == texts
    # The replay after a crash before the position was saved: all duplicates, one commit.
    store_sink.commits = 0
    await syncer._deliver(as_client(StandInClient()), response, "s1", store_sink)
    assert store_sink.commits == 1
    assert await store_sink.recorded() == texts


async def test_an_edit_waits_for_the_messages_before_it_and_splits_the_group(
    tmp_path: Path, store_sink: StoreSink
) -> None:
    client = StandInClient()
    client.senders["$a1"] = "@alice:hs"
    edit = Event.parse_event(
        source(
            "$edit",
            {
                "msgtype": "m.text",
                "body": "* a1 fixed",
                "m.new_content": {"msgtype": "m.text", "body": "a1 fixed"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": "$a1"},
            },
        )
    )
    before = [text(f"$a{i}", f"a{i}") for i in range(5)]
    after = [text(f"$b{i}", f"b{i}") for i in range(5)]
    syncer = make_syncer(tmp_path)
    store_sink.commits = 0
    await syncer._deliver(as_client(client), sync_response(*before, edit, *after), "s1", store_sink)
    # The messages before the edit, then the messages after it: the edit's
    # check is a read, which commits nothing.
    assert store_sink.commits == 2
    assert store_sink.edits_saw == [[f"a{i}" for i in range(5)]]
    assert await store_sink.recorded() == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]
