"""Text that every store and chat server can take.

Text reaches the bridge from claude (decoded JSON) and from chat servers.
JSON allows a lone UTF-16 surrogate (``"\\ud83d"``, which Node's
``JSON.stringify`` emits when a string is cut inside an emoji), and Python
decodes it into a ``str`` that no UTF-8 encoder accepts; PostgreSQL also
refuses NUL in text. One such character must not fail a run or a commit, so
text is made safe where it enters, replacing what cannot be encoded.
"""

from __future__ import annotations

import unicodedata

REPLACEMENT = "\ufffd"


def safe_text(text: str) -> str:
    """``text`` with lone surrogates and NUL replaced by U+FFFD; unchanged if already safe.

    A surrogate pair that arrived as two code points is joined into the one
    character it encodes.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16: pairs join into one character, a lone half becomes U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if "\0" in text:
        text = text.replace("\0", REPLACEMENT)
    return text


_IGNORABLE = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xE0000, 0xE0FFF),
)
"""Unicode's default-ignorable code points that are not ``Cf``: variation selectors,
Hangul fillers, the grapheme joiner. They render as nothing (or a blank), so text
spelled in them ("emoji smuggling") would pass unseen."""


def _ignorable(char: str) -> bool:
    point = ord(char)
    return any(low <= point <= high for low, high in _IGNORABLE)


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with what would not show (or would show misleadingly) escaped.

    Control characters, Unicode format characters (``Cf``: bidi overrides,
    zero-width joiners) and the other default-ignorable ones (variation
    selectors, Hangul fillers) become ``\\u{…}``; a newline stays only with
    ``keep_newlines`` (in a block), a tab stays.
    """
    out = []
    for char in safe_text(text):
        if (char == "\n" and keep_newlines) or char == "\t":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") or _ignorable(char):
            out.append(f"\\u{{{ord(char):04x}}}")
        else:
            out.append(char)
    return "".join(out)
