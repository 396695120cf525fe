"""``[[webhooks]]``: signed HTTP deliveries that start a run in a room.

A POST to the webhook's path (read, bounded, by bridge/host/http.py) is refused unread when
too large (413), checked (constant-time signature, ``github`` or ``generic``) before anything
looks at its body (401), must be JSON (400), and enters the room's inbox as a message from
``webhook:<path>`` keyed by its delivery id, so a replay starts nothing (200 "duplicate",
202 when new). The secret is never logged (docs/automation.md, "Webhooks").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.automation.config import WebhookConfig
from bridge.automation.webhook_template import render
from bridge.core.duration import format_duration
from bridge.core.model import InboundMessage, RoomKey
from bridge.core.synthetic import webhook_message
from bridge.core.transport import Accepted
from bridge.metrics import Metrics
from bridge.store.base import StoreError

log = logging.getLogger(__name__)

MAX_SKEW_S = 300.0
"""How far a generic delivery's timestamp may be from now (a captured request replays no later)."""
_SECONDS = re.compile(r"[0-9]{1,12}")
_DELIVERY = re.compile(r"[A-Za-z0-9_.:-]{1,100}")

Response = tuple[int, bytes, str]
"""(status, body, content type), as bridge/host/http.py sends it."""


@dataclass(frozen=True, slots=True)
class LastDelivery:
    at: float
    outcome: str


@dataclass(slots=True)
class Webhooks:
    """The configured webhooks, by path."""

    configs: Sequence[WebhookConfig]
    accept: Callable[[InboundMessage], Awaitable[Accepted]]
    """The intake's entry for synthetic messages."""
    metrics: Metrics
    wall_clock: Callable[[], float] = time.time
    _by_path: dict[str, WebhookConfig] = field(init=False, default_factory=dict)
    _last: dict[str, LastDelivery] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._by_path = {c.path: c for c in self.configs}

    def paths(self) -> list[str]:
        return list(self._by_path)

    def body_limit(self, path: str) -> int | None:
        """The largest body a webhook at ``path`` takes; None: no webhook there."""
        config = self._by_path.get(path)
        return None if config is None else config.max_body_bytes

    def too_large(self, path: str) -> Response:
        """Counted and answered without reading the body."""
        return self._done(path, "too_large", 413, "body too large")

    async def deliver(self, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        """Check and accept one delivery; ``headers`` have lower-case names."""
        config = self._by_path[path]
        if not self._signed(config, headers, body):
            return self._done(path, "bad_signature", 401, "bad or missing signature")
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self._done(path, "bad_request", 400, "body is not JSON")
        if config.signature == "github" and headers.get("x-github-event") == "ping":
            return self._done(path, "ping", 200, "pong: nothing started")
        header = "x-github-delivery" if config.signature == "github" else "x-chatbridge-delivery"
        delivery = headers.get(header) or hashlib.sha256(body).hexdigest()
        if not _DELIVERY.fullmatch(delivery):
            return self._done(path, "bad_request", 400, f"{header} is not a delivery id")
        text = render(config.prompt, payload)
        if not text.strip():
            return self._done(path, "bad_request", 400, "the prompt is empty for this payload")
        message = webhook_message(config.room_key, path, delivery, text)
        try:
            accepted = await self.accept(message)
        except StoreError:
            log.warning("webhook %s: recording delivery %s failed", path, delivery, exc_info=True)
            return self._done(path, "failed", 503, "could not record the delivery; send it again")
        if accepted is Accepted.DUPLICATE:
            return self._done(path, "duplicate", 200, "duplicate delivery: nothing started")
        log.info("webhook %s: delivery %s accepted", path, delivery)
        return self._done(path, "accepted", 202, "accepted")

    def status_lines(self, room: RoomKey) -> list[str]:
        """The room's webhooks and their last delivery, for ``!status``."""
        lines = []
        for config in self.configs:
            if config.room_key != room:
                continue
            last = self._last.get(config.path)
            seen = "none since start" if last is None else _last_text(last, self.wall_clock())
            lines.append(f"Webhook `{config.path}`: last delivery {seen}.")
        return lines

    def _signed(self, config: WebhookConfig, headers: Mapping[str, str], body: bytes) -> bool:
        key = config.key
        if config.signature == "github":
            given, signed = headers.get("x-hub-signature-256", ""), body
        else:
            given, signed = headers.get("x-chatbridge-signature", ""), body
            stamp = headers.get("x-chatbridge-timestamp")
            if stamp is not None:
                # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
                if not _SECONDS.fullmatch(stamp):
                    return False
                if abs(self.wall_clock() - int(stamp)) > MAX_SKEW_S:
                    return False
                signed = stamp.encode() + b"." + body
        expected = "sha256=" + hmac.new(key, signed, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), given.encode("latin-1", "replace"))

    def _done(self, path: str, outcome: str, status: int, text: str) -> Response:
        self.metrics.webhook_deliveries.labels(outcome).inc()
        self._last[path] = LastDelivery(self.wall_clock(), outcome)
        if status >= 400:
            log.warning("webhook %s: refused (%d, %s)", path, status, text)
        return status, f"{text}\n".encode(), "text/plain"


def _last_text(last: LastDelivery, now: float) -> str:
    return f"{format_duration(max(0.0, now - last.at))} ago ({last.outcome})"
