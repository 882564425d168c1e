"""apply_delayed inside transaction.atomic(): Redis written on commit, reconcile repairs."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from decimal import Decimal
from uuid import UUID

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import transaction

from celery_delayq.contrib.django.models import DelayedTask as Row
from celery_delayq.contrib.django.models import JournalCursor
from celery_delayq.contrib.django.reconcile import mark_missing, reconcile
from celery_delayq.contrib.django.sync import JournalSync
from celery_delayq.errors import JobExists
from celery_delayq.store.claims import Promoted
from tests.django.test_sync import journal_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_apply_delayed_in_a_transaction_writes_the_row_now_and_redis_on_commit(
        shop_delayq, fast_shop):
    from shop.tasks import close_unpaid_order

    with transaction.atomic():
        result = close_unpaid_order.apply_delayed(args=(7,), delay=600, key="order:7",
                                                  job_id="order:7:close")
        row = Row.objects.get(job_id="order:7:close")
        assert (row.state, row.stored, row.args) == ("scheduled", False, [7])
        assert shop_delayq.get("order:7:close") is None, "written before commit"
    assert shop_delayq.get("order:7:close").key == "order:7"
    row.refresh_from_db()
    assert row.stored is True
    assert abs((row.due - result.eta).total_seconds()) < 1


def test_arguments_kombu_decodes_to_objects_are_scheduled_in_a_transaction_as_outside(
        shop_delayq, fast_shop):
    """A Decimal, datetime or UUID argument: the row shows its text, as the sync's does."""
    from shop.tasks import close_unpaid_order

    due = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with transaction.atomic():
        close_unpaid_order.apply_delayed(args=([Decimal("9.99"), due, UUID(int=7)],),
                                         delay=600, job_id="order:8:close")
    row = Row.objects.get(job_id="order:8:close")
    assert row.stored is True
    assert row.args == [["9.99", str(due), str(UUID(int=7))]]
    assert shop_delayq.get("order:8:close").args == [[Decimal("9.99"), due, UUID(int=7)]]


def test_rolled_back_order_schedules_nothing(shop_delayq, fast_shop):
    from shop import services
    from shop.models import Order

    with pytest.raises(RuntimeError), transaction.atomic():
        order = services.place_order("Rollback", "1.00")
        raise RuntimeError("payment form failed")
    assert not Order.objects.exists()
    assert not Row.objects.exists()
    assert shop_delayq.get(f"order:{order.pk}:close") is None
    assert shop_delayq.pending() == []


def test_apply_delayed_outside_a_transaction_goes_straight_to_redis(shop_delayq):
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=(8,), delay=600, job_id="order:8:close")
    assert shop_delayq.get("order:8:close") is not None
    assert not Row.objects.exists(), "the row comes from the journal (delayq_sync)"


def test_redis_down_at_commit_leaves_the_row_unstored_until_reconcile_pushes_it(lone_store):
    server, delayq, remind = lone_store
    server.stop()
    with transaction.atomic():
        remind.apply_delayed(args=(1,), delay=60, key="customer:1", job_id="remind:1")
    row = Row.objects.get(job_id="remind:1")
    assert row.stored is False and "unavailable" in row.store_error
    assert row.events.filter(event="store write failed").exists()

    report = reconcile(delayq)
    assert report.pushed == [] and "remind:1" in report.failed  # Redis still down

    server.start()
    report = reconcile(delayq)
    assert report.pushed == ["remind:1"]
    job = delayq.get("remind:1")
    assert job is not None and job.args == [1] and job.key == "customer:1"
    assert abs((job.due - row.due).total_seconds()) < 0.01, "kept its committed due time"
    row.refresh_from_db()
    assert row.stored is True and row.store_error == ""
    assert reconcile(delayq).pushed == [], "nothing left to push"


def test_reconcile_stops_at_the_first_row_redis_is_unavailable_for(lone_store):
    server, delayq, remind = lone_store
    server.stop()
    with transaction.atomic():
        for n in range(3):
            remind.apply_delayed(args=(n,), delay=60, job_id=f"remind:{n}")

    report = reconcile(delayq)
    tried = [error for error in report.failed.values() if not error.startswith("not tried")]
    assert len(report.failed) == 3 and len(tried) == 1, report.failed
    assert "unavailable" in tried[0]
    assert all(error == f"not tried: {tried[0]}" for error in report.failed.values()
               if error not in tried)


