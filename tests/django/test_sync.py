"""delayq_sync: the database mirror follows the store's journal, in batches, resumably."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management import call_command

from celery_delayq.contrib.django.models import DelayedTask, JournalCursor
from celery_delayq.contrib.django.sync import JournalSync
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_sync_mirrors_tasks_scheduled_outside_django_with_their_arguments(shop_delayq, sync):
    shop_delayq.schedule("spark.rebuild_report", args=("2024-05",), kwargs={"full": True},
                         delay=3600, key="report:may", job_id="report:may")
    assert sync.run_once() == 1
    row = DelayedTask.objects.get(job_id="report:may")
    assert (row.task, row.key, row.state, row.queue) == (
        "spark.rebuild_report", "report:may", "scheduled", "celery")
    assert (row.args, row.kwargs) == (["2024-05"], {"full": True})
    assert row.envelope and row.stored


def test_sync_resumes_after_a_restart_without_applying_an_event_twice(shop_delayq):
    for n in range(5):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=600,
                             job_id=f"order:{n}:close", key=f"order:{n}")
    assert JournalSync(shop_delayq, batch=2).run_once() == 5
    shop_delayq.cancel_key("order:1", by="support: customer called")
    shop_delayq.reschedule("order:2:close", delay=1200)

    restarted = JournalSync(shop_delayq, batch=2)  # a new process: only the cursors remain
    assert restarted.run_once() == 2
    assert restarted.run_once() == 0
    assert DelayedTask.objects.count() == 5
    cancelled = DelayedTask.objects.get(job_id="order:1:close")
    assert (cancelled.state, cancelled.cancelled_by) == ("cancelled", "support: customer called")
    assert list(cancelled.events.values_list("event", flat=True)) == ["scheduled", "cancelled"]
    assert DelayedTask.objects.get(job_id="order:2:close").events.count() == 2
    assert JournalCursor.objects.filter(prefix="delayq").count() == shop_delayq.store.keys.shards


def test_running_sync_mirrors_new_tasks_within_a_second(shop_delayq):
    sync = JournalSync(shop_delayq)
    thread = threading.Thread(target=sync.run, kwargs={"interval": 0.1}, daemon=True)
    thread.start()
    try:
        lags = []
        for n in range(5):
            started = time.monotonic()
            shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=600,
                                 job_id=f"lag:{n}")
            wait_for(lambda n=n: DelayedTask.objects.filter(job_id=f"lag:{n}").exists(),
                     timeout=5, interval=0.01, what="row mirrored")
            lags.append(time.monotonic() - started)
        assert max(lags) < 1.0, lags
        assert sync.lag() < 1.0
    finally:
        sync.stop()
        thread.join(5)


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive local times"])
def test_sync_follows_a_task_through_promotion_to_success(
        shop_delayq, shop_worker, shop_carrier, sync, settings, use_tz):
    from shop.tasks import close_unpaid_order

    settings.USE_TZ, settings.TIME_ZONE = use_tz, "UTC" if use_tz else "Asia/Kolkata"

    close_unpaid_order.apply_delayed(args=(404,), delay=0.1, job_id="order:404:close")
    wait_for(lambda: sync.run_once() >= 0 and DelayedTask.objects.filter(
        job_id="order:404:close", state="succeeded").exists(), what="succeeded")
    row = DelayedTask.objects.get(job_id="order:404:close")
    assert row.scheduled_at <= row.promoted_at and row.started_at <= row.finished_at
    assert row.due <= row.started_at
    assert row.task_id and row.retries == 0


def test_promoted_event_after_the_start_does_not_move_the_state_back(shop_delayq, sync):
    """A carrier acks (journals "promoted") after publishing, so a fast worker's
    "started" can come first."""
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(5,), delay=0,
                         job_id="order:5:close")
    shard = shop_delayq.store.keys.shard_for("order:5:close")
    job = shop_delayq.get("order:5:close")
    shop_delayq.store.journal(shard.shard, "started", {"job": "order:5:close",
                                                       "task_id": job.task_id, "retries": 0})
    due_ms = round(job.due.timestamp() * 1000)
    shop_delayq.store.client.xadd(shard.journal, {"event": "promoted", "job": "order:5:close",
                                                  "due": due_ms})
    sync.run_once()
    assert DelayedTask.objects.get(job_id="order:5:close").state == "started"


def test_a_run_that_raised_ignore_ends_its_row_as_ignored(shop_delayq, sync):
    """Celery's ``Ignore``: the worker acknowledged the message, recording no outcome."""
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(6,), delay=0,
                         job_id="order:6:close")
    shard = shop_delayq.store.keys.shard_for("order:6:close").shard
    for event in ("started", "ignored"):
        shop_delayq.store.journal(shard, event, {"job": "order:6:close", "retries": 0})
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:6:close")
    assert (row.state, row.finished_at is not None) == ("ignored", True)


