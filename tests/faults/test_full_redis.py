"""A full Redis (``maxmemory`` with ``noeviction``): producers get StoreFull, a refused batch
says exactly what it stored, reads and a starting carrier work, and promotion drains the
store, because promotion is what frees memory.

Each test runs its own small redis-server (a few MB), which is the broker and the store.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime, timezone

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreFull, journal
from celery_delayq.carrier import Carrier
from celery_delayq.check import check
from celery_delayq.store import CancelOutcome
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import ROOT, celery_cli, running_worker, wait_for

PAD = "x" * 120  # an argument, so each job holds a few hundred bytes
PAST = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def full_server():
    with RedisServer(extra=("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")) as server:
        yield server


def make_app(url: str, **conf) -> tuple[Celery, object, Counter]:
    """An app whose broker and store are ``url``; its task counts runs per argument."""
    app = Celery("full", broker=f"{url}/0", set_as_current=False)
    app.conf.update(delayq_shards=4, delayq_idle_timeout=0.5, delayq_lease_seconds=2.0,
                    delayq_shard_lease_seconds=2.0,
                    task_default_queue="full", broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, worker_redirect_stdouts=False,
                    **conf)
    runs: Counter = Counter()
    lock = threading.Lock()

    @app.task(base=DelayedTask, name="full.work", shared=False, ignore_result=True)
    def work(i, pad):
        with lock:
            runs[i] += 1

    DelayQ(app)
    return app, work, runs


def fill_redis(client: redis.Redis) -> None:
    """Write unrelated data until Redis refuses a write for memory, then keep it full: a
    megabyte over its limit, since used memory falls as Redis shrinks the buffers of idle
    clients (by about 100 KB within 3 s here, which once let a write through)."""
    try:
        while True:
            client.hset("filler", mapping={f"f{os.urandom(8).hex()}": PAD for _ in range(100)})
    except redis.exceptions.OutOfMemoryError:
        client.config_set("maxmemory", client.info("memory")["used_memory"] - 1_000_000)


def stored_ids(delayq, ids) -> set[str]:
    return {job_id for job_id, held in zip(ids, delayq.store.held([(i, None) for i in ids]),
                                           strict=True) if held}


def test_a_producer_on_a_full_redis_gets_store_full_and_nothing_is_written(full_server):
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0)
    delayq = DelayQ.of(app)
    delayq.store.client.ping()  # the store exists before Redis fills up
    fill_redis(redis.Redis(port=full_server.port))
    with pytest.raises(StoreFull, match="maxmemory") as refused:
        work.apply_delayed(args=(1, PAD), delay=60, job_id="one")
    assert refused.value.stored == []
    ids = [f"many-{n}" for n in range(500)]
    with pytest.raises(StoreFull):
        work.apply_delayed_many([{"args": (n, PAD), "delay": 60, "job_id": job_id}
                                 for n, job_id in enumerate(ids)])
    assert stored_ids(delayq, ["one", *ids]) == set()


def test_a_pause_or_rate_limit_on_a_full_redis_is_store_full_and_sets_nothing(full_server):
    app, _, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0)
    delayq = DelayQ.of(app)
    delayq.store.client.ping()
    fill_redis(redis.Redis(port=full_server.port))
    with pytest.raises(StoreFull, match="maxmemory"):
        delayq.pause(queue="full")
    with pytest.raises(StoreFull, match="maxmemory"):
        delayq.set_rate_limit("full", "10/s")
    assert delayq.paused() == {"tasks": [], "queues": []} and delayq.rate_limits() == {}


def test_a_resume_or_a_limits_removal_on_a_full_redis_is_store_full_and_changes_nothing(
        full_server):
    """Refused on every shard, not only on the one that journals: a pause ended on some
    shards would leave their held jobs held by nothing."""
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0)
    delayq = DelayQ.of(app)
    delayq.pause(queue="full")
    work.apply_delayed_many([{"args": (n, PAD), "eta": PAST} for n in range(40)])
    delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    delayq.set_rate_limit("paused.too", "1/h")
    fill_redis(redis.Redis(port=full_server.port))
    with pytest.raises(StoreFull, match="maxmemory"):
        delayq.resume(queue="full")
    with pytest.raises(StoreFull, match="maxmemory"):
        delayq.set_rate_limit("paused.too", None)
    client = delayq.store.client
    assert all(client.hexists(shard.paused, "queue:full") for shard in delayq.store.keys)
    assert all(client.hget(shard.limits, "rate:paused.too") != "off"
               for shard in delayq.store.keys)

    client.config_set("maxmemory", 0)
    assert delayq.resume(queue="full") == 40
    assert sum(report.found["stranded"] for report in check(delayq.store)) == 0


def test_cancels_and_drops_on_a_full_redis_answer_as_on_any_other(full_server):
    """They free memory, so a full Redis runs them; those that find nothing to remove write
    nothing either (no reply kept for a second run: it would answer the same)."""
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0)
    delayq = DelayQ.of(app)
    work.apply_delayed(args=(1, PAD), delay=60, job_id="one", key="order:1")
    work.apply_delayed(args=(2, PAD), delay=60, job_id="two")
    fill_redis(redis.Redis(port=full_server.port))
    assert delayq.cancel_outcome("nothing") is CancelOutcome.UNKNOWN
    assert delayq.cancel_key("order:none") == 0
    assert delayq.store.drop("nothing", by="test") is False
    assert delayq.store.replay("nothing") is False
    assert delayq.cancel_key("order:1") == 1
    assert delayq.cancel("two") is True


def test_a_refused_batch_lists_exactly_the_jobs_it_stored(full_server):
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0)
    delayq = DelayQ.of(app)
    client = redis.Redis(port=full_server.port)
    delayq.store.client.ping()
    # room for a few of the batch's script calls (its pipeline's query buffer counts too):
    # the first calls run, Redis passes its limit, the calls after are refused
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 1_000_000)
    # random job ids: ids of the caller's own would take their reservations first, which
    # a full Redis refuses before any job is written (nothing stored, nothing to list)
    with pytest.raises(StoreFull) as refused:
        work.apply_delayed_many([{"args": (n, PAD), "delay": 60} for n in range(6000)])
    stored = refused.value.stored
    print(f"\nbatch of 6000: {len(stored)} stored, {6000 - len(stored)} refused")
    assert 0 < len(stored) < 6000
    assert sorted(stored) == sorted(job.job_id for job in delayq.pending(limit=10_000))


def test_producers_stop_at_the_memory_fraction_and_resume_when_memory_is_freed(full_server):
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=0.5)
    client = redis.Redis(port=full_server.port)
    DelayQ.of(app).store.client.ping()
    limit = int(client.config_get("maxmemory")["maxmemory"])
    while client.info("memory")["used_memory"] < 0.6 * limit:
        client.hset("filler", mapping={f"f{os.urandom(8).hex()}": PAD for _ in range(500)})
    with pytest.raises(StoreFull, match=r"delayq_max_memory_fraction=0\.5"):
        work.apply_delayed(args=(1, PAD), delay=60)
    client.delete("filler")
    time.sleep(1.1)  # a producer reads Redis's memory at most once a second
    assert work.apply_delayed(args=(1, PAD), delay=60).job_id


def test_worker_events_refused_for_memory_are_written_once_redis_has_room(full_server):
    """A full Redis passes (promotion drains it): a worker keeps the events it refused, as
    for a Redis that does not answer, instead of dropping them."""
    app, _, _ = make_app(full_server.url)
    delayq = DelayQ.of(app)
    client = redis.Redis(port=full_server.port)
    journal_key = delayq.store.keys.shard(0).journal
    fill_redis(client)
    try:
        for n in range(3):
            journal.record_event(delayq, 0, "succeeded", {"job": f"order:{n}:close",
                                                          "task": "full.work"})
        journal.flush()
        assert client.xlen(journal_key) == 0
        client.delete("filler")
        wait_for(lambda: client.xlen(journal_key) == 3, timeout=10,
                 what="the refused events, once Redis has room")
    finally:
        client.config_set("maxmemory", 0)
        journal.flush()  # nothing of this server's left in the outbox
        delayq.store.close()


def test_stats_health_and_a_new_carrier_start_on_a_full_store(full_server, redis_server,
                                                               redis_client):
    """Nothing at start-up needs a write: on a full store of its own, a fresh carrier (its
    heartbeat and shard leases refused) promotes every due job into the broker."""
    app, work, _ = make_app(full_server.url, delayq_max_memory_fraction=1.0,
                            broker_url=f"{redis_server.url}/0", delayq_redis_url=full_server.url)
    delayq = DelayQ.of(app)
    ids = [work.apply_delayed(args=(n, PAD), delay=0.2).job_id for n in range(50)]
    fill_redis(redis.Redis(port=full_server.port))
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=full_server.url, PYTHONPATH=ROOT,
               DELAYQ_TEST_DEFAULT_QUEUE="full")
    for command, says in ((["stats"], "total pending: 50"), (["health"], "ok")):
        done = subprocess.run(celery_cli("delayq", *command), cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert says in done.stdout
    time.sleep(0.3)
    carrier = Carrier(app)
    try:
        while delayq.store.held([(i, None) for i in ids]) != [False] * len(ids):
            carrier.run_once()
    finally:
        carrier.close()
    assert redis_client.llen("full") == len(ids)
    redis_client.delete("full")


@pytest.mark.slow
@pytest.mark.parametrize("promotion", ["kombu", "direct"])
def test_a_full_store_on_the_broker_redis_drains_and_loses_nothing(full_server, promotion):
    """Fill the broker's Redis with acknowledged jobs until producers are refused, then
    start a carrier and a worker: every acknowledged job runs, and producers can schedule
    again."""
    # a round of promotion (claim_batch x shards messages, two in a backlog) fits easily in
    # the room the carrier keeps for the workers: (1 - 0.5) / 2 of 5 MB
    redis.Redis(port=full_server.port).config_set("maxmemory", "5mb")
    app, work, runs = make_app(full_server.url, delayq_direct_promotion=promotion == "direct",
                               delayq_claim_batch=25, delayq_max_memory_fraction=0.5,
                               delayq_journal_maxlen=100)  # a cap fit for 3 MB
    acked: list[int] = []
    refused = None
    started = time.monotonic()
    while refused is None:
        base = len(acked)
        try:
            work.apply_delayed_many([{"args": (base + n, PAD), "delay": 0.2}
                                     for n in range(200)])
            acked.extend(range(base, base + 200))
        except StoreFull as exc:
            refused = exc
            acked.extend(range(base, base + len(exc.stored)))
    fill_seconds = time.monotonic() - started
    assert acked
    with running_worker(app, concurrency=8):
        carrier = Carrier(app)
        thread = threading.Thread(target=carrier.run, daemon=True)
        thread.start()
        started = time.monotonic()
        try:
            wait_for(lambda: set(runs) >= set(acked), timeout=60, interval=0.2,
                     what=f"{len(acked)} acknowledged jobs to run")
            drain_seconds = time.monotonic() - started
            time.sleep(1.1)  # past the producer's cached reading
            assert work.apply_delayed(args=(-1, PAD), delay=0).job_id
            wait_for(lambda: -1 in runs, what="a job scheduled after the drain")
        finally:
            carrier.stop()
            thread.join(10)
    lost = set(acked) - set(runs)
    duplicated = sum(n - 1 for n in runs.values())
    print(f"\n{promotion}: {len(acked)} acknowledged (filled in {fill_seconds:.1f}s, refused "
          f"with: {refused}), ran {len(set(runs) & set(acked))}, lost {len(lost)}, "
          f"duplicated {duplicated}, drained in {drain_seconds:.1f}s; "
          f"{carrier.stats.promoted} promoted through kombu")
    assert not lost
