"""Files, names and replies against a real Synapse: media uploaded through the client
API (plain and encrypted), fetched by the transport; pills, display names and the
replied-to text carried on the message."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from nio import UploadResponse

from bridge.core.transport import FileTooLarge, TransportError
from tests.file_modes import mode
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.seen import ALICE, answer_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"


async def upload(human: Human, data: bytes, *, encrypt: bool) -> tuple[str, dict[str, Any] | None]:
    response, keys = await human.client.upload(
        io.BytesIO(data),
        content_type="text/plain",
        filename="notes.txt",
        encrypt=encrypt,
        filesize=len(data),
    )
    assert isinstance(response, UploadResponse), response
    return response.content_uri, keys


async def test_a_shared_file_is_handed_over_and_fetched(
    alice: Human, make_transport: TransportFactory, tmp_path: Path
) -> None:
    room = await alice.create_room([BOT])
    data = b"the notes\n" * 50
    url, _ = await upload(alice, data, encrypt=False)
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        info = {"mimetype": "text/plain", "size": len(data)}
        await alice.send(room, "notes.txt", msgtype="m.file", extra={"url": url, "info": info})
        await alice.send(room, "and now text")
        await sink.wait_for_text("and now text")
        shared = sink.messages[0]
        assert shared.text == ""
        [file] = shared.attachments
        assert (file.name, file.mime, file.size) == ("notes.txt", "text/plain", len(data))
        await transport.outbound.fetch_attachment(file, tmp_path / "notes.txt", len(data))
        assert (tmp_path / "notes.txt").read_bytes() == data
        with pytest.raises(FileTooLarge):
            await transport.outbound.fetch_attachment(file, tmp_path / "cut", len(data) - 1)


async def test_an_encrypted_file_is_decrypted_and_its_hash_checked(
    alice: Human, make_transport: TransportFactory, tmp_path: Path
) -> None:
    room = await alice.create_room([BOT], encrypted=True)
    data = b"secret notes"
    url, keys = await upload(alice, data, encrypt=True)
    assert keys is not None
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        extra = {"file": {**keys, "url": url}, "info": {"mimetype": "text/plain"}}
        await alice.send(room, "notes.txt", msgtype="m.file", extra=extra)
        await alice.send(room, "done")
        await sink.wait_for_text("done")
        [file] = sink.messages[0].attachments
        assert "secret" not in file.ref  # the ref holds the keys, never the content
        await transport.outbound.fetch_attachment(file, tmp_path / "plain", 1000)
        assert (tmp_path / "plain").read_bytes() == data
        # A file whose hash does not match is not kept.
        forged = {**keys, "url": url, "hashes": {"sha256": "AAAA" + keys["hashes"]["sha256"][4:]}}
        await alice.send(room, "forged.txt", msgtype="m.file", extra={"file": forged})
        await alice.send(room, "done again")
        await sink.wait_for_text("done again")
        [bad] = sink.messages[2].attachments
        with pytest.raises(TransportError, match="failed its check"):
            await transport.outbound.fetch_attachment(bad, tmp_path / "bad", 1000)


@pytest.mark.parametrize("encrypted", [False, True])
async def test_names_pills_and_replies_are_carried_on_the_message(
    alice: Human, mallory: Human, make_transport: TransportFactory, encrypted: bool
) -> None:
    room = await alice.create_room([BOT, mallory.user.user_id], encrypted=encrypted)
    await mallory.join(room)
    await alice.client.set_displayname("Alice Liddell")
    await mallory.client.set_displayname("Mallory M")
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        mallory_id = mallory.user.user_id
        first = await alice.send(room, "the build is red since Tuesday, see ci logs")
        pill = f'<a href="https://matrix.to/#/{mallory_id}">{mallory_id}</a>'
        await alice.send(
            room,
            f"> <{alice.user.user_id}> the build is red since Tuesday, see ci logs\n\n"
            f"ask {mallory_id} about it",
            extra={
                "format": "org.matrix.custom.html",
                "formatted_body": f"<mx-reply>...</mx-reply>ask {pill} about it",
                "m.relates_to": {"m.in_reply_to": {"event_id": first}},
            },
        )
        reply = await sink.wait_for_text("ask @Mallory M about it")
        assert reply.sender_name == "Alice Liddell"
        assert reply.reply_to_text == "the build is red since Tuesday, see ci logs"
        assert sink.messages[0].reply_to_text is None


async def test_the_service_runs_an_encrypted_file_and_a_reply_with_the_file_in_its_inbox(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id], encrypted=True)
    data = b"line one\nline two\n"
    echo = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=echo):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.sync()
        url, keys = await upload(alice, data, encrypt=True)
        assert keys is not None
        extra = {
            "file": {**keys, "url": url},
            "info": {"mimetype": "text/plain", "size": len(data)},
            "filename": "notes.txt",
        }
        await alice.send(room, "what do the notes say?", msgtype="m.file", extra=extra)
        answer = await alice.wait_for(answer_in(bot, room))
    body = answer.content["body"]
    assert "@alice:localhost" in body
    match = re.search(r'File "(\.chatbridge/inbox/run-[0-9a-f]+/notes\.txt)" \(text/plain', body)
    assert match is not None, body
    assert "> what do the notes say?" in body
    decrypted = tmp_path / match.group(1)
    assert decrypted.read_bytes() == data
    # The plaintext of an end-to-end encrypted file is for chatbridge's user alone.
    assert (mode(decrypted), mode(decrypted.parent)) == (0o600, 0o700)
