"""Text that every store and chat server can take.

Text reaches the bridge from claude (decoded JSON) and from chat servers.
JSON allows a lone UTF-16 surrogate (``"\\ud83d"``, which Node's
``JSON.stringify`` emits when a string is cut inside an emoji), and Python
decodes it into a ``str`` that no UTF-8 encoder accepts; PostgreSQL also
refuses NUL in text. One such character must not fail a run or a commit, so
text is made safe where it enters, replacing what cannot be encoded.
"""

from __future__ import annotations

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
