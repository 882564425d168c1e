"""The admin's cancel of a row not in Redis yet (``stored=False``) racing the row's Redis
write: the on-commit write, or ``delayq_reconcile``'s. Whichever comes first, a cancelled
row leaves nothing in Redis, and the admin says "cancelled" only for what it cancelled.

Each test runs the other party inside the first one's Redis call (a wrapper around the real
``submit`` or ``cancel_outcome``), at the moment the race puts it."""

from __future__ import annotations

import sys
from typing import NamedTuple

import pytest
import redis
from celery import Celery
from django.db import transaction
from django.urls import reverse

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.contrib.django.models import DelayedTask as Row
from celery_delayq.contrib.django.reconcile import reconcile
from celery_delayq.contrib.django.sync import JournalSync
from celery_delayq.testing.redis_server import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:delayq_delayedtask_changelist"

#: The project's Celery app while a test runs (``settings.DELAYQ_CELERY_APP`` names it).
project_app: Celery | None = None


class Lone(NamedTuple):
    server: RedisServer
    delayq: DelayQ
    remind: DelayedTask


@pytest.fixture
def lone(settings, monkeypatch, lone_store):
    """``lone_store``'s app as the project's: the admin works with it."""
    server, delayq, remind = lone_store
    monkeypatch.setattr(sys.modules[__name__], "project_app", delayq.app)
    settings.DELAYQ_CELERY_APP = f"{__name__}:project_app"
    return Lone(server, delayq, remind)


def _unstored(lone: Lone, *ns: int) -> None:
    """Rows ``remind:<n>`` committed while Redis was down: ``stored=False``, for reconcile."""
    lone.server.stop()
    with transaction.atomic():
        for n in ns:
            lone.remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")
    lone.server.start()
    assert not Row.objects.filter(stored=True).exists()


def _cancel_in_admin(client, job_id: str) -> list[str]:
    pk = Row.objects.get(job_id=job_id).pk
    response = client.post(reverse(CHANGELIST), {"action": "cancel_tasks",
                                                 "_selected_action": [pk]}, follow=True)
    return [str(m) for m in response.context["messages"]]


def _mirrored(delayq: DelayQ, job_id: str) -> Row:
    """The row once the sync applied the journal (a write the writer undid shows there)."""
    JournalSync(delayq).run_once()
    return Row.objects.get(job_id=job_id)


def test_a_cancel_while_reconcile_writes_the_row_leaves_nothing_in_redis(
        admin_client, lone, monkeypatch):
    _unstored(lone, 1)
    real_submit, said = lone.delayq.submit, []

    def cancelled_meanwhile(items, if_exists):
        said.extend(_cancel_in_admin(admin_client, "remind:1"))
        return real_submit(items, if_exists)

    monkeypatch.setattr(lone.delayq, "submit", cancelled_meanwhile)
    report = reconcile(lone.delayq)
    assert said == ["cancelled: 1 task (remind:1)"]
    assert lone.delayq.get("remind:1") is None, "cancelled in the admin, yet pending"
    assert report.pushed == []
    row = _mirrored(lone.delayq, "remind:1")
    assert (row.state, row.cancelled_by) == ("cancelled", "admin in the Django admin")


def test_reconcile_does_not_write_a_row_cancelled_while_it_pushed_the_rows_before(
        admin_client, lone, monkeypatch):
    _unstored(lone, 1, 2)
    real_submit, cancelled = lone.delayq.submit, []

    def cancel_the_other_row(items, if_exists):
        if not cancelled:
            cancelled.append("remind:2" if items[0][0].job_id == "remind:1" else "remind:1")
            assert _cancel_in_admin(admin_client, cancelled[0]) == [
                f"cancelled: 1 task ({cancelled[0]})"]
        return real_submit(items, if_exists)

    monkeypatch.setattr(lone.delayq, "submit", cancel_the_other_row)
    report = reconcile(lone.delayq)
    [other] = cancelled
    assert report.pushed == sorted({"remind:1", "remind:2"} - {other})
    row = _mirrored(lone.delayq, other)
    assert (row.state, row.stored) == ("cancelled", False)
    assert not row.events.filter(event="scheduled").exists(), "written to Redis"


def test_a_cancel_while_the_on_commit_write_runs_leaves_nothing_in_redis(
        admin_client, lone, monkeypatch):
    real_submit, said = lone.delayq.submit, []

    def cancelled_meanwhile(items, if_exists):  # a slow write: Redis retrying
        said.extend(_cancel_in_admin(admin_client, "remind:1"))
        return real_submit(items, if_exists)

    monkeypatch.setattr(lone.delayq, "submit", cancelled_meanwhile)
    with transaction.atomic():
        lone.remind.apply_delayed(args=(1,), delay=600, job_id="remind:1")
    assert said == ["cancelled: 1 task (remind:1)"]
    assert lone.delayq.get("remind:1") is None, "cancelled in the admin, yet pending"
    assert _mirrored(lone.delayq, "remind:1").state == "cancelled"


