"""Checks of caller input, run before anything is written to Redis."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from .envelope import canonical_json
from .errors import InvalidDelay, InvalidJobId, InvalidOption
from .reading import FORBIDDEN, MIN_MS, forbidden, is_text, iso_time

IF_EXISTS = ("keep", "replace", "error")


class Due(NamedTuple):
    """When a job is due: an absolute time, or a delay counted on Redis's clock."""

    at_ms: int | None
    delay_ms: int | None

    def script_args(self) -> list[str | int]:
        """The (absolute, relative) pair the Lua scripts take."""
        return ["" if self.at_ms is None else self.at_ms, self.delay_ms or 0]

    def absolute_ms(self, now_ms: float) -> float:
        """The due time in epoch ms, a delay counted from ``now_ms``."""
        return self.at_ms if self.at_ms is not None else now_ms + (self.delay_ms or 0)


def celery_eta(eta: object) -> datetime:
    """An ``apply_async(eta=)`` / ``send_task(eta=)`` as a datetime: Celery takes a datetime
    or ISO-8601 text (a date or a number fails deep inside Celery, or in the worker)."""
    if isinstance(eta, str):
        try:
            return iso_time(eta)
        except ValueError:
            raise InvalidDelay(f"eta {eta!r} is not an ISO-8601 time; pass a datetime or text "
                               "such as 2030-01-01T12:00:00+00:00") from None
    if not isinstance(eta, datetime):
        raise InvalidDelay(f"eta must be a datetime or ISO-8601 text, got "
                           f"{type(eta).__name__}")
    return eta


def due(delay: float | timedelta | None, eta: datetime | None, max_delay: float) -> Due:
    """Validate ``delay``/``eta``; exactly one must be given."""
    if (delay is None) == (eta is None):
        raise InvalidDelay("pass exactly one of delay= (seconds or timedelta) or eta= (datetime)")
    if eta is not None:
        if not isinstance(eta, datetime):
            raise InvalidDelay(f"eta must be a datetime, got {type(eta).__name__}")
        if eta.tzinfo is None or eta.utcoffset() is None:
            raise InvalidDelay(
                f"eta {eta.isoformat()} has no timezone; pass an aware datetime such as "
                "datetime.now(timezone.utc) + timedelta(minutes=30)"
            )
        at = eta.timestamp()
        if at * 1000 < MIN_MS:
            raise InvalidDelay(f"eta {eta.isoformat()} is before year 1 in UTC, which no due "
                               "time can be; pass a time in years 1 to 9999 UTC")
        if at - time.time() > max_delay:
            raise InvalidDelay(
                f"eta {eta.isoformat()} is more than delayq_max_delay={max_delay:g}s away"
            )
        return Due(at_ms=round(at * 1000), delay_ms=None)
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidDelay(f"delay must be seconds (int or float) or a timedelta, got {delay!r}")
    try:
        seconds = float(seconds)
    except OverflowError:  # an int past any float (and maybe past the digits repr prints)
        raise InvalidDelay("delay must be a finite number of seconds >= 0, got an int too "
                           "large for a float") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidDelay(f"delay must be a finite number of seconds >= 0, got {delay!r}")
    if seconds > max_delay:
        raise InvalidDelay(
            f"delay {seconds:g}s is longer than delayq_max_delay={max_delay:g}s; "
            "raise the setting if you mean it"
        )
    return Due(at_ms=None, delay_ms=round(seconds * 1000))


def no_countdown(options: dict[str, Any]) -> None:
    """Refuse apply_async's ``countdown=`` among a delayed call's options: the store would
    drop it, and the call would not be due when its caller meant."""
    countdown = options.get("countdown")
    if countdown is not None:
        raise InvalidDelay(f"countdown={countdown!r} is apply_async's; pass delay={countdown!r} "
                           "(seconds or timedelta) or eta= (datetime) instead")


