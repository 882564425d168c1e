"""A worker of an app with a DelayQ says at its start what would make its delayed calls
fail later: settings the store refuses. Its tasks' retries go through the store, and a
retry Celery cannot send is dropped (``Reject``): a review lost every retry of a worker
started with a wrong ``delayq_shards``, which started as if all were well."""

from __future__ import annotations

from celery_delayq.testing.redis_server import free_port
from tests.conftest import wait_for

WORKER = ("worker", "-Q", "nothing.sent", "-P", "solo", "--without-heartbeat",
          "--without-gossip", "--without-mingle", "-l", "INFO")


def test_a_worker_whose_store_settings_are_refused_says_so_at_its_start(spawn, monkeypatch):
    monkeypatch.setenv("DELAYQ_TEST_STORE_URL", "redis://127.0.0.1:6379/db1")  # a typo
    worker = spawn(*WORKER)
    wait_for(lambda: "ready." in worker.log.read_text(), timeout=30, what="the worker")

    said = worker.log.read_text()
    assert "ERROR/MainProcess] this worker cannot use the delay store" in said
    assert "names the database 'db1': give its number" in said


def test_a_worker_whose_store_is_away_at_its_start_warns_and_serves(spawn, monkeypatch):
    monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"redis://127.0.0.1:{free_port()}/0")
    worker = spawn(*WORKER)
    wait_for(lambda: "ready." in worker.log.read_text(), timeout=60, what="the worker")
    wait_for(lambda: "WARNING/MainProcess] the delay store cannot be reached"
             in worker.log.read_text(), timeout=30, what="the warning")

    assert worker.poll() is None
