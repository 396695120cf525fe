"""The ``[matrix]`` section of the configuration.

Field names are part of the interface (the configuration file and the
``CHATBRIDGE_MATRIX__*`` environment overrides): keep them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class MatrixSettings(BaseModel):
    """How the bridge logs in to its homeserver and which events it serves."""

    model_config = ConfigDict(extra="forbid")

    homeserver: str = Field(description="Base URL of the homeserver, e.g. https://matrix.org")
    user_id: str = Field(pattern=r"^@[^:]+:.+$", description="The bot's full Matrix id")
    access_token: SecretStr = SecretStr("")
    """Either this, or ``password``."""
    password: SecretStr = SecretStr("")
    """Log in once with this; the device and its token are then kept under ``store_path``."""
    device_name: str = "chatbridge"
    store_path: Path = Path("matrix-store")
    """Device keys (end-to-end encryption), login and sync position."""
    auto_join: Literal["configured", "none"] = "configured"
    """``configured``: accept invites to configured rooms only; ``none``: accept none."""
    ignore_other_bots: bool = True
    """Treat ``m.notice`` messages and ``ignore_users`` as bots."""
    ignore_users: list[str] = Field(default_factory=list)
    sync_timeout_ms: int = Field(default=30_000, ge=0)
    """Long-poll duration of one sync request."""
    max_event_chars: int = Field(default=16_000, ge=1_000)
    """Replies longer than this go out as several events (Matrix caps events at 64 KiB)."""
    answer_file_chars: int = Field(default=40_000, ge=0)
    """An answer longer than this is posted as a Markdown file (``m.file``) with a short
    message, not as many events; 0: never."""

    undecryptable_notice_s: float = Field(default=60.0, ge=0)
    """How long an encrypted message may wait for its key before the room is told
    it could not be read (it is still delivered if the key comes later)."""

    @model_validator(mode="after")
    def _one_credential(self) -> MatrixSettings:
        if not self.access_token.get_secret_value() and not self.password.get_secret_value():
            raise ValueError("set matrix.access_token or matrix.password")
        return self
