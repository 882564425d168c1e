"""Scheduling, idempotency, lookup and listing against a real Redis."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from celery_delayq import DelayQ, JobExists, validation
from celery_delayq.errors import ConfigurationError
from celery_delayq.store import Promoted, ScheduleCode, listing, producing
from tests.conftest import command_calls
from tests.unit.calls import build


def test_relative_delay_is_counted_from_redis_time(proj, redis_client):
    def redis_ms() -> int:
        seconds, micros = redis_client.time()
        return seconds * 1000 + micros // 1000

    before = redis_ms()
    result = proj.record.apply_delayed(args=("x",), delay=30)
    after = redis_ms()
    assert before + 30_000 <= result.eta.timestamp() * 1000 <= after + 30_000


def test_get_returns_the_pending_job(proj, delayq):
    result = proj.anything.apply_delayed(args=("x",), kwargs={"y": 1}, delay=60,
                                         key="order:1", job_id="order:1:close")
    job = delayq.get("order:1:close")
    assert (job.task, job.args, job.kwargs, job.key, job.state, job.task_id) == (
        proj.anything.name, ["x"], {"y": 1}, "order:1", "scheduled", result.id)
    assert job.due == result.eta
    assert delayq.get("order:1:close", key="order:1") == job
    assert delayq.get("nope") is None


def test_get_with_a_key_finds_the_pending_job_before_a_dead_letter_on_the_keys_shard(
        proj, delayq):
    keys = delayq.store.keys
    dead_shard = keys.shard_for("order:9:close", "order:9")
    other = next(f"order:9:{n}" for n in range(100)
                 if keys.shard_for("order:9:close", f"order:9:{n}") != dead_shard)
    delayq.store.bury("order:9:close", "order:9", '{"t":"tests.proj.record"}\n["old"]\n',
                      "given up")
    proj.record.apply_delayed(args=("new",), delay=60, key=other, job_id="order:9:close")

    job = delayq.get("order:9:close", key="order:9")
    assert (job.state, job.args, job.key) == ("scheduled", ["new"], other)


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-shard", "other-keys-shard"])
def test_a_retry_replaces_its_own_stored_call_and_keeps_a_newer_one(proj, delayq, elsewhere):
    """``retry`` (a running task's own call): a call of another task id under the job id,
    scheduled while the run executed, stays; one of its own task id is replaced (moved to
    the retry's key's shard, as ``replace`` moves it)."""
    keys = delayq.store.keys
    home = keys.shard_for("order:7:close", "order:7")
    other = next(f"order:7:{n}" for n in range(100)
                 if keys.shard_for("order:7:close", f"order:7:{n}") != home)
    retry_key = other if elsewhere else "order:7"
    due = validation.due(60, None, delayq.config.max_delay)

    def stored(task_id: str, label: str, key: str) -> list:
        call = build(proj.app, proj.record.name, [label], job_id="order:7:close", key=key,
                     task_id=task_id)
        return delayq.store.schedule([(call, due)], "retry")

    delayq.store.schedule([(build(proj.app, proj.record.name, ["newer"], task_id="newer",
                                  job_id="order:7:close", key="order:7"), due)], "keep")
    [kept] = stored("earlier", "retry", retry_key)
    assert kept.code is ScheduleCode.KEPT
    assert delayq.get("order:7:close").args == ["newer"]

    [replaced] = stored("newer", "again", retry_key)
    assert replaced.code in (ScheduleCode.CREATED, ScheduleCode.REPLACED)
    copies = [job for job in delayq.pending() if job.job_id == "order:7:close"]
    assert [(job.args, job.key) for job in copies] == [(["again"], retry_key)]


@pytest.mark.parametrize("stored", ['{"t":"tests.proj.record","i":5}\n["x"]\n',
                                    '{not json\n["x"]\n'], ids=["i-no-text", "unreadable"])
@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-shard", "other-keys-shard"])
def test_a_retry_replaces_a_damaged_call_stored_under_its_job_id(proj, delayq, stored,
                                                                  elsewhere):
    """A stored call whose task id cannot be read is no newer call: the retry replaces
    it (kept, the retry was lost), on its own shard or moving it from another key's."""
    keys, client = delayq.store.keys, delayq.store.client
    home = keys.shard_for("order:8:close", "order:8")
    shard = next(s for s in keys if (s is not home) == elsewhere)
    client.hset(shard.jobs, "order:8:close", stored)
    client.zadd(shard.due, {"order:8:close": 4_000_000_000_000})
    call = build(proj.app, proj.record.name, ["retry"], job_id="order:8:close", key="order:8",
                 task_id="t8")

    [result] = delayq.store.schedule(
        [(call, validation.due(60, None, delayq.config.max_delay))], "retry")

    assert result.code in (ScheduleCode.CREATED, ScheduleCode.REPLACED)
    job = delayq.get("order:8:close", key="order:8")
    assert (job.args, job.task_id, job.shard) == (["retry"], "t8", home.shard)


def test_if_exists_keep_returns_the_stored_job_unchanged(proj, delayq):
    first = proj.record.apply_delayed(args=("first",), delay=60, job_id="dedupe")
    again = proj.record.apply_delayed(args=("second",), delay=999, job_id="dedupe")
    assert (again.id, again.eta) == (first.id, first.eta)
    assert delayq.get("dedupe").args == ["first"]


def test_if_exists_replace_overwrites_call_and_due_time(proj, delayq):
    proj.record.apply_delayed(args=("first",), delay=60, job_id="dedupe", key="order:1")
    second = proj.record.apply_delayed(args=("second",), delay=120, job_id="dedupe",
                                       key="order:1", if_exists="replace")
    job = delayq.get("dedupe")
    assert (job.args, job.due) == (["second"], second.eta)
    assert [j.job_id for j in delayq.pending(key="order:1")] == ["dedupe"]


def test_if_exists_error_raises_and_keeps_the_stored_job(proj, delayq):
    proj.record.apply_delayed(args=("first",), delay=60, job_id="dedupe")
    with pytest.raises(JobExists, match="if_exists='keep'"):
        proj.record.apply_delayed(args=("second",), delay=60, job_id="dedupe",
                                  if_exists="error")
    assert delayq.get("dedupe").args == ["first"]


def test_pending_lists_in_due_order_and_filters_by_task_and_key(proj, delayq):
    for i in range(30):
        proj.record.apply_delayed(args=(i,), delay=100 + i, key=f"order:{i % 3}")
    proj.flaky.apply_delayed(args=("f",), delay=50)
    listed = delayq.pending(limit=10)
    assert [j.args for j in listed] == [["f"]] + [[i] for i in range(9)]
    assert {j.task for j in delayq.pending(task=proj.flaky.name)} == {proj.flaky.name}
    by_key = delayq.pending(key="order:1")
    assert [j.args[0] for j in by_key] == list(range(1, 30, 3))


def test_cancel_tells_cancelled_from_unknown(proj, delayq):
    result = proj.record.apply_delayed(args=("x",), delay=60, key="order:5")
    assert delayq.cancel_outcome(result.job_id).value == "cancelled"
    assert delayq.cancel_outcome(result.job_id).value == "unknown"
    assert delayq.pending() == []


def test_cancel_of_a_claimed_job_reports_too_late(proj, delayq):
    result = proj.record.apply_delayed(args=("x",), delay=0)
    claims = delayq.store.claim(list(delayq.store.keys), batch=10, lease_ms=30_000)
    assert [j.job_id for c in claims for j in c.jobs] == [result.job_id]
    assert delayq.cancel_outcome(result.job_id).value == "too late: already promoted"
    assert delayq.get(result.job_id).state == "claimed"


def test_many_calls_are_scheduled_in_one_batch(proj, delayq):
    items = [{"args": (i,), "delay": 60, "key": f"order:{i}", "job_id": f"job-{i}"}
             for i in range(2500)]
    results = proj.record.apply_delayed_many(items)
    assert [r.job_id for r in results] == [f"job-{i}" for i in range(2500)]
    assert sum(row["pending"] for row in delayq.store.stats()) == 2500
    again = proj.record.apply_delayed_many(items)  # idempotent by job id
    assert [r.id for r in again] == [r.id for r in results]
    assert sum(row["pending"] for row in delayq.store.stats()) == 2500


def test_a_different_shard_count_on_existing_data_is_refused(proj, redis_client):
    from celery import Celery

    def delayq_with(shards):
        app = Celery("other", broker=proj.app.conf.broker_url, set_as_current=False)
        app.conf.delayq_shards = shards
        app.conf.delayq_redis_url = proj.app.conf.delayq_redis_url
        return DelayQ(app)

    assert delayq_with(4).store.client  # a process that writes records the store
    with pytest.raises(ConfigurationError, match="delayq_shards=4"):
        delayq_with(5).pending()
    store = delayq_with(4).store  # (a cluster in the cluster pass)
    meta = store.keys.meta
    store.client.hset(meta, "shards", "four")  # a damaged record says how to set it back
    with pytest.raises(ConfigurationError, match=rf"holds 'four', not a shard count.*"
                                                 rf"HSET {re.escape(meta)} shards N"):
        delayq_with(4).pending()


def test_a_producer_with_another_default_queue_is_refused_before_it_stores_a_job(
        proj, redis_client):
    """A job sent to its producer's default queue is stored without its queue, and the
    carrier publishes such a job to the default queue: every process of a store must
    agree on it, as on the shard count."""
    from celery import Celery

    def delayq_with(queue):
        app = Celery("other", broker=proj.app.conf.broker_url, set_as_current=False)
        app.conf.task_default_queue = queue
        app.conf.delayq_redis_url = proj.app.conf.delayq_redis_url
        app.conf.delayq_shards = proj.app.conf.delayq_shards
        return DelayQ(app)

    assert delayq_with(proj.app.conf.task_default_queue).store.client  # records the store
    orders = delayq_with("orders")
    with pytest.raises(ConfigurationError, match=r"records task_default_queue='celery'.*"
                                                 r"this app says 'orders'.*"
                                                 r"CELERY_TASK_DEFAULT_QUEUE"):
        orders.schedule("tests.proj.record", ("lost",), delay=60)
    assert delayq_with("celery").pending() == []


def test_naive_eta_on_apply_async_follows_celery_timezone_rules(proj, delayq):
    naive = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0) + timedelta(hours=1)
    result = proj.record.apply_async(("x",), eta=naive)
    assert delayq.get(result.id).due.replace(tzinfo=None) == naive


