"""Datetimes between the store and the database.

The store's times are aware (UTC). A model field holds what Django's ``USE_TZ`` says: aware
datetimes with it, naive ones in the project's ``TIME_ZONE`` without it (SQLite and MySQL
refuse aware ones then). Every time written to a field goes through :func:`to_db`; every
field's time given to the store or shown goes through :func:`from_db`.
"""

from __future__ import annotations

from datetime import datetime
from typing import overload

from django.conf import settings
from django.utils import timezone

from celery_delayq.reading import datetime_of_ms


def to_db(at: datetime | None) -> datetime | None:
    """An aware datetime as a model field holds it: as is with ``USE_TZ``, else naive in
    the project's time zone (None when it has no such time: past year 9999 there)."""
    if at is None or settings.USE_TZ:
        return at
    try:
        return timezone.make_naive(at, timezone.get_default_timezone())
    except OverflowError:
        return None


@overload
def from_db(at: datetime) -> datetime: ...
@overload
def from_db(at: None) -> None: ...
def from_db(at: datetime | None) -> datetime | None:
    """A model field's datetime as an aware one (a naive one is in the project's time zone)."""
    if at is None or timezone.is_aware(at):
        return at
    return timezone.make_aware(at, timezone.get_default_timezone())


def db_time_of_ms(ms: float | int | str | None) -> datetime | None:
    """Epoch milliseconds as a model field holds them; None when they are no time
    (:func:`~celery_delayq.reading.datetime_of_ms`) or none in the project's time zone."""
    return to_db(datetime_of_ms(ms))
