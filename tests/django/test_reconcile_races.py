"""``delayq_reconcile`` beside the other writers of a row not in Redis yet: another
reconcile (cron and an operator), the row's own on-commit write, ``delayq_sync`` committing
between its writes (SQLite), and a reconcile that died with a row claimed.

The rows are due at once and a real carrier promotes what is written, so a row written
twice is a task published (and run) twice: the tests count the broker's messages."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import redis
from django.db import connection, transaction

from celery_delayq.carrier import Carrier
from celery_delayq.contrib.django.models import DelayedTask as Row
from celery_delayq.contrib.django.reconcile import reconcile
from celery_delayq.contrib.django.sync import JournalSync

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def carried(lone_store):
    """A carrier promoting the lone store's due jobs; yields the broker's messages per job."""
    server, delayq, _remind = lone_store
    carrier = Carrier(delayq.app, idle_timeout=0.2)
    thread = threading.Thread(target=carrier.run, name="carrier", daemon=True)
    thread.start()
    broker = redis.Redis(port=server.port)

    def published() -> Counter[str]:
        return Counter(json.loads(raw)["headers"].get("delayq_job")
                       for raw in broker.lrange("celery", 0, -1))

    yield published
    carrier.stop()
    thread.join(10)
    broker.close()


def _unstored(lone_store, count: int) -> list[str]:
    """Rows ``remind:<n>``, due at once, whose Redis write failed at commit (Redis down)."""
    server, _delayq, remind = lone_store
    server.stop()
    with transaction.atomic():
        for n in range(count):
            remind.apply_delayed(args=(n,), delay=0, job_id=f"remind:{n}")
    server.start()
    assert Row.objects.unstored().count() == count
    return [f"remind:{n}" for n in range(count)]


def _all_published(delayq, published, jobs: list[str]) -> Counter[str]:
    """The messages once every job left the store and reached the broker (and a moment
    more, for a second copy on its way)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (delayq.pending() or set(published()) < set(jobs)):
        time.sleep(0.05)
    time.sleep(0.5)
    return published()


def test_two_reconciles_at_once_publish_each_row_once(lone_store, carried, monkeypatch):
    """Cron's reconcile and an operator's, both listing the rows before either pushed."""
    _server, delayq, _remind = lone_store
    jobs = _unstored(lone_store, 5)
    real_submit, second = delayq.submit, []

    def other_reconcile_meanwhile(items, if_exists):
        monkeypatch.setattr(delayq, "submit", real_submit)
        second.append(reconcile(delayq))  # runs to its end while the first one pushes
        _all_published(delayq, carried, second[0].pushed)  # and the carrier promotes them
        return real_submit(items, if_exists)

    monkeypatch.setattr(delayq, "submit", other_reconcile_meanwhile)
    first = reconcile(delayq)
    assert _all_published(delayq, carried, jobs) == Counter(jobs), "published twice"
    assert sorted(first.pushed + second[0].pushed) == jobs
    assert not Row.objects.filter(stored=False).exists()


def test_reconcile_leaves_a_row_to_its_on_commit_write_under_way(
        lone_store, carried, monkeypatch):
    _server, delayq, remind = lone_store
    real_submit, reconciled = delayq.submit, []

    def reconciled_meanwhile(items, if_exists):  # a slow on-commit write
        monkeypatch.setattr(delayq, "submit", real_submit)
        reconciled.append(reconcile(delayq))
        _all_published(delayq, carried, reconciled[0].pushed)
        return real_submit(items, if_exists)

    monkeypatch.setattr(delayq, "submit", reconciled_meanwhile)
    with transaction.atomic():
        remind.apply_delayed(args=(1,), delay=0, job_id="remind:1")
    assert _all_published(delayq, carried, ["remind:1"]) == Counter(["remind:1"])
    [report] = reconciled
    assert (report.pushed, report.busy) == ([], ["remind:1"])
    assert Row.objects.get(job_id="remind:1").stored is True


