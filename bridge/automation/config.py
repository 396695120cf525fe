"""``[[schedules]]`` and ``[[webhooks]]``: prompts that start without anyone writing in chat.

Their own module so bridge/config.py only lists them; the room they name is
checked against the configured rooms by :class:`bridge.config.Settings`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from bridge.automation.cron import CronError, CronExpr, zone_named
from bridge.automation.webhook_template import TemplateError, check_template
from bridge.core.model import RoomId, RoomKey, TransportName


def _accepted(check: Callable[[str], object], value: str, error: type[Exception]) -> str:
    """``value`` if ``check`` takes it; else its ``error``, as the ValueError pydantic reports."""
    try:
        check(value)
    except error as exc:
        raise ValueError(str(exc)) from None
    return value


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    room: str = Field(min_length=1)
    """The room, as ``transport:id`` (``console:console``, ``matrix:!abc:example.org``,
    ``slack:C0123``): the same transport and id as its ``[[rooms]]`` entry."""

    @field_validator("room")
    @classmethod
    def _room_form(cls, value: str) -> str:
        transport, sep, room_id = value.partition(":")
        if not sep or not room_id or transport not in ("console", "matrix", "slack"):
            raise ValueError(
                f"{value!r} is not a room: write transport:id, e.g. slack:C0123 or console:console"
            )
        return value

    @property
    def room_key(self) -> RoomKey:
        transport, _, room_id = self.room.partition(":")
        return RoomKey(TransportName(transport), RoomId(room_id))


class ScheduleConfig(_Entry):
    """One ``[[schedules]]`` entry."""

    cron: str
    timezone: str = "UTC"
    prompt: str = Field(min_length=1)
    when_busy: Literal["queue", "skip"] = "queue"
    name: str = ""
    """Names the schedule in ``!status``, logs and message ids; default: derived from
    room, cron, time zone and prompt (so a changed schedule is a new one)."""

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        return _accepted(CronExpr.parse, value, CronError)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return _accepted(zone_named, value, CronError)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", value):
            raise ValueError("use letters, digits, '.', '_' and '-' (at most 100)")
        return value

    @property
    def key(self) -> str:
        """The name, or one derived from what the schedule is."""
        if self.name:
            return self.name
        digest = hashlib.sha256(
            "\0".join((self.room, self.cron, self.timezone, self.prompt)).encode()
        ).hexdigest()
        return f"schedule-{digest[:12]}"


class WebhookConfig(_Entry):
    """One ``[[webhooks]]`` entry."""

    path: str
    secret: SecretStr | None = None
    secret_env: str = ""
    """The name of an environment variable holding the secret (instead of ``secret``)."""
    signature: Literal["github", "generic"] = "github"
    prompt: str = Field(min_length=1)
    max_body_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"(/[A-Za-z0-9_.~-]+)+", value):
            raise ValueError("must be like /hooks/github (letters, digits, '_.~-' between '/')")
        if value in ("/healthz", "/readyz", "/metrics"):
            raise ValueError(f"{value} is one of the listener's own endpoints")
        return value

    @field_validator("prompt")
    @classmethod
    def _template(cls, value: str) -> str:
        return _accepted(check_template, value, TemplateError)

    @model_validator(mode="before")
    @classmethod
    def _secret_from_env(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("secret_env"):
            if data.get("secret"):
                raise ValueError("give secret or secret_env, not both")
            name = str(data["secret_env"])
            if not os.environ.get(name):
                raise ValueError(f"secret_env: the environment variable {name} is not set")
            data = {**data, "secret": os.environ[name]}
        return data

    @model_validator(mode="after")
    def _secret_is_long(self) -> Self:
        if self.secret is None:
            raise ValueError("secret (or secret_env) is required")
        # A short secret is guessable offline from one signed delivery; whitespace does not count
        # (a blank or space-padded secret is a configuration slip, not entropy).
        if len(self.secret.get_secret_value().strip()) < 16:
            raise ValueError("secret must be at least 16 characters")
        return self

    @property
    def key(self) -> bytes:
        """The HMAC key."""
        # Never None once loaded (checked above).
        return b"" if self.secret is None else self.secret.get_secret_value().encode()
