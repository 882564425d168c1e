"""What a ``JSONField`` column (a row's ``args`` and ``kwargs``) holds on every database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from celery_delayq.reading import is_text


def column_json(name: str, value: Any) -> tuple[Any, str]:
    """``value`` as a JSON column holds it on every database, and ""; or None and why one
    would refuse it: NaN or Infinity (Python's json reads them; no database's JSON does), a
    NUL or a lone surrogate in a string (PostgreSQL's jsonb refuses them). What kombu's JSON
    decodes to an object (datetime, Decimal, UUID, bytes) becomes its text, as the admin
    shows it."""
    try:
        text = json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return None, f"{name} hold NaN or Infinity"
    value = json.loads(text)
    # json.dumps escapes every NUL and surrogate: most values need no closer look.
    if ("\\u0000" in text or "\\ud" in text) and not all(
            "\x00" not in string and is_text(string) for string in _strings(value)):
        return None, f"{name} hold NUL or a lone surrogate"
    return value, ""


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, object keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
