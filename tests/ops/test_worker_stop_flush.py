"""A stopping worker writes the journal events it still holds, waiting for the store's Redis
at most once: a Redis that does not answer held the stop for the thread's write in flight,
then for the stop's own write (two resend windows), and nothing then said what went."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

from celery_delayq import DelayQ, journal
from celery_delayq.connection import resend_window_ms
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import answers, finish, wait_for
from tests.ops import short_store_waits
from tests.stalling import StallingProxy

QUEUE = "stop-flush"
#: The longest one write of the spawned worker's journal may take (its settings:
#: tests/ops/short_store_waits.py), seconds.
WINDOW = resend_window_ms(SimpleNamespace(  # type: ignore[arg-type]
    redis_retries=short_store_waits.delayq_redis_retries,
    redis_socket_timeout=short_store_waits.delayq_redis_socket_timeout)) / 1000


@pytest.fixture
def store(monkeypatch) -> Iterator[tuple[redis.Redis, StallingProxy]]:
    """The spawned worker's store: a redis-server of its own behind a proxy the test may
    stall; a client of the server itself (not through the proxy) to read it."""
    with RedisServer() as server:
        proxy = StallingProxy(server.port)
        monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"{proxy.url}/0")
        try:
            with contextlib.closing(redis.Redis(port=server.port, decode_responses=True)
                                    ) as client:
                yield client, proxy
        finally:
            proxy.close()


def _worker(proj, spawn, name: str, pool: str):
    worker = spawn("--config", short_store_waits.__name__, "worker", "-Q", QUEUE,
                   "-n", f"{name}@%h", "-P", pool, "-c", "1", "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    wait_for(lambda: answers(proj.app, f"{name}@{socket.gethostname()}"), timeout=30,
             what=f"worker {name}")
    return worker


def _send(proj, label: str, task: str = "record", *args) -> None:
    """A message as a carrier promotes it (its job id: ``label``), to the worker's queue."""
    proj.app.send_task(f"tests.proj.{task}", (label, *args), queue=QUEUE,
                       headers={"delayq_job": label, "delayq_shard": 0})


def _ran(redis_client, label: str) -> bool:
    return any(json.loads(run)["label"] == label
               for run in redis_client.lrange("test:runs", 0, -1))


def _journaled(client: redis.Redis, label: str) -> list[str]:
    return [fields["event"] for shard in range(4)
            for _, fields in client.xrange(f"delayq:{{{shard}}}:journal")
            if fields.get("job") == label]


def _stopped(worker) -> tuple[float, str]:
    """Seconds from the worker's SIGTERM to its exit, and its log."""
    began = time.monotonic()
    worker.terminate()
    log = finish(worker, timeout=10 * WINDOW)
    return time.monotonic() - began, log


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_stopping_on_a_stalled_store_waits_once_and_says_what_it_did_not_write(
        proj, redis_client, spawn, store, pool):
    client, proxy = store
    worker = _worker(proj, spawn, f"stop-flush-stalled-{pool}", pool)
    _send(proj, "healthy")
    wait_for(lambda: _journaled(client, "healthy") == ["started", "succeeded"],
             what="the events of the run before the stall")
    proxy.stall()
    _send(proj, "stalled")
    wait_for(lambda: _ran(redis_client, "stalled"), what="the run on the stalled store")
    time.sleep(0.3)  # its events are being written: the worker's write waits for Redis

    took, log = _stopped(worker)

    print(f"stopped in {took:.1f} s (one write waits up to {WINDOW:g} s)")
    assert took < 1.5 * WINDOW, log[-3000:]
    assert "2 worker events not written as this worker stops" in log, log[-3000:]
    assert _journaled(client, "stalled") == []


@pytest.mark.parametrize("stall", [0, 1], ids=["healthy", "stalled-for-a-moment"])
def test_a_stopping_worker_writes_every_event_a_store_answering_within_its_wait_takes(
        proj, redis_client, spawn, store, stall):
    """The run under way when the stop comes ends first; its events are all written, even
    when the store's Redis answers them only after a moment."""
    client, proxy = store
    worker = _worker(proj, spawn, f"stop-flush-slow-{stall}", "threads")
    _send(proj, "before")
    wait_for(lambda: _journaled(client, "before") == ["started", "succeeded"],
             what="the events of the run before the stop")
    if stall:
        proxy.stall()
    _send(proj, "under way", "slow", 1.0)
    wait_for(lambda: _ran(redis_client, "under way"), what="the run under way")
    worker.terminate()
    if stall:
        time.sleep(stall)
        proxy.resume()
    log = finish(worker, timeout=10 * WINDOW)

    assert _journaled(client, "under way") == ["started", "succeeded"], log[-3000:]
    assert "not written" not in log, log[-3000:]


def test_a_stop_on_a_healthy_store_writes_every_waiting_event(delayq, redis_client, caplog):
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")
    shard = delayq.store.keys.shard(0)
    for n in range(500):  # more than one write's worth (journal._FLUSH_AT)
        journal.record_event(delayq, 0, "succeeded", {"job": f"order:{n}:close",
                                                      "task": "tests.proj.record"})
    journal._outbox.stop()

    assert redis_client.xlen(shard.journal) == 500
    assert "not written" not in caplog.text


def test_a_stop_writes_a_healthy_stores_events_waiting_behind_a_stalled_stores_write(caplog):
    """Two stores in one process: the thread's write to the stalled one is in flight when
    the stop comes, an event of the healthy one waits behind it; that one is written, and
    only the stalled store's event goes with the process."""
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")
    with RedisServer() as stalled_server, RedisServer() as healthy_server:
        proxy = StallingProxy(stalled_server.port)
        stores = []
        for name, url in (("stalled", proxy.url), ("healthy", healthy_server.url)):
            app = Celery(name, broker=f"{healthy_server.url}/0", set_as_current=False)
            app.conf.update(delayq_redis_url=f"{url}/0", delayq_redis_retries=1,
                            delayq_redis_socket_timeout=1.0)
            stores.append(DelayQ(app))
        stalled, healthy = stores
        try:
            stalled.store.client.ping()
            proxy.stall()
            journal.record_event(stalled, 0, "started", {"job": "a1", "task": "t"})  # soon
            time.sleep(0.3)  # the thread's write to the stalled store is in flight
            journal.record_event(healthy, 0, "succeeded", {"job": "b1", "task": "t"})
            journal._outbox.stop()

            written = healthy.store.client.xrange(healthy.store.keys.shard(0).journal)
            assert [fields["job"] for _, fields in written] == ["b1"]
            assert "1 worker event not written as this worker stops" in caplog.text
        finally:
            proxy.resume()
            journal.flush()
            for delayq in stores:
                delayq.store.close()
            proxy.close()
