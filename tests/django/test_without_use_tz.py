"""A project with ``USE_TZ = False`` (naive local datetimes in its database, as Django's
SQLite and MySQL backends require there): the mirror, the admin, transactional scheduling
and reconcile keep every time right, in the project's ``TIME_ZONE``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from django.urls import reverse

from celery_delayq.contrib.django.models import DelayedTask
from celery_delayq.contrib.django.reconcile import reconcile
from celery_delayq.contrib.django.sync import apply_event

pytestmark = pytest.mark.django_db(transaction=True)
LOCAL = ZoneInfo("Asia/Kolkata")  # +05:30: a time kept in UTC or with its zone cut off shows


@pytest.fixture
def naive_project(settings):
    settings.USE_TZ = False
    settings.TIME_ZONE = "Asia/Kolkata"
    return settings


def _in_an_hour() -> datetime:
    return (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)


def _local(at: datetime) -> datetime:
    """``at`` as a USE_TZ=False database holds it: naive, in the project's time zone."""
    return at.astimezone(LOCAL).replace(tzinfo=None)


def test_events_of_the_hour_the_clocks_go_back_still_move_the_row(settings):
    """Naive local times repeat that hour: a job scheduled at 01:50 EDT and run at 01:05
    EST, fifteen minutes later, looks run before it was scheduled."""
    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    scheduled = int(datetime(2026, 11, 1, 5, 50, tzinfo=timezone.utc).timestamp() * 1000)
    due = scheduled + 15 * 60_000
    row = DelayedTask(job_id="order:1:close")
    apply_event(row, {"event": "scheduled", "task": "t", "due": str(due)}, f"{scheduled}-0")
    for n, event in enumerate(("promoted", "started", "succeeded")):
        apply_event(row, {"event": event, "due": str(due)}, f"{due + n}-0")
    assert (row.state, row.finished_at) == ("succeeded", datetime(2026, 11, 1, 1, 5, 0, 2000))


def test_sync_mirrors_due_and_event_times_as_naive_local_times(naive_project, shop_delayq,
                                                               sync):
    eta = _in_an_hour()
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), eta=eta,
                         key="order:1", job_id="order:1:close")
    assert sync.run_once() == 1
    row = DelayedTask.objects.get(job_id="order:1:close")
    assert row.due == _local(eta)
    assert abs(row.scheduled_at - _local(datetime.now(timezone.utc))) < timedelta(seconds=5)
    assert row.events.get().due == _local(eta)


def test_backfill_writes_the_due_time_as_a_naive_local_time(naive_project, shop_delayq,
                                                            sync):
    eta = _in_an_hour()
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(2,), eta=eta,
                         job_id="order:2:close")
    assert sync.backfill() == 1
    assert DelayedTask.objects.get(job_id="order:2:close").due == _local(eta)
    assert sync.backfill() == 0, "a row with the store's due time is left as it is"


def test_a_call_inside_a_transaction_is_stored_on_commit_at_its_due_time(
        naive_project, shop_delayq):
    from shop.tasks import close_unpaid_order

    eta = _in_an_hour()
    with transaction.atomic():
        result = close_unpaid_order.apply_delayed(args=(3,), eta=eta, job_id="order:3:close")
        assert DelayedTask.objects.get(job_id="order:3:close").due == _local(eta)
    assert result.eta == eta
    assert shop_delayq.get("order:3:close").due == eta
    row = DelayedTask.objects.get(job_id="order:3:close")
    assert (row.stored, row.due) == (True, _local(eta))
    with transaction.atomic():  # kept: the existing row answers
        again = close_unpaid_order.apply_delayed(args=(3,), delay=60, job_id="order:3:close")
    assert again.eta == eta


def test_reconcile_missing_rewrites_a_lost_job_at_its_due_time(naive_project, shop_delayq,
                                                               shop_redis, sync):
    eta = _in_an_hour()
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(4,), eta=eta,
                         job_id="order:4:close")
    sync.run_once()
    shop_redis.delete(*shop_redis.keys(f"{shop_delayq.store.keys.prefix}:*"))  # data lost

    assert reconcile(shop_delayq, missing=True).pushed == ["order:4:close"]
    assert shop_delayq.get("order:4:close").due == eta
    assert DelayedTask.objects.get(job_id="order:4:close").due == _local(eta)