def identifier(value: object, what: str, max_length: int) -> str:
    """A job id or business key to write: a non-empty string without the characters of
    :data:`reading.FORBIDDEN` (lookups take any string: see :func:`looked_up`)."""
    if not isinstance(value, str):
        raise InvalidJobId(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobId(f"{what} must not be empty")
    if len(value) > max_length:
        raise InvalidJobId(
            f"{what} is {len(value)} characters long; the limit is delayq_max_id_length="
            f"{max_length}"
        )
    if FORBIDDEN.search(value):
        raise InvalidJobId(forbidden(value, what))
    if not value.isascii() and not is_text(value):
        raise InvalidJobId(f"{what} {value!r} holds a lone surrogate: it is not text")
    return value


def looked_up(job_id: object, key: object = None) -> None:
    """Refuse a job id (or business key, None for none) to look for that no job can have:
    not a string. Odd strings are looked for: a stored job may hold one."""
    if not isinstance(job_id, str):
        raise InvalidJobId(f"job_id must be a string, got {type(job_id).__name__}")
    _key_or_none(key)


def task_ids(value: object) -> list[str]:
    """Task ids to revoke as a list: a string (or UUID) is one id, as ``app.control.revoke``
    takes it; refuse anything else that is not an iterable of them."""
    if isinstance(value, (str, UUID)):
        value = [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidJobId(f"a task id must be a string, got {type(value).__name__}")
    ids = [str(task_id) if isinstance(task_id, UUID) else task_id for task_id in value]
    for task_id in ids:
        if not isinstance(task_id, str):
            raise InvalidJobId(f"a task id must be a string, got {type(task_id).__name__}")
    return ids


def looked_up_key(key: object) -> None:
    """Refuse a business key to cancel the jobs of that no job can have: not a string, or
    empty. Other strings are looked for, as by :func:`looked_up`."""
    if key == "" or key is None:
        raise InvalidJobId(f"key must be a non-empty string, got {key!r}: the business key "
                           "the jobs were scheduled with")
    _key_or_none(key)


def _key_or_none(key: object) -> None:
    if key is not None and not isinstance(key, str):
        raise InvalidJobId(f"key must be a string, got {type(key).__name__}")


def listing(task: object, key: object, limit: object) -> None:
    """Refuse a listing's task name or key that is not text, or limit that is no count."""
    _key_or_none(key)
    if task is not None and not isinstance(task, str):
        raise InvalidOption(f"task must be a task name (a string), got {type(task).__name__}")
    if type(limit) is not int or limit < 0:  # (bool is no count)
        raise InvalidOption(f"limit must be a whole number >= 0, got {limit!r}")


def arguments(task: Any, args: Any, kwargs: Any) -> None:
    """Refuse arguments ``task``'s function cannot take, as ``apply_async`` does for a task
    with ``typing`` on: Celery's own ``TypeError`` from the task's signature. Tasks without
    one (class-based) are not checked, as in Celery."""
    header = getattr(task, "__header__", None) if getattr(task, "typing", False) else None
    if header is not None:
        header(*(args or ()), **(kwargs or {}))


#: The fields an item of ``schedule_many`` / ``apply_delayed_many`` may have.
ITEM_FIELDS = frozenset({"args", "kwargs", "delay", "eta", "key", "job_id", "shadow"})


def batch(items: object) -> Iterable[Any]:
    """``items`` of ``schedule_many`` / ``apply_delayed_many`` if they are a collection of
    calls (a mapping is one call, not a batch)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidOption(f"the items of a batch must be a list of mappings, one per call, "
                            f"got a {type(items).__name__}")
    return items


def batch_item(n: int, item: object) -> Mapping[str, Any]:
    """``item``, the ``n``-th of a batch, if it is a mapping of known fields."""
    if not isinstance(item, Mapping):
        raise InvalidOption(
            f"item {n} is a {type(item).__name__}, not a mapping of fields; give each call "
            'as a dict such as {"args": [...], "kwargs": {...}, "delay": 60}')
    unknown = set(item) - ITEM_FIELDS
    if unknown:
        raise InvalidOption(f"item {n} has unknown fields {sorted(unknown, key=str)}; "
                            f"allowed: {', '.join(sorted(ITEM_FIELDS))}")
    return item


def if_exists(value: str) -> str:
    if value not in IF_EXISTS:
        raise InvalidOption(f"if_exists must be one of {', '.join(IF_EXISTS)}; got {value!r}")
    return value


def json_value(value: Any, name: str) -> str:
    """``value`` as canonical JSON text (see ``envelope.canonical_json``)."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidOption(f"{name} must be a JSON value (text, number, true/false, None, "
                            f"list or dict), got {value!r}: {exc}") from None
