"""A store's Redis without an append-only file loses the jobs written since its last RDB
snapshot when it stops: ``delayq health`` says so (and stays healthy: a restart loop of a
probe would not help), the carrier logs a WARNING at start and when it changes, and the
Django deployment check warns (tests/django/test_checks.py)."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest
import redis
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import CLUSTER, ROOT, celery_cli

pytestmark = pytest.mark.skipif(CLUSTER, reason="a Redis of its own")


@pytest.fixture
def server():
    with RedisServer(appendonly=False) as server:
        yield server


def health(url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=url, PYTHONPATH=ROOT)
    return subprocess.run(celery_cli("delayq", "health"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


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
    app = Celery("no-aof", broker=f"{server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=2)
    DelayQ(app)
    carrier = Carrier(app)
    client = redis.Redis(port=server.port)
    with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
        carrier.run_once()
        carrier._next_maintenance = 0
        carrier.run_once()  # unchanged: not logged again
        client.config_set("appendonly", "yes")
        carrier._next_maintenance = 0
        carrier.run_once()
    carrier.close()
    client.config_set("appendonly", "no")  # a stop with AOF on waits for its rewrite
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NOT DURABLE" in warnings[0], warnings
    assert any("append-only file is on" in r.getMessage() for r in caplog.records)
