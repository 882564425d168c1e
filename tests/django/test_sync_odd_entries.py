"""delayq_sync on odd journal entries: each is skipped, counted and logged once per run,
and every healthy entry around it is mirrored."""

from __future__ import annotations

import contextlib
import logging

import pytest
from django.core.management import call_command
from django.db import connection

from celery_delayq.contrib.django.models import DelayedTask, DelayedTaskEvent, JournalCursor
from celery_delayq.contrib.django.sync import JournalSync
from celery_delayq.contrib.django.sync import logger as sync_logger
from celery_delayq.reading import MAX_MS, MIN_MS

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "shop.tasks.close_unpaid_order"
#: Journal entries no carrier or producer writes: each is skipped.
ODD_ENTRIES = [
    {"event": "scheduled", "job": "odd:abc", "task": TASK, "due": "abc"},
    {"event": "scheduled", "job": "odd:1e30", "task": TASK, "due": "1e30"},
    {"event": "rescheduled", "job": "odd:inf", "task": TASK, "due": "inf"},
    {"event": "scheduled", "job": "odd:nan", "task": TASK, "due": "nan"},
    {"event": "scheduled", "job": b"odd:\xff", "task": TASK, "due": "1"},
    {"event": "scheduled", "job": "odd:task", "task": b"close\xff", "due": "1"},
    {"event": "cancelled", "job": "odd:by", "task": TASK, "by": b"support\xfe"},
    {"event": "scheduled", "job": "odd:nul", "task": TASK, "key": "order:\x00"},
    {"event": "scheduled", "job": "odd:" + "x" * 300, "task": TASK},
    {"event": "started", "job": "odd:retries", "retries": "99999999999999999999"},
    {"event": "scheduled", "job": "~!!", "task": TASK},
    # Times a datetime holds in UTC, but not in every time zone (within a day of year 1 or
    # 9999): the admin could not show them there.
    {"event": "scheduled", "job": "odd:9999", "task": TASK, "due": str(MAX_MS)},
    {"event": "rescheduled", "job": "odd:year1", "task": TASK, "due": str(MIN_MS + 1)},
]
#: Envelopes that cannot be decoded or mirrored, behind readable "scheduled" entries: the
#: row is mirrored from the entry, without arguments.
ODD_ENVELOPES = {
    "odd:deep": f'{{"t":"{TASK}"}}\n' + "[" * 1000 + "]" * 1000 + "\n",
    "odd:utf8": f'{{"t":"{TASK}"}}\n["'.encode() + b"\xff" + b'"]\n',
    "odd:types": f'{{"t":"{TASK}","q":["x"]}}\n\n',
    # Python's json reads them, but no database's JSON takes NaN or Infinity, and
    # PostgreSQL's takes no NUL or lone surrogate (nor its text columns a NUL).
    "odd:nan-arg": f'{{"t":"{TASK}"}}\n[NaN]\n',
    "odd:inf-argsrepr": f'{{"t":"{TASK}","o":{{"argsrepr":Infinity}}}}\n[1]\n',
    "odd:nul-kwarg": f'{{"t":"{TASK}"}}\n\n{{"note\\u0000":1}}\n',
    "odd:lone-surrogate": f'{{"t":"{TASK}"}}\n["\\ud800"]\n',
    "odd:nul-queue": f'{{"t":"{TASK}","q":"orders\\u0000"}}\n[1]\n',
}


@pytest.fixture
def odd_journal(shop_delayq, shop_redis):
    """32 healthy jobs over every shard, each shard's journal salted with the odd entries
    above, and on shard 0 (last) an entry whose id is after the year 9999."""
    shop_delayq.schedule_many(TASK, [
        {"job_id": f"order:{n}:close", "delay": 600, "args": [n], "key": f"order:{n}"}
        for n in range(16)])
    for shard in shop_delayq.store.keys:
        for fields in ODD_ENTRIES:
            shop_redis.xadd(shard.journal, fields)
        for job_id, envelope in ODD_ENVELOPES.items():
            stored = f"{job_id}@{shard.shard}"
            shop_redis.hset(shard.jobs, stored, envelope)
            shop_redis.zadd(shard.due, {stored: 1})
            shop_redis.xadd(shard.journal, {"event": "scheduled", "job": stored, "task": TASK,
                                            "due": "1"})
    shop_delayq.schedule_many(TASK, [
        {"job_id": f"order:{n}:close", "delay": 600, "args": [n], "key": f"order:{n}"}
        for n in range(16, 32)])
    shop_redis.xadd(shop_delayq.store.keys.shard(0).journal,
                    {"event": "cancelled", "job": "order:0:close"}, id="18446744073709551614-0")
    shards = shop_delayq.store.keys.shards
    return {"skipped": len(ODD_ENTRIES) * shards + 1,
            "envelopes": len(ODD_ENVELOPES) * shards}


def _healthy_rows() -> list[tuple]:
    return sorted(DelayedTask.objects.filter(job_id__startswith="order:").values_list(
        "job_id", "args", "state", "key"))