def test_a_store_refusing_writes_at_commit_leaves_every_row_unstored_never_raises(
        lone_store):
    """The store's Redis became a read-only replica (a failover demoted it): the commit
    stands, no on-commit write raises (one that raised kept the later ones from running
    and failed the request after its commit), each row records why, reconcile pushes them."""
    server, delayq, remind = lone_store
    admin = redis.Redis(port=server.port)
    admin.replicaof("127.0.0.1", 1)
    with transaction.atomic():
        for n in (1, 2):
            remind.apply_delayed(args=(n,), delay=60, job_id=f"remind:{n}")
    rows = Row.objects.order_by("job_id")
    assert [(row.stored, "read-only replica" in row.store_error) for row in rows] == [
        (False, True), (False, True)]
    admin.replicaof("no", "one")
    assert sorted(reconcile(delayq).pushed) == ["remind:1", "remind:2"]
    admin.close()


@pytest.fixture
def rows_refusing_stored():
    """The database refuses to mark a row stored (a trigger raises, as a locked or failing
    database would): a real DatabaseError from the row update after the Redis write."""
    from django.db import connection

    table = Row._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE TRIGGER refuse_stored BEFORE UPDATE ON "{table}" '
                       "WHEN NEW.stored = 1 BEGIN SELECT RAISE(ABORT, 'database is locked'); "
                       "END")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER refuse_stored")


def test_a_database_error_after_the_redis_write_at_commit_is_logged_not_raised(
        shop_delayq, fast_shop, rows_refusing_stored, caplog):
    """Raised, it reached the view after its commit and the later on-commit callbacks (the
    confirmation e-mail) never ran."""
    from shop.tasks import close_unpaid_order

    later = []
    with caplog.at_level(logging.WARNING, logger="celery_delayq"), transaction.atomic():
        close_unpaid_order.apply_delayed(args=(7,), delay=600, job_id="order:7:close")
        transaction.on_commit(lambda: later.append("e-mail"))

    assert later == ["e-mail"]
    assert shop_delayq.get("order:7:close") is not None  # in Redis
    assert "database is locked" in caplog.text and "order:7:close" in caplog.text


def test_reconcile_missing_restores_pending_jobs_after_redis_lost_its_data(lone_store):
    _server, delayq, remind = lone_store
    for n in range(3):
        remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")
    assert delayq.cancel("remind:2") is True
    JournalSync(delayq).run_once()
    assert Row.objects.pending().count() == 2

    delayq.store.client.flushdb()  # Redis lost everything, journal included

    assert sorted(mark_missing(delayq).marked) == ["remind:0", "remind:1"]
    assert sorted(reconcile(delayq).pushed) == ["remind:0", "remind:1"]
    assert sorted(job.args for job in delayq.pending()) == [[0], [1]]
    assert delayq.get("remind:2") is None, "a cancelled job stays cancelled"


@pytest.mark.parametrize("after", ["nothing", "new jobs"])
def test_reconcile_missing_leaves_alone_rows_whose_later_events_the_journal_lost(
        lone_store, after, caplog):
    """The sync was stopped while the journal was trimmed past it (delayq_journal_maxlen):
    a job cancelled (or run) meanwhile looks lost from Redis. Pushing it again would run a
    cancelled order timeout, or a refund check twice: it is left alone and reported."""
    _server, delayq, remind = lone_store
    for n in range(3):
        remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")
    JournalSync(delayq).run_once()
    assert delayq.cancel("remind:0") is True  # the event the mirror will never see
    for shard in delayq.store.keys:  # as a small delayq_journal_maxlen trims it
        delayq.store.client.xtrim(shard.journal, maxlen=0)
    if after == "new jobs":  # entries after the gap on every shard
        for n in range(3, 40):
            remind.apply_delayed(args=(n,), delay=600, job_id=f"remind:{n}")

    with caplog.at_level(logging.ERROR, logger="celery_delayq.contrib.django.sync"):
        found = mark_missing(delayq)

    assert (found.marked, found.unknown) == ([], ["remind:0"])
    assert "trimmed past" in caplog.text and "delayq_journal_maxlen" in caplog.text
    report = reconcile(delayq, missing=True)
    assert (report.pushed, report.unknown) == ([], ["remind:0"])
    assert delayq.get("remind:0") is None, "a cancelled job stays cancelled"
    # the operator who knows Redis lost them asks for them
    assert reconcile(delayq, missing=True, include_unknown=True).pushed == ["remind:0"]


