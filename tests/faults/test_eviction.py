"""A Redis that may evict keys (any maxmemory-policy but noeviction) is reported as unsafe:
``delayq health`` fails naming the policy, the carrier logs an ERROR at start and when the
policy changes, and the Django system check warns."""

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
from tests.conftest import ROOT, celery_cli


@pytest.fixture
def evicting_server():
    with RedisServer(extra=("--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru")) as server:
        yield server


def health(url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=url, PYTHONPATH=ROOT)
    return subprocess.run(celery_cli("delayq", "health"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_health_fails_on_an_evicting_redis_and_names_the_policy(evicting_server):
    done = health(evicting_server.url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "allkeys-lru" in done.stdout and "noeviction" in done.stdout
    redis.Redis(port=evicting_server.port).config_set("maxmemory-policy", "noeviction")
    done = health(evicting_server.url)
    assert done.returncode == 0, done.stdout + done.stderr


def test_health_reads_the_policy_from_info_where_config_is_disabled():
    with RedisServer(extra=("--maxmemory-policy", "volatile-lru",
                            "--rename-command", "CONFIG", "")) as server:
        done = health(server.url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "volatile-lru" in done.stdout


def maintain_through(server: RedisServer, caplog, changes: list[tuple[str, str]]) -> None:
    """A carrier on ``server`` passes its maintenance at start, once more unchanged (nothing
    new to log), then after each ``CONFIG SET`` of ``changes``; its log is in ``caplog``."""
    app = Celery("maintained", broker=f"{server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=2)
    DelayQ(app)
    carrier = Carrier(app)
    client = redis.Redis(port=server.port)
    with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
        carrier.run_once()
        carrier._next_maintenance = 0
        carrier.run_once()  # unchanged: nothing new to log
        for name, value in changes:
            client.config_set(name, value)
            carrier._next_maintenance = 0
            carrier.run_once()
    carrier.close()


def test_the_carrier_logs_an_evicting_policy_at_start_and_when_it_changes(evicting_server,
                                                                          caplog):
    maintain_through(evicting_server, caplog, [("maxmemory-policy", "noeviction"),
                                               ("maxmemory-policy", "volatile-ttl")])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    assert "allkeys-lru" in errors[0] and "volatile-ttl" in errors[1]
    assert any("now noeviction" in r.getMessage() for r in caplog.records)
