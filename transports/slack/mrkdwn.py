"""Markdown (as Claude writes it) to Slack's mrkdwn.

Line-oriented and forgiving: what it does not recognise passes through as text. Safety: the
only ``<`` it emits opens an ``http(s)://`` or ``mailto:`` link with no ``<``, ``>``, ``|`` or
whitespace in its target; every other ``<``, ``>`` and ``&`` is escaped, so no text can
mention or broadcast (docs/deployment.md, "Inside the Slack transport").
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^(\s*>+\s?)(.*)$")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")

# One pass over a line: inline code first so nothing inside it is touched.
_INLINE = re.compile(
    r"(?P<code>(?P<ticks>`+)(?P<code_body>.+?)(?P=ticks))"
    r"|\[(?P<label>[^\]]+)\]\((?P<url>[^)\s]+)(?:\s+\"[^\"]*\")?\)"
    r"|<(?P<auto>https?://[^>\s]+)>"
    r"|\*\*(?P<bold>.+?)\*\*"
    r"|__(?P<bold2>.+?)__"
    r"|~~(?P<strike>.+?)~~"
    r"|(?<![\w*])\*(?P<em>[^\s*](?:.*?[^\s*])?)\*(?![\w*])"
    r"|(?<![\w_])_(?P<em2>[^\s_](?:.*?[^\s_])?)_(?![\w_])"
)


def escape(text: str) -> str:
    """Escape the three characters Slack treats as control sequences."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Link targets Slack may open; anything else (``!channel``, ``@U1``, ``#C1``,
# ``javascript:``) is shown as text, never put inside ``<...>``.
_SAFE_TARGET = re.compile(r"^(?:https?://|mailto:)[^\s<>|]+$", re.IGNORECASE)


def _link_url(url: str) -> str | None:
    """``url`` as a link target, or None when it must not become a link."""
    # Percent-encode what would end or split <url|label> (a URL may carry them).
    encoded = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
    if not _SAFE_TARGET.match(encoded):
        return None
    return encoded.replace("&", "&amp;")


def inline(text: str) -> str:
    """Convert the inline markup of one line of prose."""
    out: list[str] = []
    pos = 0
    for match in _INLINE.finditer(text):
        out.append(escape(text[pos : match.start()]))
        pos = match.end()
        groups = match.groupdict()
        if groups["code"] is not None:
            out.append(f"`{escape(groups['code_body'].strip())}`")
        elif groups["label"] is not None:
            target = _link_url(groups["url"])
            if target is None:
                out.append(escape(match.group(0)))
            else:
                label = escape(groups["label"]).replace("|", "¦")
                out.append(f"<{target}|{label}>")
        elif groups["auto"] is not None:
            target = _link_url(groups["auto"])
            out.append(escape(match.group(0)) if target is None else f"<{target}>")
        elif groups["bold"] is not None or groups["bold2"] is not None:
            out.append(f"*{inline(groups['bold'] or groups['bold2'])}*")
        elif groups["strike"] is not None:
            out.append(f"~{inline(groups['strike'])}~")
        else:
            out.append(f"_{inline(groups['em'] or groups['em2'])}_")
    out.append(escape(text[pos:]))
    return "".join(out)


def _plain(text: str) -> str:
    """Text with emphasis markers removed, for places that are already bold."""
    return re.sub(r"\*\*|__", "", text)


def _prose_line(line: str) -> str:
    if heading := _HEADING.match(line):
        return f"*{inline(_plain(heading.group(1)))}*"
    if _RULE.match(line):
        return "──────────"
    if bullet := _BULLET.match(line):
        return f"{bullet.group(1)}• {inline(bullet.group(2))}"
    if quote := _QUOTE.match(line):
        # '>' must stay literal at the start of a line to render as a quote.
        return f"{quote.group(1)}{inline(quote.group(2))}"
    return inline(line)


def to_mrkdwn(markdown: str) -> str:
    """Render Markdown as Slack mrkdwn.

    Fenced code keeps its content verbatim (escaped) and loses its info
    string, which Slack would print; tables become code blocks so their
    columns stay aligned in Slack's monospace rendering.
    """
    out: list[str] = []
    fence: str | None = None
    table = False
    for line in markdown.split("\n"):
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                out.append("```")
                fence = None
            else:
                out.append(escape(line))
            continue
        if opening := _FENCE.match(line):
            if table:
                out.append("```")
                table = False
            fence = opening.group(2)
            out.append("```")
            continue
        is_row = _TABLE_ROW.match(line) is not None
        if is_row != table:
            out.append("```")
            table = is_row
        out.append(escape(line) if is_row else _prose_line(line))
    if fence is not None or table:
        out.append("```")  # an unterminated block still closes in Slack
    return "\n".join(out)