def test_an_on_commit_write_outlasting_reconcile_and_a_cancel_leaves_nothing_in_redis(
        admin_client, lone, monkeypatch):
    real_submit, said = lone.delayq.submit, []

    def reconciled_and_cancelled_meanwhile(items, if_exists):
        monkeypatch.setattr(lone.delayq, "submit", real_submit)
        report = reconcile(lone.delayq)  # the row is its on-commit write's
        assert (report.pushed, report.busy) == ([], ["remind:1"])
        said.extend(_cancel_in_admin(admin_client, "remind:1"))
        return real_submit(items, if_exists)  # the slow write lands last

    monkeypatch.setattr(lone.delayq, "submit", reconciled_and_cancelled_meanwhile)
    with transaction.atomic():
        lone.remind.apply_delayed(args=(1,), delay=600, job_id="remind:1")
    assert said == ["cancelled: 1 task (remind:1)"]
    assert lone.delayq.get("remind:1") is None, "cancelled in the admin, yet pending"
    assert _mirrored(lone.delayq, "remind:1").state == "cancelled"


@pytest.mark.parametrize(("carrier", "said", "state"), [
    (False, "cancelled", "cancelled"),
    (True, "too late: already promoted", "scheduled"),
])
def test_a_cancel_whose_row_was_written_meanwhile_cancels_it_in_redis_or_says_too_late(
        admin_client, lone, monkeypatch, carrier, said, state):
    """Redis did not know the job when the admin asked, and the row was written there (and
    taken by a carrier) before the admin marked it cancelled."""
    _unstored(lone, 1)
    real_cancel = lone.delayq.cancel_outcome

    def written_meanwhile(*args, **kwargs):
        outcome = real_cancel(*args, **kwargs)
        monkeypatch.setattr(lone.delayq, "cancel_outcome", real_cancel)
        assert reconcile(lone.delayq).pushed == ["remind:1"]
        if carrier:
            lone.delayq.run_now("remind:1")
            lone.delayq.store.claim(list(lone.delayq.store.keys), batch=10, lease_ms=60_000)
        return outcome

    monkeypatch.setattr(lone.delayq, "cancel_outcome", written_meanwhile)
    assert _cancel_in_admin(admin_client, "remind:1") == [f"{said}: 1 task (remind:1)"]
    assert (lone.delayq.get("remind:1") is None) is not carrier
    assert _mirrored(lone.delayq, "remind:1").state == state


def test_a_job_a_carrier_took_before_its_writer_could_cancel_it_stays_scheduled_on_the_row(
        admin_client, lone, monkeypatch):
    """The one race the writer cannot win: the job due at once, claimed between its write
    and the writer's cancel. The row says what Redis holds, and why."""
    real_submit = lone.delayq.submit

    def claimed_before_the_writer_looks(items, if_exists):
        _cancel_in_admin(admin_client, "remind:1")  # says "cancelled": this race's one untruth
        results = real_submit(items, if_exists)
        lone.delayq.run_now("remind:1")
        lone.delayq.store.claim(list(lone.delayq.store.keys), batch=10, lease_ms=60_000)
        return results

    monkeypatch.setattr(lone.delayq, "submit", claimed_before_the_writer_looks)
    with transaction.atomic():
        lone.remind.apply_delayed(args=(1,), delay=600, job_id="remind:1")
    row = Row.objects.get(job_id="remind:1")
    assert (row.state, row.stored, row.cancelled_by) == ("scheduled", True, "")
    [event] = row.events.filter(event="cancel failed")
    assert "a carrier took it first" in event.detail


def test_a_cancel_redis_refuses_after_the_write_leaves_the_row_scheduled_to_cancel_again(
        admin_client, lone, monkeypatch):
    """Redis turned read-only (a failover demoted it) between the write and the writer's
    cancel: the row says the job is pending, and the commit's later writes still run."""
    real_submit = lone.delayq.submit
    server = redis.Redis(port=lone.server.port)

    def refused_after_the_write(items, if_exists):
        monkeypatch.setattr(lone.delayq, "submit", real_submit)
        _cancel_in_admin(admin_client, "remind:1")
        results = real_submit(items, if_exists)
        server.replicaof("127.0.0.1", 1)
        return results

    monkeypatch.setattr(lone.delayq, "submit", refused_after_the_write)
    with transaction.atomic():
        for n in (1, 2):
            lone.remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")
    row = Row.objects.get(job_id="remind:1")
    assert (row.state, row.stored) == ("scheduled", True)
    [event] = row.events.filter(event="cancel failed")
    assert "read-only replica" in event.detail
    assert "read-only replica" in Row.objects.get(job_id="remind:2").store_error

    server.replicaof("no", "one")
    server.close()
    assert lone.delayq.get("remind:1") is not None
    assert _cancel_in_admin(admin_client, "remind:1") == ["cancelled: 1 task (remind:1)"]
    assert lone.delayq.get("remind:1") is None
