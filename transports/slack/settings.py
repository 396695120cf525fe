"""The ``[slack]`` section of the configuration.

Secrets are :class:`pydantic.SecretStr`, so they print as ``**********`` in
logs, ``repr`` and ``check-config``; only the transport reads their values.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from bridge.core.hostport import HostPort

# Slack truncates ``text`` past 40,000 characters and advises staying under
# 4,000 per message; 3,500 leaves room for the mrkdwn conversion growing a chunk.
DEFAULT_MESSAGE_LIMIT = 3500


class SlackSettings(BaseModel):
    """How to reach Slack: Socket Mode (``app_token``) or the Events API (``signing_secret``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["socket", "events"] = "socket"
    bot_token: SecretStr = SecretStr("")
    """``xoxb-...``: every Web API call."""
    app_token: SecretStr = SecretStr("")
    """``xapp-...``: opens Socket Mode connections."""
    signing_secret: SecretStr = SecretStr("")
    """Verifies Events API requests."""
    # NoDecode: from the environment it is the ``host:port`` text, not JSON
    # (compose sets CHATBRIDGE_SLACK__LISTEN).
    listen: Annotated[HostPort, NoDecode] = HostPort("127.0.0.1", 3001)
    """Events mode: ``host:port`` the Events API endpoint (path ``/slack/events``) listens on."""
    api_url: str = "https://slack.com/api/"
    """Web API base URL; tests and proxies override it."""
    message_limit: int = Field(DEFAULT_MESSAGE_LIMIT, ge=200, le=39000)
    """A reply is split into messages of at most this many characters."""
    upload_threshold: int = Field(12000, ge=0)
    """A result longer than this is uploaded as a Markdown file instead; 0 never uploads."""
    reconnect_max_s: float = Field(60.0, gt=0)
    """Upper bound of the reconnect backoff."""
    assistant: bool = False
    """The app is a Slack AI assistant (Agents & AI Apps, scope ``assistant:write``): in a
    thread conversation its status line (``assistant.threads.setStatus``) shows that a
    message was received and that a run works, in place of reactions; cleared at the
    run's end. Refused by Slack (not an assistant thread, no scope): reactions again."""
    catch_up_max_age_s: float = Field(86400.0, ge=0)
    """On every connection, messages missed while not connected are read from the
    channels' history up to this old; older ones are not run (the room is told). 0: none."""

    @field_validator("api_url")
    @classmethod
    def _trailing_slash(cls, value: str) -> str:
        # slack_sdk joins method names onto the base URL verbatim.
        return value if value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _credentials_for_mode(self) -> Self:
        if not self.bot_token.get_secret_value():
            raise ValueError("bot_token is required")
        if self.mode == "socket" and not self.app_token.get_secret_value():
            raise ValueError('app_token is required when mode = "socket"')
        if self.mode == "events" and not self.signing_secret.get_secret_value():
            raise ValueError('signing_secret is required when mode = "events"')
        return self

    @property
    def listen_host(self) -> str:
        return self.listen.host

    @property
    def listen_port(self) -> int:
        return self.listen.port