def test_sync_mirrors_every_healthy_job_and_logs_odd_entries_once(
        shop_delayq, odd_journal, caplog):
    caplog.set_level(logging.WARNING)
    sync = JournalSync(shop_delayq, batch=7)

    sync.run_once()

    assert _healthy_rows() == sorted(
        (f"order:{n}:close", [n], "scheduled", f"order:{n}") for n in range(32))
    odd_rows = DelayedTask.objects.exclude(job_id__startswith="order:")
    assert sorted(odd_rows.values_list("job_id", flat=True)) == sorted(
        f"{job_id}@{shard.shard}" for job_id in ODD_ENVELOPES for shard in shop_delayq.store.keys)
    assert all((row.args, row.task, row.state) == ([], TASK, "scheduled") for row in odd_rows)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("celery_delayq")]
    assert len(warnings) == 1
    assert f"{odd_journal['skipped'] + odd_journal['envelopes']} unreadable" in warnings[0]
    ends = {shard.shard: shop_delayq.store.client.xrevrange(shard.journal, count=1)[0][0]
            for shard in shop_delayq.store.keys}
    assert dict(JournalCursor.objects.values_list("shard", "last_id")) == ends
    assert sync.run_once() == 0
    assert DelayedTaskEvent.objects.filter(delayed_task__job_id="order:0:close").count() == 1


def test_delayq_sync_command_starts_on_a_journal_with_odd_entries(odd_journal, capsys):
    call_command("delayq_sync", "--once")
    assert "applied" in capsys.readouterr().out
    assert len(_healthy_rows()) == 32


def test_a_damaged_journal_key_stops_only_its_shard(shop_delayq, caplog):
    """One shard's journal key holds a string (written by hand, or another program): the
    other shards are mirrored, and the error names the key, once per run."""
    for n in range(12):
        shop_delayq.schedule(TASK, args=(n,), delay=600, job_id=f"order:{n}:close")
    damaged = shop_delayq.store.keys.shard_for("order:0:close")
    client = shop_delayq.store.client
    client.delete(damaged.journal)
    client.set(damaged.journal, "not a stream")
    on_other_shards = {f"order:{n}:close" for n in range(12)
                       if shop_delayq.store.keys.shard_for(f"order:{n}:close") != damaged}

    with caplog.at_level(logging.ERROR, logger="celery_delayq.contrib.django.sync"):
        JournalSync(shop_delayq).run_once()

    assert set(DelayedTask.objects.values_list("job_id", flat=True)) == on_other_shards
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert damaged.journal in error.getMessage() and "delayq check" in error.getMessage()


def test_an_entry_of_no_known_event_is_skipped_and_counted_not_mirrored(
        shop_delayq, shop_redis, caplog):
    """Entries without an event, or of one no writer makes, for jobs the store never held:
    mirrored, they were rows of pending jobs that ``delayq_reconcile --missing`` then found
    missing from Redis on every run."""
    shop_delayq.schedule(TASK, args=(1,), delay=600, job_id="order:1:close")
    journal = shop_delayq.store.keys.shard_for("order:1:close").journal
    for fields in ({"job": "ghost:1", "task": TASK}, {"event": "", "job": "ghost:2", "due": "1"},
                   {"event": "bogus", "job": "ghost:3", "task": TASK}):
        shop_redis.xadd(journal, fields)

    with caplog.at_level(logging.WARNING, logger=sync_logger.name):
        JournalSync(shop_delayq).run_once()

    assert list(DelayedTask.objects.values_list("job_id", flat=True)) == ["order:1:close"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "3 unreadable" in warning and "bogus" in warning
    assert shop_redis.xrevrange(journal, count=1)[0][0] in JournalCursor.objects.values_list(
        "last_id", flat=True)
    call_command("delayq_reconcile", "--missing")  # nothing missing: no CommandError


@contextlib.contextmanager
def _refused(job_id: str):
    """The database refuses a row for ``job_id`` (an SQLite trigger: IntegrityError), as
    it refuses a value it does not take."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER delayq_test_refuse BEFORE INSERT ON "
                       f"{DelayedTask._meta.db_table} WHEN NEW.job_id = '{job_id}' "
                       f"BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER delayq_test_refuse")


def test_a_batch_the_database_refuses_stops_only_its_shard_and_the_error_names_it(
        shop_delayq, caplog):
    keys = shop_delayq.store.keys
    refused = next(f"order:refused:{n}" for n in range(100)
                   if keys.shard_for(f"order:refused:{n}").shard == 0)
    jobs = [f"order:{n}:close" for n in range(12)]
    for job_id in [refused, *jobs]:
        shop_delayq.schedule(TASK, args=(1,), delay=600, job_id=job_id)
    sync = JournalSync(shop_delayq)

    with _refused(refused), caplog.at_level(logging.ERROR, logger=sync_logger.name):
        sync.run_once()

    assert set(DelayedTask.objects.values_list("job_id", flat=True)) == {
        job_id for job_id in jobs if keys.shard_for(job_id).shard != 0}
    assert JournalCursor.objects.get(shard=0).last_id == "0-0"
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "shard 0" in error and "refused by the test" in error
    sync.run_once()  # the database takes the batch now: the shard goes on
    assert DelayedTask.objects.count() == 13


def test_a_retried_event_at_the_largest_count_leaves_the_count_a_column_holds(
        shop_delayq, shop_redis):
    """``retried`` counts the next try (its ``retries`` + 1): at 2**31 - 1 that was one
    past what PostgreSQL's integer column takes, and the shard's sync stopped there."""
    shop_delayq.schedule(TASK, args=[1], delay=600, job_id="order:1:close")
    journal = shop_delayq.store.keys.shard_for("order:1:close", None).journal
    shop_redis.xadd(journal, {"event": "retried", "job": "order:1:close",
                              "retries": str(2**31 - 1)})

    JournalSync(shop_delayq).run_once()

    assert DelayedTask.objects.get(job_id="order:1:close").retries == 2**31 - 1