def test_counts_follow_jobs_per_task_through_schedule_cancel_and_promotion(proj, delayq):
    keep = proj.record.apply_delayed_many([{"args": (i,), "delay": 60} for i in range(5)])
    proj.flaky.apply_delayed(args=("f",), delay=60, job_id="f", key="order:1")
    proj.record.apply_delayed(args=("f",), delay=60, job_id="f", key="order:1",
                              if_exists="replace")  # the job changes task
    assert delayq.store.counts() == ({proj.record.name: 6}, 0)
    keep[0].cancel()
    assert delayq.cancel_key("order:1") == 1
    assert delayq.store.counts() == ({proj.record.name: 4}, 2)
    delayq.run_now(keep[1].job_id)
    claims = delayq.store.claim(list(delayq.store.keys), batch=10, lease_ms=30_000)
    delayq.store.ack({c.shard: [Promoted(j.job_id, proj.record.name, None, j.due_ms)
                                for j in c.jobs] for c in claims if c.jobs})
    assert delayq.store.counts() == ({proj.record.name: 3}, 2)


def test_a_key_with_more_jobs_than_one_call_takes_is_cancelled_call_by_call(
        proj, delayq, monkeypatch):
    """cancel_key looks at CANCEL_KEY_CHUNK jobs of the key per script call, so a key with
    very many jobs never blocks Redis for seconds; the jobs a carrier holds are passed over
    (they stay in the key's index until acked), never looked at again and again."""
    monkeypatch.setattr(producing, "CANCEL_KEY_CHUNK", 7)
    pending = proj.record.apply_delayed_many([{"args": (i,), "delay": 60, "key": "tenant:1"}
                                              for i in range(25)])
    proj.record.apply_delayed_many([{"args": (i,), "delay": 0, "key": "tenant:1"}
                                    for i in range(5)])
    claims = delayq.store.claim(list(delayq.store.keys), batch=100, lease_ms=30_000)
    assert sum(len(claim.jobs) for claim in claims) == 5
    delayq.store.cancel_key("no-such-key")  # the script loaded (a NOSCRIPT call counts)
    before = command_calls(delayq.store)
    assert sorted(delayq.store.cancel_key("tenant:1")) == sorted(
        (r.id, "tests.proj.record") for r in pending)
    assert command_calls(delayq.store) - before == 5  # 30 index members, 7 per call
    assert delayq.pending(key="tenant:1") == []


