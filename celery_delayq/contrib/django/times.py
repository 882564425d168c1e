"""Datetimes between the store and the database.

The store's times are aware (UTC). A model field holds what Django's ``USE_TZ`` says: aware
datetimes with it, naive ones in the project's ``TIME_ZONE`` without it (SQLite and MySQL
refuse aware ones then). Every time written to a field goes through :func:`to_db`; every
field's time given to the store or shown goes through :func:`from_db`.

A field holds no time before :data:`EARLIEST` or after :data:`LATEST` (a day inside years 2
to 9998): every time zone has a date for each time between them, and a year after that
date's (the admin's date drill-down works one out). No producer writes a time outside them
(``delayq_max_delay`` is at most 100 years); damaged or planted journal entries may.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import overload

from django.conf import settings
from django.utils import timezone

from celery_delayq.reading import datetime_of_ms

#: The earliest and latest time a model field holds (aware, UTC).
EARLIEST = datetime(2, 1, 1, tzinfo=dt_timezone.utc) + timedelta(days=1)
LATEST = datetime(9999, 1, 1, tzinfo=dt_timezone.utc) - timedelta(days=1)


def to_db(at: datetime | None) -> datetime | None:
    """An aware datetime as a model field holds it: as is with ``USE_TZ``, else naive in
    the project's time zone; None outside :data:`EARLIEST` to :data:`LATEST`."""
    if at is None or not EARLIEST <= at <= LATEST:
        return None
    if settings.USE_TZ:
        return at
    return timezone.make_naive(at, timezone.get_default_timezone())


def utc_now() -> datetime:
    """Now, aware in UTC: a delay added to it, or a time taken from it, counts real time
    across a clock change, which a naive local time (``timezone.now()`` without
    ``USE_TZ``) does not. (Call it as ``times.utc_now()``: a test moves the clock there.)"""
    return datetime.now(dt_timezone.utc)


@overload
def from_db(at: datetime) -> datetime: ...
@overload
def from_db(at: None) -> None: ...
def from_db(at: datetime | None) -> datetime | None:
    """A model field's datetime as an aware one (a naive one is in the project's time zone)."""
    if at is None or timezone.is_aware(at):
        return at
    return timezone.make_aware(at, timezone.get_default_timezone())


def one_instant(at: datetime) -> bool:
    """Whether a naive time in the project's time zone names one instant: not one a clock
    change skips (none) or repeats (two; read back, :func:`from_db` takes the first)."""
    zone = timezone.get_default_timezone()
    return zone.utcoffset(at.replace(fold=0)) == zone.utcoffset(at.replace(fold=1))


def db_time_of_ms(ms: float | int | str | None) -> datetime | None:
    """Epoch milliseconds as a model field holds them; None when they are no time
    (:func:`~celery_delayq.reading.datetime_of_ms`) or one it does not hold (:func:`to_db`)."""
    return to_db(datetime_of_ms(ms))