def test_delayq_sync_once_command_applies_the_journal_and_exits(shop_delayq, capsys):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600)
    call_command("delayq_sync", "--once")
    assert "applied 1 journal events" in capsys.readouterr().out
    assert DelayedTask.objects.count() == 1


def test_a_dropped_dead_letter_shows_as_cancelled_by_whoever_dropped_it(shop_delayq, sync):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=0,
                         job_id="order:1:close")
    store = shop_delayq.store
    for claim in store.claim(list(store.keys), 100, 60_000):
        for job in claim.jobs:
            store.dead_letter(claim.shard, job, "unknown queue: gone")
    sync.run_once()
    assert DelayedTask.objects.get(job_id="order:1:close").state == "dead"

    assert store.drop("order:1:close", by="cli:ops: dropped dead letter")
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:1:close")
    assert (row.state, row.cancelled_by) == ("cancelled", "cli:ops: dropped dead letter")


def test_dropping_a_dead_letter_leaves_the_row_of_a_live_job_with_its_id_pending(
        shop_delayq, sync):
    """A job scheduled again under a dead letter's id is live: dropping the old letter
    afterwards gives up the letter, not the job the row now shows."""
    keys, store = shop_delayq.store.keys, shop_delayq.store
    old, key = [k for k in (f"order:{n}" for n in range(100))  # one shard: events in order
                if keys.shard_for("", k) is keys.shard_for("order:1:close")][:2]
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=0,
                         job_id="order:1:close", key=old)
    for claim in store.claim(list(keys), 100, 60_000):
        for job in claim.jobs:
            store.dead_letter(claim.shard, job, "unknown queue: gone")
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                         job_id="order:1:close", key=key)
    sync.run_once()
    assert DelayedTask.objects.get(job_id="order:1:close").state == "scheduled"

    assert store.drop("order:1:close", by="cli:ops: dropped dead letter")
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:1:close")
    assert (row.state, row.cancelled_at, row.key) == ("scheduled", None, key)
    assert row.events.order_by("at", "pk").last().detail == (
        "by: cli:ops: dropped dead letter; from: dead")


def test_a_dead_letter_dropped_after_its_id_was_scheduled_on_a_later_shard_leaves_it_pending(
        shop_delayq, sync):
    """One pass reads the letter's shard first: its death and the drop, then the later
    shard's new job, scheduled between the two. The drop says nothing of that job."""
    keys, store = shop_delayq.store.keys, shop_delayq.store
    by_shard = {keys.shard_for("", f"order:{n}").shard: f"order:{n}" for n in range(100)}
    dead_key, live_key = by_shard[min(by_shard)], by_shard[max(by_shard)]
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=0,
                         job_id="order:1:close", key=dead_key)
    for claim in store.claim(list(keys), 100, 60_000):
        for job in claim.jobs:
            store.dead_letter(claim.shard, job, "unknown queue: gone")
    time.sleep(0.002)  # later milliseconds, as on any Redis but a local one
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                         job_id="order:1:close", key=live_key)
    time.sleep(0.002)
    assert store.drop("order:1:close", by="cli:ops: dropped dead letter")

    sync.run_once()

    row = DelayedTask.objects.get(job_id="order:1:close")
    assert (row.state, row.key) == ("scheduled", live_key)


