"""A store's Redis without an append-only file loses the jobs written since its last RDB
snapshot when it stops: ``delayq health`` says so (and stays healthy: a restart loop of a
probe would not help), the carrier logs a WARNING at start and when it changes, and the
Django deployment check warns (tests/django/test_checks.py)."""

from __future__ import annotations

import logging

import pytest
import redis

from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import CLUSTER
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
