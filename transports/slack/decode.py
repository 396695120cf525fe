"""Slack's message markup to the plain text a person typed.

Slack sends ``&``, ``<`` and ``>`` as ``&amp;``, ``&lt;``, ``&gt;``, and
writes links, mentions and broadcasts as ``<...>`` tokens: ``<https://x>``,
``<https://x|label>``, ``<mailto:a@x|a@x>``, ``<@U123>``, ``<#C123|name>``,
``<!here>``, ``<!subteam^S123|@team>``, ``<!date^...|fallback>``. Claude
should read what the person saw, so every token becomes its visible text
(a user as ``@display name``) and the entities become characters again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Inside a token Slack escapes '<' and '>', so a token never contains them.
_TOKEN = re.compile(r"<([^<>]*)>")
_USER = re.compile(r"<@([A-Z0-9]+)(?:\|[^<>]*)?>")


def unescape(text: str) -> str:
    """Slack's three entities back to characters.

    ``&amp;`` goes last, so a typed ``&lt;`` (sent as ``&amp;lt;``) stays ``&lt;``.
    """
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def mentioned_users(text: str) -> list[str]:
    """The user ids ``text`` mentions, in order, without repeats."""
    return list(dict.fromkeys(_USER.findall(text)))


def strip_leading_mention(text: str, user_id: str) -> tuple[str, bool]:
    """``text`` without a mention of ``user_id`` that opens it, and whether there was one.

    ``@bot !stop`` must reach the command parser as ``!stop``; a separator
    typed after the mention (``@bot: ...``, ``@bot, ...``) goes with it.
    """
    match = re.match(rf"\s*<@{re.escape(user_id)}(?:\|[^<>]*)?>[\s:,]*", text)
    if match is None:
        return text, False
    return text[match.end() :], True


def _link(target: str, label: str) -> str:
    target, label = unescape(target), unescape(label)
    if not label:
        return target
    bare = re.sub(r"^(?:https?://|mailto:)", "", target).rstrip("/")
    if label in (target, bare):
        return label  # what the person typed, auto-linked by Slack
    return f"[{label}]({target})"


def _token(body: str, names: Mapping[str, str]) -> str:
    target, _, label = body.partition("|")
    if target.startswith("@"):
        user = target[1:]
        return "@" + (names.get(user) or unescape(label) or user)
    if target.startswith("#"):
        return "#" + (unescape(label) or target[1:])
    if target.startswith("!"):
        special = target[1:]
        if label:
            # Subteams carry their handle, dates their fallback text.
            return unescape(label)
        if special.startswith("subteam^"):
            return "@" + special.split("^", 1)[1]
        return "@" + special.split("^", 1)[0]  # here, channel, everyone
    return _link(target, label)


def decode(text: str, names: Mapping[str, str]) -> str:
    """``text`` as its reader saw it; ``names`` maps user ids to display names."""
    out: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        out.append(unescape(text[pos : match.start()]))
        out.append(_token(match.group(1), names))
        pos = match.end()
    out.append(unescape(text[pos:]))
    return "".join(out)
