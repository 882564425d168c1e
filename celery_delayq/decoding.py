"""Reading a stored envelope back (its text is described in :mod:`envelope`).

``decode`` and its parts (``split``, ``decode_fields``, ``decode_arguments``) raise only
:class:`PayloadError`, whatever the stored text holds: a carrier dead-letters such a job,
a listing shows it as unreadable.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kombu.utils.json import object_hook

from .conf import MAX_NESTING
from .errors import PayloadError
from .reading import is_text

# First-line fields that name something (task, task id, key, queue, exchange, routing key).
_NAMES = ("t", "i", "y", "q", "x", "r")
#: Properties a caller may not set: the payload is always JSON.
RESERVED_PROPERTIES = frozenset({"content_type", "content_encoding", "serializer"})


class _KombuObjectError(ValueError):
    """A ``{"__type__": ..., "__value__": ...}`` object kombu's JSON cannot decode."""


def _object_hook(obj: dict) -> Any:
    """kombu's ``object_hook`` (such objects back to datetime, UUID, Decimal ...), whose
    decoders raise TypeError, AttributeError, ... on a value of the wrong type: any of them
    a :class:`_KombuObjectError`, so such an object is unreadable data."""
    try:
        return object_hook(obj)
    except Exception as exc:
        raise _KombuObjectError(
            f"a {obj.get('__type__')!r} object kombu cannot decode ({exc!r})") from exc


# kombu's loads() builds a decoder per call; this one decodes as it does, built once.
_json_decode = json.JSONDecoder(object_hook=_object_hook).decode
# The tokens that nest (and strings, skipped whole).
_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting(text: str) -> int:
    """How deep lists and objects nest in a JSON text (or several, one per line)."""
    depth = deepest = 0
    for token in _NESTING.findall(text):
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def decode_json(text: str) -> Any:
    """A stored JSON text as Python, nested at most ``MAX_NESTING`` deep (what every
    carrier and worker can decode): deeper is a :class:`RecursionError`, as the json module
    raises one at a depth that depends on the Python version (3.13 decodes 985 levels)."""
    if text.count("[") + text.count("{") > MAX_NESTING and nesting(text) > MAX_NESTING:
        raise RecursionError(f"nested more than {MAX_NESTING} levels deep")
    return _json_decode(text)


def split(raw: str | bytes | None) -> tuple[str, str, str]:
    """A stored envelope's three lines: first line, args and kwargs ("" when absent)."""
    if raw is None:
        raise PayloadError("envelope missing")
    try:  # the store reads bytes that are not UTF-8 as lone surrogates
        if isinstance(raw, bytes):
            raw = raw.decode()
        elif not raw.isascii():
            raw.encode()
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise PayloadError(f"envelope is not valid UTF-8 ({exc.reason})") from exc
    fields, args, kwargs = [*raw.split("\n", 2), "", ""][:3]
    return fields, args, kwargs


def decode_fields(line: str) -> dict[str, Any]:
    """An envelope's first line; :class:`PayloadError` says why it is unusable."""
    try:
        env = decode_json(line)
    except (ValueError, RecursionError) as exc:
        raise _unreadable(exc) from exc
    if not isinstance(env, dict) or not isinstance(env.get("t"), str) or not env["t"]:
        raise PayloadError("envelope has no task name")
    names = [env[name] for name in _NAMES if name in env]
    if any(not isinstance(name, str) for name in names):
        raise PayloadError("envelope fields have the wrong type")
    if any(not name.isascii() and not is_text(name) for name in names):
        raise PayloadError("envelope names hold a lone surrogate: they are not text")
    if {"a", "k"} & env.keys() or any(not isinstance(env.get(name, {}), dict)
                                      for name in ("o", "h", "p")):
        raise PayloadError("envelope fields have the wrong type")
    if RESERVED_PROPERTIES & set(env.get("p", {})):
        raise PayloadError("envelope sets a content type; only JSON payloads are published")
    return env


def first_line(envelope: str | None) -> dict[str, Any]:
    """An envelope's first line as it is, for readers that only look at a field (``delayq
    check``, replaying the dead letters of a task); {} when it cannot be read."""
    try:
        fields = decode_json((envelope or "").split("\n", 1)[0])
    except (ValueError, RecursionError):
        return {}
    return fields if isinstance(fields, dict) else {}


def decode_arguments(args: str, kwargs: str) -> tuple[list, dict]:
    """An envelope's args and kwargs lines; :class:`PayloadError` says why unusable."""
    try:
        decoded = decode_json(args) if args else [], decode_json(kwargs) if kwargs else {}
    except (ValueError, RecursionError) as exc:
        raise _unreadable(exc) from exc
    if not isinstance(decoded[0], list) or not isinstance(decoded[1], dict):
        raise PayloadError("envelope args/kwargs have the wrong type")
    return decoded


def _unreadable(exc: Exception) -> PayloadError:
    if isinstance(exc, RecursionError):
        return PayloadError("envelope is nested too deeply to decode")
    if isinstance(exc, _KombuObjectError):
        return PayloadError(f"envelope holds {exc}")
    return PayloadError(f"envelope is not valid JSON: {exc}")


def decode(raw: str | bytes | None) -> dict[str, Any]:
    """Parse a stored envelope into its fields plus ``a`` (args) and ``k`` (kwargs);
    :class:`PayloadError` says why it is unusable."""
    fields, args, kwargs = split(raw)
    env = decode_fields(fields)
    env["a"], env["k"] = decode_arguments(args, kwargs)
    return env