@pytest.mark.parametrize("task", [None, "tests.proj.record"])
def test_a_key_with_many_jobs_is_listed_reading_its_index_chunk_by_chunk(
        proj, delayq, monkeypatch, task):
    """pending(key=...) reads the key's index SCAN_CHUNK members at a time: for a key of
    200,000 jobs one read of its index held Redis for 92 ms, one of their envelopes 171 ms."""
    monkeypatch.setattr(listing, "SCAN_CHUNK", 7)
    delays = [10 + n * 37 % 40 for n in range(40)]  # due order is not job id order
    proj.record.apply_delayed_many([{"args": (n,), "delay": delay, "key": "tenant:1",
                                     "job_id": f"j{n:02}"} for n, delay in enumerate(delays)])
    proj.flaky.apply_delayed(args=(0, 0), delay=1, key="tenant:1", job_id="other-task")
    before = command_calls(delayq.store, "zrangebylex")
    jobs = delayq.pending(key="tenant:1", task=task, limit=5)
    by_due = [f"j{n:02}" for n in sorted(range(40), key=delays.__getitem__)]
    assert [job.job_id for job in jobs] == (by_due[:5] if task else ["other-task", *by_due[:4]])
    assert command_calls(delayq.store, "zrangebylex") - before == 6  # 41 members, 7 per read


def test_a_listing_limit_on_one_key_takes_its_earliest_due_jobs(proj, delayq):
    """One key's jobs are found in job id order; the limit still goes by due time."""
    for job_id, delay in (("a", 300), ("b", 200), ("c", 100)):
        proj.record.apply_delayed(args=(job_id,), delay=delay, key="order:1", job_id=job_id)
    assert [j.job_id for j in delayq.pending(key="order:1", limit=2)] == ["c", "b"]