@pytest.mark.parametrize("onto", ["an earlier shard", "a later shard"])
def test_a_job_replaced_onto_another_shard_keeps_its_new_due_time_and_key(
        shop_delayq, sync, monkeypatch, onto):
    """The sync reads shard after shard: the newer events of a job moved to another key's
    shard can come before the older ones of its first shard, or after its old shard's
    ``moved`` (a round trip later, on a remote Redis); neither changes the row."""
    store = shop_delayq.store
    by_shard = {store.keys.shard_for("", f"order:{n}").shard: f"order:{n}" for n in range(100)}
    low, high = by_shard[min(by_shard)], by_shard[max(by_shard)]
    first, moved = (high, low) if onto == "an earlier shard" else (low, high)
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                         job_id="order:1:close", key=first)
    time.sleep(0.002)  # a later millisecond: two shards' events of one are not ordered
    leave = type(store)._cancel  # the old shard's "moved": a round trip after the new write

    def later(*args, **kwargs):
        time.sleep(0.003)
        return leave(*args, **kwargs)

    monkeypatch.setattr(type(store), "_cancel", later)
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(2,), delay=1200,
                         job_id="order:1:close", key=moved, if_exists="replace")
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:1:close")
    job = shop_delayq.get("order:1:close")
    assert (row.key, row.due, row.args, row.state) == (moved, job.due, [2], "scheduled")
    assert len(row.events.all()) == 3  # both schedules and the move, in the history


def test_backfill_mirrors_pending_jobs_whose_events_the_journal_no_longer_holds(
        shop_delayq, sync, caplog):
    """Jobs scheduled before the app was installed, or whose scheduled event was trimmed
    before the sync read it, have no row: the admin would say nothing is pending for them."""
    for n in range(7):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=600 + n,
                             key=f"order:{n}", job_id=f"order:{n}:close")
    sync.run_once()
    shop_delayq.cancel("order:0:close")
    for n in range(7, 12):  # scheduled, then their events trimmed unread
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=600 + n,
                             key=f"order:{n}", job_id=f"order:{n}:close")
    shop_delayq.run_now("order:1:close")  # the mirror still says due in 10 minutes
    for shard in shop_delayq.store.keys:
        shop_delayq.store.client.xtrim(shard.journal, maxlen=0)
    sync.run_once()
    assert DelayedTask.objects.count() == 7

    assert sync.backfill() == 6  # 5 rows made, 1 due time corrected
    rows = {row.job_id: row for row in DelayedTask.objects.all()}
    assert len(rows) == 12
    new = rows["order:9:close"]
    assert (new.state, new.task, new.key, new.args, new.stored) == (
        "scheduled", "shop.tasks.close_unpaid_order", "order:9", [9], True)
    assert new.envelope and abs((new.due - shop_delayq.get("order:9:close").due)
                                .total_seconds()) < 0.002
    assert abs((rows["order:1:close"].due - shop_delayq.get("order:1:close").due)
               .total_seconds()) < 0.002
    # the cancel the mirror never saw: the store does not hold it, backfill leaves it be
    assert rows["order:0:close"].state == "scheduled"
    assert sync.backfill() == 0


def test_delayq_sync_backfill_command_says_what_it_mirrored(shop_delayq, capsys):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                         job_id="order:1:close")
    for shard in shop_delayq.store.keys:
        shop_delayq.store.client.xtrim(shard.journal, maxlen=0)
    call_command("delayq_sync", "--once", "--backfill")
    assert "backfilled 1 rows from the store" in capsys.readouterr().out
    assert DelayedTask.objects.get(job_id="order:1:close").args == [1]


def journal_run(delayq, job_id: str, *events: tuple[str, dict]) -> None:
    """Journal ``events`` (name, fields) of the run of ``job_id``, stored and due now, as a
    carrier and a worker would: each with the job id, its task id and due time."""
    job = delayq.get(job_id)
    shard = delayq.store.keys.shard_for(job_id).shard
    run = {"job": job_id, "task": job.task, "task_id": job.task_id, "retries": 0,
           "due": round(job.due.timestamp() * 1000)}
    for event, fields in events:
        delayq.store.journal(shard, event, {**run, **fields})


@pytest.mark.parametrize(("run", "reason"), [
    (["promoted"], "revoked"),  # revoked while it waited in the broker
    ([], "expired"),  # discarded at receipt, before the carrier's ack was journaled
    (["promoted", "started"], "terminated"),
])
def test_a_run_a_worker_revoked_ends_its_row_cancelled_by_the_worker(
        shop_delayq, sync, run, reason):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(7,), delay=0,
                         job_id="order:7:close")
    events = [(event, {}) for event in run] + [("revoked", {"reason": reason})]
    if not run:  # the ack comes after the discard
        events.append(("promoted", {}))
    journal_run(shop_delayq, "order:7:close", *events)
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:7:close")
    assert (row.state, row.cancelled_by) == ("cancelled", f"worker: {reason}")
    assert row.cancelled_at is not None and row.finished_at is None
    assert list(row.events.filter(event="revoked").values_list("detail", flat=True)) == [
        f"reason: {reason}; task_id: {row.task_id}; retries: 0"]


