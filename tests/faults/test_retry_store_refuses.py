"""A running task's retry that the store cannot take is sent as Celery sends it natively.

Celery turns an error of a retry's ``apply_async`` into ``Reject(requeue=False)``: the
running message is acknowledged (``acks_late`` too) and the task is gone. Natively a
broker that refuses the retry refuses that acknowledgement too, and the task comes back.
Here the store's Redis is a server of its own, down or past ``delayq_max_memory_fraction``
while the broker takes messages; a real worker runs ``tests.proj.flaky`` (a
``DelayedTask``) or ``plain_flaky`` (its retry goes through ``send_task``), which retry
once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery, chain

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import CLUSTER, finish, prefork_worker, wait_for
from tests.ops import short_store_waits

pytestmark = pytest.mark.skipif(CLUSTER, reason="a store of its own on one Redis")

@pytest.fixture
def store(monkeypatch) -> Iterator[RedisServer]:
    """The spawned worker's store: a redis-server of its own."""
    with RedisServer() as server:
        monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"{server.url}/0")
        yield server


def refuse(store: RedisServer, how: str) -> None:
    if how == "down":
        store.stop()
        return
    client = redis.Redis(port=store.port)  # full: past delayq_max_memory_fraction (0.9)
    # data written inside Redis: clients' buffers (a big SET's query buffer is counted
    # until Redis frees it) then move used_memory by little beside it
    client.eval("for n = 1, 20000 do redis.call('SET', 'fill:' .. n, string.rep('x', 100)) "
                "end", 0)
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", used + used // 20)
    client.close()
    time.sleep(1.1)  # a process reads its store's memory about once a second (memory.py)


@pytest.mark.parametrize("task", ["flaky", "plain_flaky"])  # DelayedTask, and send_task
@pytest.mark.parametrize("how", ["down", "full"])
def test_a_retry_the_store_refuses_is_sent_natively_and_the_task_runs_again(
        proj, redis_client, spawn, store, how, task):
    name = f"retry-{how}-{task}"
    worker = prefork_worker(proj, spawn, name, "--config", short_store_waits.__name__)
    refuse(store, how)

    result = getattr(proj, task).apply_async((name,), {"countdown": 0.2}, queue=name,
                                             acks_late=True)

    assert result.get(timeout=30) == name
    runs = [json.loads(run) for run in redis_client.lrange("test:runs", 0, -1)]
    assert [run["retries"] for run in runs if run["label"] == name] == [0, 1]
    worker.terminate()
    log = finish(worker)
    assert "sent as Celery sends it natively" in log, log[-3000:]


@pytest.mark.parametrize("task", ["record", "plain"])  # DelayedTask, and send_task
@pytest.mark.parametrize("canvas", ["chain", "link"])
def test_a_delayed_step_a_worker_sends_is_sent_natively_when_the_store_is_full(
        proj, redis_client, spawn, store, canvas, task):
    """A chain's next step or a ``link`` callback is sent by the worker once the task body
    returned: the store's refusal was "raised outside body", the task marked FAILURE for a
    body that had run and the rest of the chain lost."""
    name = f"step-{canvas}-{task}"
    worker = prefork_worker(proj, spawn, name, "--config", short_store_waits.__name__)
    refuse(store, "full")
    step = getattr(proj, task)
    later = step.si(f"{name} later").set(countdown=0.2, queue=name)

    if canvas == "chain":
        result = chain(step.si(name).set(queue=name), later).apply_async()
    else:
        result = step.apply_async((name,), queue=name, link=later)

    assert result.get(timeout=30) == (f"{name} later" if canvas == "chain" else name)
    wait_for(lambda: f"{name} later" in runs_of(redis_client), what="the delayed step ran")
    assert runs_of(redis_client) == [name, f"{name} later"]
    worker.terminate()
    log = finish(worker)
    assert "sent as Celery sends it natively" in log, log[-3000:]


def test_a_retry_of_an_app_whose_serializer_the_store_refuses_is_sent_natively(
        proj, redis_client, spawn, monkeypatch):
    """The store takes JSON only: a producer's call on pickle is refused at the call, but a
    running task's retry was turned into ``Reject`` by Celery, the task FAILURE after one
    run where natively it retried and succeeded."""
    name = "retry-pickle"
    monkeypatch.setenv("C_FORCE_ROOT", "1")  # Celery's refusal of pickle as root (CI's user)
    # not pinged: the worker would answer in pickle, which this process does not accept
    worker = spawn("--config", "tests.faults.pickle_worker", "worker", "-Q", name, "-P",
                   "prefork", "-c", "1", "--without-heartbeat", "--without-gossip",
                   "--without-mingle", "-l", "INFO")

    result = proj.flaky.apply_async((name,), {"countdown": 0.2}, queue=name)

    assert result.get(timeout=60) == name
    runs = [json.loads(run) for run in redis_client.lrange("test:runs", 0, -1)]
    assert [run["retries"] for run in runs if run["label"] == name] == [0, 1]
    worker.terminate()
    log = finish(worker)
    assert "task_serializer='pickle'" in log  # said at the worker's start
    assert "sent as Celery sends it natively" in log and "JSON only" in log, log[-3000:]


def test_a_retry_of_a_worker_whose_store_settings_are_refused_fails_as_before(
        proj, redis_client, spawn, store):
    """Only a call the store cannot hold goes native; a worker set up against its store
    (here its shard count) fails its retry, as the ERROR at its start said: sent natively,
    a long countdown would wait in a worker's memory."""
    other = Celery("other-shards", set_as_current=False)
    other.conf.update(delayq_redis_url=f"{store.url}/0", delayq_shards=8)
    DelayQ(other).store.client  # noqa: B018 (records 8 shards; tests.proj says 4)
    name = "retry-refused-settings"
    worker = prefork_worker(proj, spawn, name)

    result = proj.flaky.apply_async((name,), {"countdown": 0.2}, queue=name)

    # FAILURE on Celery 5.7; 5.3 records no outcome of the Reject. A retry sent natively
    # would have run within this wait (its countdown is 0.2 s).
    with contextlib.suppress(Exception):
        result.get(timeout=10)
    runs = [json.loads(run) for run in redis_client.lrange("test:runs", 0, -1)]
    assert [run["retries"] for run in runs if run["label"] == name] == [0]
    worker.terminate()
    log = finish(worker)
    assert "sent as Celery sends it natively" not in log and "delayq_shards" in log, log


def runs_of(redis_client) -> list[str]:
    return [json.loads(run)["label"] for run in redis_client.lrange("test:runs", 0, -1)]


def test_a_task_applied_in_the_producer_gets_the_stores_refusal(redis_server):
    """``Task.apply()`` runs the body in the calling process, not a worker's: its countdown
    call the store refuses raises as any producer's, though the broker would take it."""
    app = Celery("applied", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url="redis://127.0.0.1:1/0", delayq_redis_retries=0,
                    delayq_redis_socket_timeout=0.5)
    DelayQ(app)

    @app.task(base=DelayedTask, name="applied.later", shared=False)
    def later():
        return None

    @app.task(base=DelayedTask, name="applied.body", shared=False)
    def body():
        later.apply_async(countdown=60)

    applied = body.apply()
    assert applied.state == "FAILURE" and isinstance(applied.result, StoreUnavailable)
