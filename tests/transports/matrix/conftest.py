"""Fixtures: one real Synapse per test session, fresh humans and bridge state per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bridge.core.model import RoomId
from bridge.core.transport import RoomBinding
from tests.transports.matrix.matrix_helpers import Human, TransportFactory
from tests.transports.matrix.synapse_peer import (
    INSTALL_HINT,
    MatrixUser,
    SynapseServer,
    synapse_python,
)
from transports.backoff import Backoff
from transports.matrix import MatrixSettings, MatrixTransport


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    python = synapse_python()
    if python is None:
        reason = f"Synapse is not installed; install it with: {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = SynapseServer(python, tmp_path_factory.mktemp("synapse"))
    server.configure()
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def users(synapse: SynapseServer) -> dict[str, MatrixUser]:
    """The bot, alice (allowed in configured rooms) and mallory (not allowed)."""
    return {name: synapse.register(name) for name in ("chatbridge", "alice", "mallory")}


@pytest.fixture
def bot(users: dict[str, MatrixUser]) -> MatrixUser:
    return users["chatbridge"]


@asynccontextmanager
async def logged_in(
    synapse: SynapseServer, users: dict[str, MatrixUser], tmp_path: Path, name: str
) -> AsyncIterator[Human]:
    # A fresh device per test, so no test inherits another's sync position or keys.
    human = Human(synapse.url, synapse.login(users[name]), tmp_path / name)
    await human.start()
    try:
        yield human
    finally:
        await human.close()


@pytest.fixture
async def alice(
    synapse: SynapseServer, users: dict[str, MatrixUser], tmp_path: Path
) -> AsyncIterator[Human]:
    async with logged_in(synapse, users, tmp_path, "alice") as human:
        yield human


@pytest.fixture
async def mallory(
    synapse: SynapseServer, users: dict[str, MatrixUser], tmp_path: Path
) -> AsyncIterator[Human]:
    async with logged_in(synapse, users, tmp_path, "mallory") as human:
        yield human


@pytest.fixture
def make_transport(synapse: SynapseServer, bot: MatrixUser, tmp_path: Path) -> TransportFactory:
    """Builds bridges over one store directory (so a second one is a restart)."""

    def make(rooms: list[str], **overrides: object) -> MatrixTransport:
        fields: dict[str, object] = {
            "homeserver": synapse.url,
            "user_id": bot.user_id,
            "password": bot.password,
            "store_path": tmp_path / "bridge-store",
            "sync_timeout_ms": 2_000,
        }
        fields.update(overrides)
        settings = MatrixSettings.model_validate(fields)
        return MatrixTransport(
            settings,
            [RoomBinding(RoomId(r)) for r in rooms],
            backoff=Backoff(base=0.05, cap=0.5),
        )

    return make


@pytest.fixture
async def bot_client(
    synapse: SynapseServer, users: dict[str, MatrixUser], tmp_path: Path
) -> AsyncIterator[Human]:
    """The bot's account on a device of its own: lets a test act as the bot's operator."""
    human = Human(synapse.url, synapse.login(users["chatbridge"]), tmp_path / "bot-client")
    await human.start()
    yield human
    await human.close()


@pytest.fixture
def synapse_bot_token(users: dict[str, MatrixUser]) -> str:
    """An access token of the bot (its registration device)."""
    return users["chatbridge"].access_token