def test_a_revoked_event_leaves_a_row_whose_run_had_ended_or_that_is_due_again_as_it_is(
        shop_delayq, sync):
    """A copy of a run that succeeded (a duplicate) revoked afterwards, and a revoke of a
    run whose job was scheduled again since for another due time, move nothing."""
    for n in (8, 9):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=0,
                             job_id=f"order:{n}:close")
    journal_run(shop_delayq, "order:8:close", ("promoted", {}), ("started", {}),
                ("succeeded", {}), ("revoked", {"reason": "revoked"}))
    journal_run(shop_delayq, "order:9:close", ("promoted", {}))
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(9,), delay=600,
                         job_id="order:9:close", if_exists="replace")
    shard = shop_delayq.store.keys.shard_for("order:9:close").shard
    shop_delayq.store.journal(shard, "revoked", {"job": "order:9:close", "reason": "revoked",
                                                 "due": int(time.time() * 1000)})
    sync.run_once()
    rows = {row.job_id: row for row in DelayedTask.objects.all()}
    assert rows["order:8:close"].state == "succeeded"
    assert (rows["order:9:close"].state, rows["order:9:close"].cancelled_at) == (
        "scheduled", None)


def test_a_job_scheduled_again_under_the_id_of_a_finished_one_shows_none_of_its_ending(
        shop_delayq, sync):
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(7,), delay=600,
                         job_id="order:7:close")
    shop_delayq.cancel_outcome("order:7:close", by="support: customer called")
    sync.run_once()
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(8,), delay=600,
                         job_id="order:7:close")
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:7:close")
    assert (row.state, row.args) == ("scheduled", [8])
    assert (row.cancelled_at, row.cancelled_by, row.finished_at, row.reason) == (
        None, "", None, "")


@pytest.mark.parametrize("earlier_sync", [False, True])
def test_the_run_of_an_earlier_call_of_a_job_id_leaves_the_later_calls_row_pending(
        shop_delayq, sync, earlier_sync):
    """A job replaced (a new task id) while its earlier copy was in the broker: that copy's
    run ended the row, though the later call waits in the store, where the admin's cancel
    and ``delayq_reconcile --missing`` no longer looked for it. A message forged with the
    job's ``delayq_job`` header did the same."""
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(9,), delay=0,
                         job_id="order:9:close")
    journal_run(shop_delayq, "order:9:close", ("promoted", {}))
    if earlier_sync:
        sync.run_once()
    earlier = shop_delayq.get("order:9:close")
    run = {"task_id": earlier.task_id, "due": round(earlier.due.timestamp() * 1000)}
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(10,), delay=600,
                         job_id="order:9:close", if_exists="replace")
    later = shop_delayq.get("order:9:close")
    forged = {"task_id": "forged", "due": ""}  # a plain message: no delayq_due header
    journal_run(shop_delayq, "order:9:close", ("started", run), ("succeeded", run),
                ("started", forged), ("failed", forged))
    sync.run_once()
    row = DelayedTask.objects.get(job_id="order:9:close")
    assert (row.state, row.task_id, row.args) == ("scheduled", later.task_id, [10])
    assert (row.started_at, row.finished_at) == (None, None)
    assert list(row.events.filter(event="started").values_list("detail", flat=True)) == [
        f"task_id: {earlier.task_id}; retries: 0", "task_id: forged; retries: 0"]  # history

    journal_run(shop_delayq, "order:9:close", ("promoted", {}), ("started", {}),
                ("succeeded", {}))  # the later call's own run
    sync.run_once()
    assert DelayedTask.objects.get(job_id="order:9:close").state == "succeeded"


def test_a_job_id_called_again_and_run_before_the_sync_read_its_call_ends_its_row(
        shop_delayq, sync):
    """A daily job id: each call a new task id. The second ran, and its envelope left the
    store, before delayq_sync read its scheduled event: the row keeps the first call's task
    id, and the run, for the row's due time, is still the row's."""
    shard = shop_delayq.store.keys.shard_for("daily")
    for day in (1, 2):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(day,), delay=0,
                             job_id="daily")
        journal_run(shop_delayq, "daily", ("promoted", {}), ("started", {}),
                    ("succeeded", {}))
        shop_delayq.store.client.hdel(shard.jobs, "daily")  # as the carrier's ack
        sync.run_once()
        assert DelayedTask.objects.get(job_id="daily").state == "succeeded", day