def _killed_reconcile(lone_store, monkeypatch, after_the_push: bool) -> None:
    """One unstored row, and a reconcile killed (Ctrl-C, or SIGKILL alike) with it claimed,
    before or after its Redis write."""
    _server, delayq, _remind = lone_store
    _unstored(lone_store, 1)
    real_submit = delayq.submit

    def killed(items, if_exists):
        if after_the_push:
            real_submit(items, if_exists)
        raise KeyboardInterrupt

    monkeypatch.setattr(delayq, "submit", killed)
    with pytest.raises(KeyboardInterrupt):
        reconcile(delayq)
    monkeypatch.setattr(delayq, "submit", real_submit)
    assert Row.objects.get().store_error.startswith(
        "being written to Redis by delayq_reconcile")


def test_a_row_claimed_by_a_reconcile_that_died_is_pushed_once_its_claim_is_old(
        lone_store, monkeypatch):
    from celery_delayq.contrib.django.transactional import CLAIM_LEASE

    _server, delayq, _remind = lone_store
    _killed_reconcile(lone_store, monkeypatch, after_the_push=False)
    report = reconcile(delayq)  # its writer may still be pushing it
    assert (report.pushed, report.busy) == ([], ["remind:0"])
    claimed_at = Row.objects.get().updated_at
    Row.objects.update(updated_at=claimed_at - CLAIM_LEASE - timedelta(seconds=1))
    assert reconcile(delayq).pushed == ["remind:0"]
    assert delayq.get("remind:0") is not None


def test_a_row_a_dead_reconcile_pushed_is_marked_stored_by_the_sync_not_pushed_again(
        lone_store, monkeypatch):
    """Killed between its push and marking the row: the journal says the job is written."""
    _server, delayq, _remind = lone_store
    _killed_reconcile(lone_store, monkeypatch, after_the_push=True)
    JournalSync(delayq).run_once()
    assert Row.objects.get().stored is True
    assert reconcile(delayq).pushed == []


def test_reconcile_goes_on_while_the_sync_commits_between_its_writes(
        lone_store, monkeypatch):
    """SQLite (WAL): a read held open across the loop's writes made the first write after
    another connection's commit fail at once with "database is locked". More rows than
    one fetch of a query iterator (2,000) keep such a read open."""
    _server, delayq, remind = lone_store
    with transaction.atomic():  # the on-commit writes never ran: the process died
        for n in range(2001):
            remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")
        transaction.get_connection().run_on_commit = []
    Row.objects.update(store_error="the store is unavailable")  # as a failed write records
    real_submit, synced = delayq.submit, []

    def sync_commits_meanwhile(items, if_exists):
        results = real_submit(items, if_exists)
        if not synced:  # delayq_sync, on its own connection, applies the write's event
            thread = threading.Thread(target=_sync_once, args=(delayq, synced))
            thread.start()
            thread.join()
            assert synced == [1]
        return results

    monkeypatch.setattr(delayq, "submit", sync_commits_meanwhile)
    assert connection.vendor == "sqlite"
    report = reconcile(delayq)
    assert (len(report.pushed), report.failed) == (2001, {})
    assert not Row.objects.filter(stored=False).exists()


def _sync_once(delayq, applied: list[int]) -> None:
    try:
        applied.append(JournalSync(delayq).run_once())
    finally:
        connection.close()


def test_an_on_commit_write_after_a_transaction_longer_than_the_claim_leaves_a_row_taken_over(
        lone_store, monkeypatch):
    """The row's claim dates from its write in the transaction: a reconcile running at the
    commit of a transaction longer than the lease takes the row; its on-commit write then
    does not write it again."""
    from celery_delayq.contrib.django import transactional

    _server, delayq, remind = lone_store
    monkeypatch.setattr(transactional, "CLAIM_LEASE", timedelta(seconds=0.2))
    real_submit, written, reports = delayq.submit, [], []

    def counted(items, if_exists):
        written.extend(call.job_id for call, _due in items)
        return real_submit(items, if_exists)

    monkeypatch.setattr(delayq, "submit", counted)
    with transaction.atomic():
        transaction.on_commit(lambda: reports.append(reconcile(delayq)))  # runs first
        remind.apply_delayed(args=(1,), delay=0, job_id="remind:1")
        time.sleep(0.3)
    assert reports[0].pushed == ["remind:1"]
    assert written == ["remind:1"], "written twice"
    with transaction.atomic():  # nobody took it over: the on-commit write renews its claim
        remind.apply_delayed(args=(2,), delay=0, job_id="remind:2")
        time.sleep(0.3)
    assert written == ["remind:1", "remind:2"]
    assert Row.objects.get(job_id="remind:2").stored is True
