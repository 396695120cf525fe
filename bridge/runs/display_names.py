"""A display name as the prompt shows it: one line that cannot carry an id.

The name is NFKC-normalised first, so the fullwidth form of ``(@U0ALICE)``
is judged as what it reads as; then every bracket, quote and at-sign, and
every look-alike NFKC does not fold (ornamental brackets, modifier quotes),
goes (by category, and by what its Unicode name says it is), with invisible
and bidi control characters. Repeated until nothing
changes, so what is left NFKC-folds to nothing of the kind either.
See docs/files-and-context.md ("What claude is told").
"""

from __future__ import annotations

import re
import unicodedata

_GONE_CATEGORIES = frozenset({"Ps", "Pe", "Pi", "Pf", "Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})
"""Open/close brackets and initial/final quotes of every script; controls, format
(zero-width, bidi), private-use, unassigned and surrogate code points; line breaks."""
_GONE_CHARS = frozenset(
    '@()[]{}<>"`'  # the ASCII forms (``(``/``)`` are Ps/Pe, listed for the reader)
    "\u00b4\u02b9\u02ba\u02bb\u02bc\u02bd\u02c8\u02ca\u02cb\u02dd"  # modifier quotes
    "\u2032\u2033\u2034\u2035\u2036\u2037\u2057\u05f3\u05f4\u3003"  # primes, gershayim, ditto
    "\u2039\u203a\u2329\u232a\u276e\u276f\u1438\u1433\u02c2\u02c3"  # angle look-alikes
    "\u034f\u115f\u1160\u3164\uffa0"  # invisible: grapheme joiner, Hangul fillers
)
"""Characters outside those categories that read as a bracket, quote or ``@``, or
show as nothing."""
_VARIATION_SELECTORS = (range(0xFE00, 0xFE10), range(0xE0100, 0xE01F0), range(0x180B, 0x1810))
_NAMED_LIKE = re.compile(
    r"PARENTHESIS|BRACKET|COMMERCIAL AT|QUOTATION|DOUBLE APOSTROPHE|LESS-THAN|GREATER-THAN"
)
"""What a character's Unicode name says when it reads as a bracket, quote or ``@``
whatever its category: bracket pieces (``⎛``), math brackets, combining parentheses."""


def clean_display_name(name: str, limit: int) -> str:
    """``name`` on one line, at most ``limit`` characters, without anything id-shaped."""
    previous = None
    text = name
    while text != previous:
        previous = text
        text = unicodedata.normalize("NFKC", text)
        text = "".join(" " if _gone(ch) else ch for ch in text)
        text = " ".join(text.split())[:limit].strip()
    return text


def _gone(ch: str) -> bool:
    if ch in _GONE_CHARS or unicodedata.category(ch) in _GONE_CATEGORIES:
        return True
    code = ord(ch)
    if any(code in selectors for selectors in _VARIATION_SELECTORS):
        return True
    return not ch.isascii() and _NAMED_LIKE.search(unicodedata.name(ch, "")) is not None