def test_reconcile_missing_leaves_alone_a_moved_job_whose_new_shard_lost_events(lone_store):
    """A job replaced under a key of another shard, then run there: that shard's journal
    lost the events (trimmed), so the row still shows its old key. The job may be on any
    shard: pushing it again would run it twice."""
    _server, delayq, remind = lone_store
    store = delayq.store
    by_shard = {store.keys.shard_for("", f"remind:{n}").shard: f"remind:{n}"
                for n in range(100)}
    first, moved = by_shard[min(by_shard)], by_shard[max(by_shard)]
    remind.apply_delayed(args=(1,), delay=600, job_id="job", key=first)
    remind.apply_delayed(args=(2,), delay=600, key=moved)  # the new shard's cursor
    JournalSync(delayq).run_once()
    remind.apply_delayed(args=(1,), delay=0, job_id="job", key=moved, if_exists="replace")
    for claim in store.claim([store.keys.shard_for("", moved)], 10, 60_000):  # run there
        store.ack({claim.shard: [Promoted(job.job_id, remind.name, moved, job.due_ms or 0,
                                          job.stored_id, job.lease) for job in claim.jobs]})
    store.client.xtrim(store.keys.shard_for("", moved).journal, maxlen=0)

    found = mark_missing(delayq)

    assert (found.marked, found.unknown) == ([], ["job"])
    assert delayq.get("job") is None, "run once, not pushed again"


def test_a_journal_trimmed_past_the_sync_between_two_of_its_batches_is_noted(
        lone_store, monkeypatch, caplog):
    """Producers trim the journal past the sync's position while a pass catches up (a small
    delayq_journal_maxlen): the loss is logged and noted before the next batch is applied,
    as at the start of a pass, so a job cancelled in the gap is not pushed again."""
    _server, delayq, remind = lone_store
    store = delayq.store
    shard = store.keys.shard(0)
    jobs = [f"remind:{n}" for n in range(300) if store.keys.shard_for(f"remind:{n}") == shard]
    for job_id in jobs[:20]:
        remind.apply_delayed(args=(1,), delay=600, job_id=job_id)
    read, producers = store.read_journal, []

    def read_then_trim(keys, *args, **kwargs):  # after the shard's first batch
        entries = read(keys, *args, **kwargs)
        if keys == shard and not producers:
            producers.append(delayq.cancel(jobs[5]))  # a job that batch mirrored
            for job_id in jobs[20:30]:
                remind.apply_delayed(args=(1,), delay=600, job_id=job_id)
            store.client.xtrim(shard.journal, maxlen=5, approximate=False)
        return entries

    monkeypatch.setattr(store, "read_journal", read_then_trim)
    sync = JournalSync(delayq, batch=10)
    with caplog.at_level(logging.ERROR, logger="celery_delayq.contrib.django.sync"):
        sync.run_once()
        assert sync.run_once() == 0

    assert producers == [True]
    assert caplog.text.count("trimmed past") == 1
    cursor = JournalCursor.objects.get(shard=0)
    assert cursor.lost_until == store.client.xrange(shard.journal)[0][0]
    assert cursor.last_id == store.client.xrevrange(shard.journal, count=1)[0][0]
    report = reconcile(delayq, missing=True)
    assert (report.pushed, report.unknown) == ([], [jobs[5]])
    assert delayq.get(jobs[5]) is None, "a cancelled job stays cancelled"


def test_delayq_reconcile_command_pushes_unstored_rows(shop_delayq, capsys):
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=(9,), delay=600, job_id="order:9:close")
    JournalSync(shop_delayq).run_once()
    shop_delayq.store.client.delete(*shop_delayq.store.client.keys("delayq:*"))
    Row.objects.filter(job_id="order:9:close").update(stored=False)

    call_command("delayq_reconcile")
    assert "pushed 1 delayed tasks" in capsys.readouterr().out
    assert shop_delayq.get("order:9:close").args == [9]


def test_delayq_reconcile_command_names_the_rows_it_left_alone(shop_delayq, capsys):
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=(5,), delay=600, job_id="order:5:close")
    JournalSync(shop_delayq).run_once()
    shop_delayq.cancel("order:5:close")
    for shard in shop_delayq.store.keys:
        shop_delayq.store.client.xtrim(shard.journal, maxlen=0)

    call_command("delayq_reconcile", "--missing")
    out, err = capsys.readouterr()
    assert "pushed 0 delayed tasks" in out
    assert "left alone 1 pending rows" in err and "order:5:close" in err
    assert "--include-unknown" in err
    with pytest.raises(CommandError, match="goes with --missing"):
        call_command("delayq_reconcile", "--include-unknown")


