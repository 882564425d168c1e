"""The store on Redis Sentinel (``sentinel://``): producers and the carrier follow a failover.

Real processes: a master and a replica (``appendfsync always``), three
``redis-server --sentinel``; the broker is the session's Redis. What is guaranteed: a job
whose ``apply_delayed`` returned and whose write reached the replica (``WAIT 1``) is
published after the failover; Redis replicates asynchronously, so a job acknowledged by
the old master alone may be lost (see docs/operations.md, Sentinel).
"""

from __future__ import annotations

import itertools
import json
import threading

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import SentinelSet
from tests.conftest import wait_for

QUEUE = "sentinel-test"


def sentinel_app(sentinels: SentinelSet, broker_url: str, **conf) -> tuple[Celery, DelayedTask]:
    app = Celery("sentinel", broker=broker_url, set_as_current=False)
    app.conf.update(delayq_redis_url=sentinels.url, task_default_queue=QUEUE,
                    delayq_redis_transport_options={"master_name": sentinels.name},
                    delayq_shards=2, delayq_idle_timeout=0.5, delayq_redis_retries=2,
                    delayq_redis_socket_timeout=1.0, **conf)

    @app.task(base=DelayedTask, name="sentinel.noop", shared=False)
    def noop(n):
        return n

    DelayQ(app)
    return app, noop


def published(broker: redis.Redis) -> list[str]:
    """Task ids of the messages the carrier put on the test queue."""
    return [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)]


def schedule_replicated(task, store, n: int, delay: float) -> str:
    """``apply_delayed`` until the job is stored on a master and copied to its replica;
    returns the task id (the job id is fixed, so a retry stores it once)."""
    while True:
        try:
            result = task.apply_delayed(args=(n,), delay=delay, job_id=f"job-{n}")
            if store.client.wait(1, 500) >= 1:
                return result.id
        except StoreUnavailable:
            pass  # no master reachable yet: the producer retries, as an app would


@pytest.fixture
def sentinels():
    with SentinelSet() as sentinels:
        yield sentinels


@pytest.fixture
def broker(redis_server):
    client = redis.Redis.from_url(f"{redis_server.url}/9", decode_responses=True)
    client.delete(QUEUE)
    yield client
    client.delete(QUEUE)
    client.close()


@pytest.mark.slow
def test_forced_failover_the_carrier_follows_the_new_master_and_loses_no_replicated_job(
        sentinels, broker, redis_server):
    app, noop = sentinel_app(sentinels, f"{redis_server.url}/9")
    store = DelayQ.of(app).store
    counter = itertools.count()
    acknowledged = [schedule_replicated(noop, store, next(counter), 0.05 * i % 2)
                    for i in range(100)]
    carrier = Carrier(app)
    thread = threading.Thread(target=carrier.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(published(broker)) >= 50, what="promotion before the failover")
        old_port = sentinels.master.port
        assert sentinels.failover() != old_port
        # scheduled while the old master may still take writes: kept only once replicated
        acknowledged += [schedule_replicated(noop, store, next(counter), 0.5)
                         for _ in range(100)]
        wait_for(lambda: set(acknowledged) <= set(published(broker)), timeout=40,
                 what="every replicated job published after the failover")
        assert store.client.connection_pool.get_master_address()[1] != old_port
    finally:
        carrier.stop()
        thread.join(10)
        store.close()
