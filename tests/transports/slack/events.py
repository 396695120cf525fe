"""Slack event payloads and signed request headers, as Slack would send them."""

from __future__ import annotations

import time
from typing import Any

from slack_sdk.signature import SignatureVerifier

from tests.transports.slack import peer


def signed(body: str, secret: str = peer.SIGNING_SECRET, age_s: int = 0) -> dict[str, str]:
    # Slack signs with the current Unix time; Bolt rejects anything 5 minutes off.
    timestamp = str(int(time.time()) - age_s)
    return {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": str(
            SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
        ),
    }


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "message",
        "channel": "C1",
        "user": "U0ALICE",
        "text": "hi",
        "ts": "1.000001",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}
