"""countdown/eta that bypass DelayedTask (send_task, plain tasks, signatures) reach the store."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest


def test_plain_task_countdown_is_stored(proj, delayq):
    result = proj.plain.apply_async(("x",), countdown=600)
    job = delayq.get(result.id)
    assert (job.task, job.args) == (proj.plain.name, ["x"])


def test_send_task_of_an_unregistered_task_is_stored(proj, delayq):
    eta = datetime.now(timezone.utc) + timedelta(minutes=5)
    result = proj.app.send_task("elsewhere.remind", args=(42,), eta=eta, queue="reminders")
    job = delayq.get(result.id)
    assert (job.task, job.args, job.queue) == ("elsewhere.remind", [42], "reminders")
    assert abs((job.due - eta).total_seconds()) < 0.002


def test_signature_countdown_is_stored(proj, delayq):
    result = proj.app.signature("elsewhere.remind", args=(7,)).apply_async(countdown=60)
    assert delayq.get(result.id).args == [7]


@pytest.fixture
def configure(delayq):
    """Change some of the app's delayq settings for one test."""
    original = delayq.config

    def change(**settings):
        delayq.__dict__["config"] = dataclasses.replace(original, **settings)

    yield change
    delayq.__dict__["config"] = original


def test_short_countdowns_stay_native_below_the_threshold(proj, delayq, configure):
    configure(countdown_threshold=120.0)
    result = proj.app.send_task("elsewhere.remind", args=(1,), countdown=60,
                                queue="native-only")
    assert delayq.get(result.id) is None


def test_routing_send_task_can_be_turned_off(proj, delayq, configure):
    configure(route_send_task=False)
    result = proj.app.send_task("elsewhere.remind", args=(1,), countdown=600,
                                queue="native-only")
    assert delayq.get(result.id) is None


@pytest.mark.parametrize("call", ["apply_async", "send_task"])
def test_a_countdown_given_with_an_eta_wins_as_in_celery(proj, delayq, call):
    """Celery turns a countdown into the eta, replacing one given beside it."""
    eta = datetime.now(timezone.utc) + timedelta(days=1)
    before = datetime.now(timezone.utc)
    if call == "apply_async":
        result = proj.record.apply_async(("both",), countdown=600, eta=eta)
    else:
        result = proj.app.send_task("elsewhere.remind", countdown=600, eta=eta)
    due = delayq.get(result.id).due
    assert before + timedelta(seconds=599) < due < datetime.now(timezone.utc) + \
        timedelta(seconds=601)


def test_a_zero_countdown_leaves_the_eta_as_in_celery(proj, delayq):
    eta = datetime.now(timezone.utc) + timedelta(days=1)
    result = proj.record.apply_async(("eta",), countdown=0, eta=eta)
    assert abs((delayq.get(result.id).due - eta).total_seconds()) < 0.002


def test_send_task_with_a_countdown_takes_celerys_arguments_by_position(proj, delayq):
    """``task_id`` is the sixth parameter of Celery's ``send_task``, ``expires`` the 11th."""
    result = proj.app.send_task("elsewhere.remind", (1,), None, 600, None, "own-id",
                                None, None, None, None, 3600)
    job = delayq.get("own-id")
    assert (result.id, job.task_id, job.args) == ("own-id", "own-id", [1])
    assert "expires" in job.options["o"]


def test_send_task_with_a_countdown_refuses_more_arguments_than_celerys_as_celery_does(proj):
    with pytest.raises(TypeError, match="positional arguments but 30 were given"):
        proj.app.send_task("elsewhere.remind", (1,), None, 600, None, *[None] * 25)


def test_an_eta_in_the_apps_zone_on_a_fall_back_night_is_counted_in_real_time(
        proj, delayq, monkeypatch):
    """Datetimes of one zone subtract as wall clocks: at 01:50 EDT on the night clocks
    go back, 01:10 EST is 20 minutes ahead, not 40 behind, so the store takes the call
    (rather than Celery's own path, which would hold it undurably in a worker)."""
    zone = ZoneInfo("America/New_York")
    monkeypatch.setattr(proj.app, "now", lambda: datetime(2026, 11, 1, 1, 50, tzinfo=zone))
    eta = datetime(2026, 11, 1, 1, 10, fold=1, tzinfo=zone)
    assert delayq.store_delay(None, eta) == {"eta": eta}