def test_admin_pages_show_local_times_and_reschedule_to_a_local_time(
        naive_project, admin_client, shop_delayq, sync):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(5,), eta=_in_an_hour(),
                         key="order:5", job_id="order:5:close")
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:5:close")
    listing = admin_client.get(reverse("admin:delayq_delayedtask_changelist"))
    html = listing.content.decode().replace("\xa0", " ")
    assert "in 59 minutes" in html
    chart = listing.context["delayq_chart"]
    assert chart.total == 1 and chart.rows[0][0] == f"{row.due:%a %H}:00"  # its local hour
    detail = admin_client.get(reverse("admin:delayq_delayedtask_change", args=[row.pk]))
    assert f"{row.due:%Y-%m-%d %H:%M:%S} IST" in detail.content.decode()

    tomorrow = _local(datetime.now(timezone.utc) + timedelta(days=1)).replace(
        second=0, microsecond=0)
    done = admin_client.post(reverse("admin:delayq_delayedtask_changelist"), {
        "action": "reschedule_tasks", "_selected_action": [row.pk], "apply": "Reschedule",
        "due_at": f"{tomorrow:%Y-%m-%d %H:%M}"}, follow=True)
    assert [str(m) for m in done.context["messages"]] == [
        f"due {tomorrow:%Y-%m-%d %H:%M:%S}: 1 task (order:5:close)"]
    assert shop_delayq.get("order:5:close").due == tomorrow.replace(tzinfo=LOCAL)
    assert DelayedTask.objects.get(pk=row.pk).due == tomorrow

    ran = admin_client.post(reverse("admin:delayq_delayedtask_changelist"), {
        "action": "run_now", "_selected_action": [row.pk]}, follow=True)
    assert ran.status_code == 200
    assert DelayedTask.objects.get(pk=row.pk).due <= _local(datetime.now(timezone.utc))


#: 01:30 CET on the night of 29 March 2026, when Berlin's clocks go from 02:00 to 03:00
SPRING_FORWARD = datetime(2026, 3, 29, 0, 30, tzinfo=timezone.utc)
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def dst_night(settings, monkeypatch):
    """A USE_TZ=False project in Berlin whose clocks read 01:30 of a spring-forward night."""
    from celery_delayq.contrib.django import times

    settings.USE_TZ, settings.TIME_ZONE = False, "Europe/Berlin"
    monkeypatch.setattr("django.utils.timezone.now", lambda: SPRING_FORWARD.astimezone(
        BERLIN).replace(tzinfo=None))
    monkeypatch.setattr(times, "utc_now", lambda: SPRING_FORWARD)


def test_a_delay_counts_real_minutes_across_a_clock_change(dst_night, shop_delayq):
    """Two hours from 01:30 CET is 04:30 CEST by the wall clock, not 03:30: the admin's
    "delay N minutes", a transactional call's due time on its row (which reconcile writes
    to the store if the on-commit write failed) and the "due in" column count real time."""
    from shop.tasks import close_unpaid_order

    from celery_delayq.contrib.django.admin import RescheduleForm, _relative_due

    later = SPRING_FORWARD + timedelta(hours=2)
    form = RescheduleForm(data={"delay_minutes": "120"})
    assert form.is_valid(), form.errors
    assert form.due() == later
    with transaction.atomic():
        close_unpaid_order.apply_delayed(args=(6,), delay=7200, job_id="order:6:close")
        row = DelayedTask.objects.get(job_id="order:6:close")
    assert row.due == datetime(2026, 3, 29, 4, 30)
    assert _relative_due(row).replace("\xa0", " ") == "in 2 hours"


@pytest.mark.parametrize("local", ["2027-11-07 01:30", "2027-03-14 02:30"],
                         ids=["repeated hour", "skipped hour"])
def test_reschedule_form_refuses_a_time_a_clock_change_repeats_or_skips(settings, shop_delayq,
                                                                        local):
    """New York's clocks go back over 01:00-02:00 on 7 November 2027 and skip 02:00-03:00
    on 14 March: such a time names two instants, or none. Refused, as Django's own field
    refuses it with USE_TZ = True, rather than one reading picked."""
    from celery_delayq.contrib.django.admin import RescheduleForm

    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    form = RescheduleForm(data={"due_at": local})
    assert not form.is_valid()
    assert form.errors["due_at"] == [
        f"{local}:00 could not be interpreted in time zone America/New_York; it may be "
        "ambiguous or it may not exist."]


def _next_repeated_hour(zone: ZoneInfo) -> datetime:
    """The start (UTC) of the second pass of the next hour ``zone``'s clocks go back over."""
    at = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    while (at + timedelta(hours=2)).astimezone(zone).utcoffset() >= (
            at + timedelta(hours=1)).astimezone(zone).utcoffset():
        at += timedelta(hours=1)
    return at + timedelta(hours=2)


def test_a_kept_call_in_a_transaction_answers_the_due_time_redis_holds_in_the_repeated_hour(
        settings, shop_delayq):
    """A naive time read back from the row is the first of the two 01:30s; the job is due
    at the second, and Redis, which the kept call reads anyway, says so."""
    from shop.tasks import close_unpaid_order

    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    eta = _next_repeated_hour(ZoneInfo("America/New_York")) + timedelta(minutes=30)
    with transaction.atomic():
        first = close_unpaid_order.apply_delayed(args=(7,), eta=eta, job_id="order:7:close")
    assert first.eta == shop_delayq.get("order:7:close").due == eta
    with transaction.atomic():
        kept = close_unpaid_order.apply_delayed(args=(7,), delay=60, job_id="order:7:close")
    assert kept.eta == eta
