"""A webhook's prompt template: text with ``{{ payload.a.b }}`` placeholders, nothing more.

Deliberately not a template engine: no expressions, filters or calls, so a
configuration (or a payload) can never make it execute anything. A
placeholder is ``{{ payload }}`` or ``{{ payload.`` followed by keys and
list indexes separated by dots ``}}`` (``{{ payload.commits.0.message }}``).
What it names is inserted as text: a string as is, ``true``/``false``, a
number as JSON writes it, an object or list as compact JSON; a missing field
or ``null`` inserts nothing. Each value is cut at :data:`VALUE_LIMIT`
characters. Any other ``{{`` is a configuration error.
"""

from __future__ import annotations

import json
import re

_PLACEHOLDER = re.compile(r"\{\{\s*payload((?:\.[A-Za-z0-9_-]+)*)\s*\}\}")
VALUE_LIMIT = 4000
"""Characters of one inserted value (a commit list can be long)."""


class TemplateError(ValueError):
    """A template with a ``{{`` that is not a placeholder."""


def check_template(template: str) -> None:
    """Raise :class:`TemplateError` naming the first ``{{`` that is not a placeholder."""
    rest = _PLACEHOLDER.sub("", template)
    if "{{" in rest or "}}" in rest:
        start = rest.find("{{") if "{{" in rest else rest.find("}}")
        raise TemplateError(
            f"{rest[start : start + 40]!r}: only {{{{ payload.field.subfield }}}} placeholders"
            " are allowed"
        )


def render(template: str, payload: object) -> str:
    """``template`` with each placeholder replaced by what it names in ``payload``."""
    return _PLACEHOLDER.sub(lambda match: _text(_lookup(payload, match.group(1))), template)


def _lookup(payload: object, dotted: str) -> object:
    value = payload
    for key in dotted.split(".")[1:]:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return value


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text[:VALUE_LIMIT]
