"""Reading stored values that may be odd, for every reader of the store.

A reader (listing, stats, metrics, export, the Django mirror) must never fail on what it
finds in Redis: a due score of ``inf`` or ``1e30``, a value that is not UTF-8 (the store
client reads such bytes as lone surrogates), an id that is not a stored id. The helpers
here turn such values into ``None`` instead of raising, and :class:`Unreadable` counts
what a reader skipped and logs it once per run.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone

from .keys import pack_id, unpack_id

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: The epoch milliseconds a ``datetime`` can hold (years 1 to 9999), as Redis score bounds.
MIN_MS = -62_135_596_800_000
MAX_MS = 253_402_300_799_999
_EXAMPLES = 3  # unreadable entries named in the log line
_COUNT = re.compile(r"0|-?[1-9][0-9]{0,18}")  # what HINCRBY adds to (int64: checked below)
#: The characters no task name, queue name, business key or job id may hold, and those
#: :func:`shown` escapes: every control (C0, DEL, C1), the line and paragraph separators and
#: the bidi formatting controls. Each would reach an operator's terminal raw (move the
#: cursor, colour it, set its title, forge or reorder a line). A fixed set, the same on
#: every Python (``str.isprintable`` follows the Unicode tables of the Python running).
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def datetime_of_ms(ms: float | int | str | None) -> datetime | None:
    """Epoch milliseconds (a number or its text) as an aware UTC datetime; None when absent
    or not a finite number within years 1 to 9999."""
    try:
        value = float(ms)  # type: ignore[arg-type]
        return _EPOCH + timedelta(milliseconds=value) if MIN_MS <= value <= MAX_MS else None
    except (TypeError, ValueError, OverflowError):
        return None


def utc_of_ms(ms: float) -> datetime:
    """Epoch milliseconds known to be a time (a clock's, a due time just worked out) as an
    aware UTC datetime; :func:`datetime_of_ms`, raising ``ValueError`` where it gives None."""
    at = datetime_of_ms(ms)
    if at is None:
        raise ValueError(f"{ms!r} ms is no time from year 1 to 9999")
    return at


def iso_time(text: str) -> datetime:
    """ISO-8601 text as ``datetime.fromisoformat`` reads it (``ValueError`` if it cannot),
    with a trailing ``Z`` read as UTC on every Python: 3.10's refuses it, and JSON APIs and
    JavaScript's ``toISOString`` write it."""
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


def is_text(value: str) -> bool:
    """True when ``value`` was valid UTF-8 in Redis (it holds no lone surrogates)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def count_of(text: str) -> int | None:
    """A count as Redis keeps it (``HINCRBY``'s 64-bit integer); None when Redis could not
    add to it (the scripts' ``add_count`` then sets it afresh)."""
    if not _COUNT.fullmatch(text):
        return None
    n = int(text)
    return n if -2**63 <= n < 2**63 else None


def job_id_of(stored: str) -> str | None:
    """The job id stored as ``stored`` (:func:`keys.unpack_id`); None when ``stored`` is
    not what :func:`keys.pack_id` makes of any id."""
    if not is_text(stored):
        return None
    try:
        job_id = unpack_id(stored)
    except ValueError:  # "~" and then not base64
        return None
    return job_id if pack_id(job_id) == stored else None


def counted(n: int, noun: str) -> str:
    """``1 job``, ``2 jobs``: a count for a message."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


_UNITS = ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s"))


def elapsed(ms: float) -> str:
    """A duration in the unit that reads best: ``3.2 ms``, ``1.5 s``, ``2.0 min``, ``329.1 d``."""
    for size, unit in _UNITS:
        if abs(ms) >= size:
            return f"{ms / size:.1f} {unit}"
    return f"{ms:.1f} ms"


def printable(value: str) -> str:
    """``value`` with the bytes that were not UTF-8 shown as ``\\xNN``."""
    return value.encode(errors="surrogateescape").decode(errors="backslashreplace")


def forbidden(value: str, what: str) -> str | None:
    """Why ``value``, a ``what`` (task name, queue, key, ...), may not be written: the first
    character of :data:`FORBIDDEN` it holds, named (``U+202E``); None when it holds none."""
    found = FORBIDDEN.search(value)
    if found is None:
        return None
    return (f"{what} {value!r} holds U+{ord(found[0]):04X}: task and queue names, keys and "
            "ids may not hold control characters, line separators or bidi controls, which "
            "would reach terminals raw; remove it (built from user input: clean or map that "
            "input first)")


def shown(value: str) -> str:
    """``value`` as the CLI prints a stored string: bytes that were not UTF-8 as ``\\xNN``
    (:func:`printable`), the characters of :data:`FORBIDDEN` as ``\\xNN`` / ``\\uNNNN``."""
    return FORBIDDEN.sub(_escaped, printable(value))


def _escaped(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class Unreadable:
    """The entries one reader run skipped or showed as unreadable: counted, logged once."""

    def __init__(self, reader: str, logger: logging.Logger) -> None:
        self.reader, self.logger = reader, logger
        self.count = 0
        self._examples: list[str] = []

    def add(self, what: str, reason: str) -> None:
        """Count one unreadable entry (``what``: where it is, e.g. ``job 'x' on shard 2``)."""
        self.count += 1
        if len(self._examples) < _EXAMPLES:
            self._examples.append(f"{shown(what)}: {shown(reason)[:200]}")

    def log(self) -> None:
        """One warning for the run, if anything was unreadable."""
        if self.count:
            more = ", ..." if self.count > len(self._examples) else ""
            self.logger.warning("%s: %d unreadable entries skipped or marked (%s%s)",
                                self.reader, self.count, "; ".join(self._examples), more)
