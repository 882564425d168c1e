"""delayq_sync on the arguments of stored calls: values kombu's JSON writes as objects
(datetime, Decimal, UUID, bytes) are mirrored as the text the admin shows for them."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timezone
from decimal import Decimal

import pytest

from celery_delayq.contrib.django.models import DelayedTask

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "shop.tasks.close_unpaid_order"


def test_arguments_kombu_decodes_to_objects_are_mirrored_as_their_text(
        shop_delayq, sync):
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    shop_delayq.schedule(TASK, args=(Decimal("12.50"), Decimal("NaN"), at, b"raw"),
                         kwargs={"order": uuid.UUID(int=42), "day": date(2030, 1, 2)},
                         delay=600, job_id="order:42:close")
    shop_delayq.schedule(TASK, args=(1,), delay=600, job_id="order:43:close")

    sync.run_once()

    row = DelayedTask.objects.get(job_id="order:42:close")
    assert row.args == ["12.50", "NaN", "2030-01-02 03:04:05+00:00", "b'raw'"]
    assert row.kwargs == {"order": "00000000-0000-0000-0000-00000000002a",
                          "day": "2030-01-02"}
    assert DelayedTask.objects.get(job_id="order:43:close").args == [1]


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--batch", "0", "--batch must be at least 1"),
    ("--batch", "-5", "--batch must be at least 1"),
    ("--interval", "0", "--interval must be more than 0 seconds"),
    ("--interval", "-1", "--interval must be more than 0 seconds"),
    ("--interval", "nan", "--interval must be more than 0 seconds"),
    # a Redis ResponseError traceback; a sync that stopped polling after its first idle pass
    ("--batch", "99999999999999999999", "--batch must be at most 100,000"),
    ("--interval", "inf", "--interval must be .* at most 3,600"),
])
def test_delayq_sync_refuses_a_batch_or_interval_that_is_not_positive(
        shop_delayq, option, value, says):
    """A batch of 0 met a Redis DataError (a traceback); an interval of 0 polled the
    store without a pause."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=says):
        call_command("delayq_sync", "--once", option, value)
