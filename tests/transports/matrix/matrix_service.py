"""The real service (``chatbridge run``) as a subprocess, bridged to the test Synapse."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from tests.config_files import merged, toml_text
from tests.service_process import RunningService, base_config, run_service
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer


def config_toml(
    tmp: Path,
    *,
    synapse: SynapseServer,
    bot: MatrixUser,
    room_id: str,
    allowed: tuple[str, ...],
    matrix_extra: Mapping[str, object],
    room_extra: Mapping[str, object] | None = None,
    extra: Mapping[str, object] | None = None,
) -> str:
    """A service configuration with only the Matrix transport and the fake claude."""
    matrix = {
        "homeserver": synapse.url,
        "user_id": bot.user_id,
        "store_path": tmp / "matrix-store",
        "sync_timeout_ms": 5000,
        **matrix_extra,
    }
    room = {
        "transport": "matrix",
        "id": room_id,
        "allowed_users": list(allowed),
        **(room_extra or {}),
    }
    config = merged(base_config(tmp), extra or {})
    return toml_text(merged(config, {"matrix": matrix, "rooms": [room]}))


@asynccontextmanager
async def service(
    tmp: Path,
    synapse: SynapseServer,
    bot: MatrixUser,
    room_id: str,
    *,
    allowed: tuple[str, ...],
    claude_env: Mapping[str, str] | None = None,
    matrix_extra: Mapping[str, object] | None = None,
    room_extra: Mapping[str, object] | None = None,
    extra: Mapping[str, object] | None = None,
) -> AsyncIterator[RunningService]:
    """``chatbridge run`` until the block ends (SIGTERM, then KILL); the bot's password
    comes from the environment, as in production, and must never reach the log."""
    config = tmp / "chatbridge.toml"
    config.write_text(
        config_toml(
            tmp,
            synapse=synapse,
            bot=bot,
            room_id=room_id,
            allowed=allowed,
            matrix_extra=matrix_extra or {},
            room_extra=room_extra,
            extra=extra,
        )
    )
    # The bot's password comes from the environment, as in production.
    env = {**(claude_env or {}), "CHATBRIDGE_MATRIX__PASSWORD": bot.password}
    async with run_service(config, env, secrets=(bot.password,)) as running:
        yield running
