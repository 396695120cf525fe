"""``[web]``: who may open the web console and how they prove it (docs/web.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class WebSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """Serve the console under ``/web/`` on the private HTTP listener."""
    identities: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Web identity (a login token's name, or what the proxy's header says) to the
    chat user ids that person is: ``alice@example.com = ["@alice:example.org", "U0ALICE"]``.
    Only identities listed here may open the console; approving a request takes a
    chat id that is an approver of that request's room."""
    identity_header: str | None = None
    """A header a trusted reverse proxy sets to the signed-in person (oauth2-proxy:
    ``X-Forwarded-Email``). Read only from ``trusted_proxies``."""
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    """Peer addresses whose ``identity_header`` is believed."""
    secret_file: Path | None = None
    """The key that signs login tokens and sessions; default ``<state_dir>/web-secret``
    (made on first use, mode 0600). Rotating it signs everyone out."""
    token_ttl_s: float = Field(8 * 3600, gt=0)
    """How long a token from ``chatbridge web-token`` and a browser session last."""
    secure_cookies: bool = False
    """Mark the session cookie ``Secure`` (set it when a TLS proxy serves the console)."""
    poll_s: float = Field(1.0, gt=0, le=60)
    """How often the live pages look for changes in the database."""

    def chat_ids(self, identity: str) -> tuple[str, ...]:
        return self.identities.get(identity, ())

    def knows(self, identity: str) -> bool:
        return identity in self.identities
