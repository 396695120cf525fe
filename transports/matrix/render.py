"""Markdown to the sanitised HTML subset Matrix clients display.

Claude answers in Markdown. ``formatted_body`` carries it as HTML restricted
to the tags the Matrix spec recommends clients accept; raw HTML in the
Markdown is escaped, not passed through, and the result is sanitised once
more so nothing outside the allow-list survives.
"""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

_ALLOWED_TAGS = frozenset(
    {
        "a", "b", "blockquote", "br", "caption", "code", "del", "details", "div", "em",
        "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "li", "ol", "p", "pre", "s",
        "span", "strike", "strong", "sub", "summary", "sup", "table", "tbody", "td",
        "th", "thead", "tr", "u", "ul",
    }
)  # fmt: skip
_ALLOWED_ATTRIBUTES = {
    "a": frozenset({"href"}),
    "code": frozenset({"class"}),
    "ol": frozenset({"start"}),
    "th": frozenset({"align"}),
    "td": frozenset({"align"}),
}
_URL_SCHEMES = frozenset({"http", "https", "ftp", "mailto", "magnet"})


class MarkdownRenderer:
    """Renders Markdown to sanitised HTML; one parser reused for every message."""

    def __init__(self) -> None:
        # html=False: HTML written in the Markdown is shown as text, never rendered.
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(
            ["table", "strikethrough"]
        )

    def html(self, markdown: str) -> str:
        """The sanitised HTML for ``markdown``, without a trailing newline."""
        raw = self._md.render(markdown)
        clean: str = nh3.clean(
            raw,
            tags=set(_ALLOWED_TAGS),
            attributes={tag: set(attrs) for tag, attrs in _ALLOWED_ATTRIBUTES.items()},
            url_schemes=set(_URL_SCHEMES),
            link_rel=None,
        )
        return clean.strip()
