"""A store's Redis without an append-only file loses the jobs written since its last RDB
snapshot when it stops: ``delayq health`` says so (and stays healthy: a restart loop of a
probe would not help), the carrier logs a WARNING at start and when it changes, and the
Django deployment check warns (tests/django/test_checks.py). A Redis loading its
append-only file after a restart says ``aof_enabled:0`` until it has loaded: that is not
reported."""

from __future__ import annotations

import logging
import threading

import pytest
import redis
from celery import Celery

from celery_delayq.carrier import Carrier
from celery_delayq.errors import StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import CLUSTER, wait_for
from tests.faults.test_eviction import health, maintain_through

pytestmark = pytest.mark.skipif(CLUSTER, reason="a Redis of its own")


@pytest.fixture
def server():
    with RedisServer(appendonly=False) as server:
        yield server


def test_health_says_a_redis_without_aof_is_not_durable_and_stays_healthy(server):
    client = redis.Redis(port=server.port)
    client.set("some", "write")
    done = health(server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok:")
    assert "not durable: Redis keeps no append-only file (appendonly no)" in done.stdout
    assert "CONFIG SET appendonly yes" in done.stdout

    client.config_set("appendonly", "yes")
    done = health(server.url)
    client.config_set("appendonly", "no")  # a stop with AOF on waits for its rewrite
    assert done.returncode == 0 and "not durable" not in done.stdout, done.stdout


def test_the_carrier_warns_of_aof_off_at_start_and_when_it_changes(server, caplog):
    maintain_through(server, caplog, [("appendonly", "yes")])
    redis.Redis(port=server.port).config_set("appendonly", "no")  # a stop with AOF on waits
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NOT DURABLE" in warnings[0], warnings
    assert any("append-only file is on" in r.getMessage() for r in caplog.records)


@pytest.fixture
def aof_server():
    """A Redis with AOF on, holding 60,000 writes that take it ~7 s to load on a restart
    (120 µs each: Redis's ``key-load-delay``)."""
    with RedisServer(appendonly=True, extra=("--key-load-delay", "120")) as server:
        pipe = redis.Redis(port=server.port).pipeline(transaction=False)
        for n in range(60_000):
            pipe.set(f"filler:{n}", n)
        pipe.execute()
        yield server


def restarted(server: RedisServer) -> threading.Thread:
    """Restart ``server``; the thread it returns ends once Redis has loaded its AOF."""
    server.stop()
    starting = threading.Thread(target=server.start, kwargs={"timeout": 60})
    starting.start()
    client = redis.Redis(port=server.port)
    wait_for(lambda: _loading(client), timeout=10, what="Redis loading its AOF")
    return starting


def _loading(client: redis.Redis) -> bool:
    try:
        return client.info("persistence")["loading"] == 1
    except redis.ConnectionError:  # not listening yet
        return False


def test_a_redis_loading_its_aof_is_not_reported_as_not_durable_nor_as_missing(
        aof_server, caplog):
    app = Celery("restarted", broker=f"{aof_server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=2, delayq_redis_retries=0)
    carrier = Carrier(app)
    with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
        carrier.run_once()
        starting = restarted(aof_server)
        carrier._next_maintenance = 0
        with pytest.raises(StoreUnavailable) as refused:
            carrier.run_once()  # reads INFO persistence (served while loading), then a write
        assert _loading(redis.Redis(port=aof_server.port)), "loaded before the carrier looked"
        starting.join()
        carrier._next_maintenance = 0
        carrier.run_once()
    carrier.close()
    said = [r.getMessage() for r in caplog.records if "append-only" in r.getMessage()]
    assert said == [], said
    message = str(refused.value)
    assert "is loading its data" in message and "check that it runs" not in message, message