def test_retry_raised_inside_atomic_is_still_scheduled(shop_delayq):
    from shop.tasks import close_unpaid_order

    with pytest.raises(RuntimeError), transaction.atomic():
        close_unpaid_order.apply_async((10,), countdown=60, task_id="retry-10", retries=1)
        raise RuntimeError("what self.retry() raises rolls the block back")
    assert shop_delayq.get("retry-10") is not None


def _schedule_in_a_transaction(task, n: int, **options):
    with transaction.atomic():
        return task.apply_delayed(args=(n,), delay=600, key="order:42",
                                  job_id="order:42:close", **options)


def test_in_a_transaction_a_job_redis_holds_is_kept_or_refused_as_outside(shop_delayq):
    from shop.tasks import close_unpaid_order

    first = _schedule_in_a_transaction(close_unpaid_order, 1)
    kept = _schedule_in_a_transaction(close_unpaid_order, 2)
    with pytest.raises(JobExists):
        _schedule_in_a_transaction(close_unpaid_order, 3, if_exists="error")

    assert kept.id == first.id
    assert shop_delayq.get("order:42:close").args == [1]


@pytest.mark.parametrize("if_exists", ["keep", "error"])
def test_in_a_transaction_a_job_gone_from_redis_is_scheduled_though_the_mirror_lags(
        shop_delayq, if_exists):
    """Cancelled in Redis (an order paid) before delayq_sync applied it: the row still says
    scheduled, and the call, trusting it, wrote nothing (or raised JobExists)."""
    from shop.tasks import close_unpaid_order

    _schedule_in_a_transaction(close_unpaid_order, 1)
    shop_delayq.cancel_key("order:42", by="order paid")
    assert Row.objects.get(job_id="order:42:close").state == "scheduled"  # not synced yet

    again = _schedule_in_a_transaction(close_unpaid_order, 2, if_exists=if_exists)

    job = shop_delayq.get("order:42:close")
    assert (job.args, job.task_id) == ([2], again.id)


def test_the_result_of_a_call_kept_at_commit_cancels_the_job_redis_kept(shop_delayq):
    """The store kept an earlier call (another task id) at commit: the handle the call
    returned still cancels the job."""
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=(1,), delay=600, job_id="order:42:close")
    result = _schedule_in_a_transaction(close_unpaid_order, 2)  # no row yet: not synced

    assert result.cancel() is True
    assert shop_delayq.get("order:42:close") is None


def test_a_call_kept_at_commit_takes_the_task_id_of_the_job_redis_kept(shop_delayq, sync):
    """The kept call's own scheduled event trimmed from the journal before delayq_sync read
    it: the row, written with the new call's task id, still follows the kept job's run."""
    from shop.tasks import close_unpaid_order

    earlier = close_unpaid_order.apply_delayed(args=(1,), delay=600, job_id="order:42:close")
    for shard in shop_delayq.store.keys:
        shop_delayq.store.client.xtrim(shard.journal, maxlen=0)
    _schedule_in_a_transaction(close_unpaid_order, 2)  # kept at commit

    assert Row.objects.get(job_id="order:42:close").task_id == earlier.id
    journal_run(shop_delayq, "order:42:close", ("promoted", {}), ("started", {}),
                ("succeeded", {}))
    sync.run_once()
    assert Row.objects.get(job_id="order:42:close").state == "succeeded"


def test_a_call_in_a_transaction_over_a_cancelled_row_shows_none_of_that_cancel(
        shop_delayq, sync):
    from shop.tasks import close_unpaid_order

    _schedule_in_a_transaction(close_unpaid_order, 1)
    shop_delayq.cancel_key("order:42", by="order paid")
    sync.run_once()
    assert Row.objects.get(job_id="order:42:close").state == "cancelled"

    _schedule_in_a_transaction(close_unpaid_order, 2)  # before the sync sees it

    row = Row.objects.get(job_id="order:42:close")
    assert (row.state, row.args, row.cancelled_at, row.cancelled_by) == (
        "scheduled", [2], None, "")
