"""How large an event is as the homeserver stores it, so a reply is split to fit.

Synapse refuses an event whose canonical JSON, as a whole (content plus the
envelope it adds: ids, hashes, signatures, auth and previous events), is over
65 536 bytes, answering ``M_TOO_LARGE``. In an encrypted room the content is
the Megolm ciphertext of the whole plaintext event, base64-encoded: about
4/3 of the plaintext. Replies are measured as if encrypted in every room, so
a reply splits the same way whatever the room is (a retry must split as the
first attempt did) and never turns out too large after encryption.
"""

from __future__ import annotations

import json
import math
from typing import Any

EVENT_LIMIT = 65_536
"""Synapse's limit for one event, in bytes of canonical JSON."""
ENVELOPE = 4_096
"""What the server and the encryption envelope add around the ciphertext."""
MEGOLM_OVERHEAD = 128
"""Bytes Megolm adds to the plaintext before base64: padding, header, MAC, signature."""


def wire_size(event_type: str, content: dict[str, Any]) -> int:
    """An upper bound of the event's size on the server, encrypted or not."""
    # ensure_ascii escapes non-ASCII as \\uXXXX: never shorter than the UTF-8
    # the server measures, and what nio encrypts.
    plain = len(json.dumps({"type": event_type, "content": content, "room_id": "!" * 255}))
    return 4 * math.ceil((plain + MEGOLM_OVERHEAD) / 3) + ENVELOPE


def fits(event_type: str, content: dict[str, Any]) -> bool:
    return wire_size(event_type, content) <= EVENT_LIMIT
