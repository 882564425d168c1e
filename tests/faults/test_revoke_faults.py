"""Revoke and cancel when a server they need is away or stalled: the store's Redis (the
broadcast still reaches the workers; a worker's revoke command never waits for it) and the
result backend (every job is cancelled all the same, and said to be)."""

from __future__ import annotations

import logging
import os
import socket

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import answers, finish, wait_for

QUEUE = "revoke-faults"  # no job of these tests is promoted: the spawned worker takes none
WORKER = ("worker", "-Q", QUEUE, "-P", "threads", "-c", "2", "--without-heartbeat",
          "--without-gossip", "--without-mingle", "-l", "INFO")


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _app(name: str, broker: str, store: str, backend: str | None = None) -> Celery:
    """An app of its own (tests.proj's shards and default queue: the store it may share
    was made by tests.proj) with one delayed task, ``<name>.noop``."""
    app = Celery(name, broker=broker, backend=backend, set_as_current=False)
    app.conf.update(delayq_redis_url=store, delayq_shards=4, delayq_redis_retries=0,
                    delayq_redis_socket_timeout=1.0, task_default_queue="celery")
    if backend is not None:
        app.conf.update(result_backend_transport_options={"retry_policy": {"max_retries": 0}},
                        redis_socket_connect_timeout=0.5)

    @app.task(base=DelayedTask, name=f"{name}.noop", shared=False)
    def noop(label):
        return label

    DelayQ(app)
    return app


def _session_store(redis_server) -> str:
    return os.environ.get("DELAYQ_TEST_STORE_URL") or f"{redis_server.url}/0"


def _revoked_by_workers(app, name: str) -> set[str]:
    replies = app.control.inspect([name], timeout=2).revoked() or {}
    return {task_id for ids in replies.values() for task_id in ids}


# -- the store's Redis away ----------------------------------------------------------------


def test_a_delayed_results_revoke_reaches_the_workers_when_the_store_is_down(
        proj, redis_server, redis_client, spawn):
    """A job already promoted waits in the broker: only the broadcast stops it there."""
    name = f"store-down@{socket.gethostname()}"  # not a worker of an earlier test
    spawn(*WORKER, "-n", name)
    wait_for(lambda: answers(proj.app, name), timeout=30,
             what="the worker")
    store = RedisServer().start()
    try:
        app = _app("store-down", f"{redis_server.url}/0", f"{store.url}/0")
        result = app.tasks["store-down.noop"].apply_delayed(args=("x",), delay=3600,
                                                            queue=QUEUE)
        store.stop(kill=True)

        with pytest.raises(StoreUnavailable):  # the store cancel could not be made
            result.revoke()

        assert result.id in _revoked_by_workers(proj.app, name)
    finally:
        store.close()


# -- the result backend away ---------------------------------------------------------------


@pytest.fixture
def backend_down(redis_server, redis_client):
    """An app whose store is the session's and whose result backend nobody serves."""
    return _app("backend-down", f"{redis_server.url}/0", _session_store(redis_server),
                backend=f"redis://127.0.0.1:{_dead_port()}/0")


def _marking_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and "REVOKED" in record.getMessage()]


def test_revoking_many_ids_with_the_result_backend_down_cancels_every_one(
        backend_down, caplog):
    delayq = DelayQ.of(backend_down)
    noop = backend_down.tasks["backend-down.noop"]
    results = [noop.apply_delayed(args=(n,), delay=3600) for n in range(3)]
    kept = noop.apply_delayed(args=("kept",), delay=3600)

    with caplog.at_level(logging.WARNING, logger="celery_delayq"):
        backend_down.control.revoke([r.id for r in results])

    assert [job.task_id for job in delayq.pending()] == [kept.id]
    [warning] = _marking_warnings(caplog)
    assert "3 jobs ARE cancelled" in warning
    assert all(r.id in warning for r in results)

    assert delayq.revoke([kept.id]) == 1  # the count of what it cancelled, unmarked or not


def test_cancel_with_the_result_backend_down_says_it_cancelled(backend_down, caplog):
    delayq = DelayQ.of(backend_down)
    result = backend_down.tasks["backend-down.noop"].apply_delayed(args=("x",), delay=3600)

    with caplog.at_level(logging.WARNING, logger="celery_delayq"):
        assert result.cancel() is True

    assert delayq.pending() == []
    [warning] = _marking_warnings(caplog)
    assert "1 job IS cancelled" in warning and result.id in warning
    assert result.cancel() is False  # nothing left to cancel


def test_cancel_by_job_id_and_by_key_with_the_result_backend_down_cancel_everything(
        backend_down, caplog):
    delayq = DelayQ.of(backend_down)
    noop = backend_down.tasks["backend-down.noop"]
    by_id = noop.apply_delayed(args=("id",), delay=3600, job_id="order:1:close")
    for n in range(3):
        noop.apply_delayed(args=(n,), delay=3600, key="order:2")

    with caplog.at_level(logging.WARNING, logger="celery_delayq"):
        assert delayq.cancel(by_id.job_id) is True
        assert delayq.cancel_key("order:2") == 3

    assert delayq.pending() == []
    assert len(_marking_warnings(caplog)) == 2


# -- the store's Redis stalled, seen from a worker -------------------------------------------


def test_a_worker_answers_a_ping_while_its_revoke_waits_for_a_stalled_store(
        proj, redis_server, redis_client, spawn, monkeypatch):
    """A worker's revoke control command cancels in the store off its event loop: the
    store's Redis stalled held every consumer and control reply of the worker for as long
    as the store took (the resend window, ~24 s by default)."""
    store = RedisServer().start()
    try:
        monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"{store.url}/0")
        name = f"stalled-store@{socket.gethostname()}"  # not a worker of an earlier test
        spawn(*WORKER, "-n", name)
        wait_for(lambda: answers(proj.app, name), timeout=30,
                 what="the worker on the stalled store")
        app = _app("store-stalled", f"{redis_server.url}/0", f"{store.url}/0")
        delayq = DelayQ.of(app)
        result = app.tasks["store-stalled.noop"].apply_delayed(args=("x",), delay=3600,
                                                               queue=QUEUE)
        paused = redis.Redis(port=store.port)
        paused.execute_command("CLIENT", "PAUSE", 15_000, "WRITE")  # scripts wait
        try:
            # the worker's command, as `celery control revoke` sends it (no store cancel here)
            proj.app.control.broadcast("revoke", arguments={"task_id": result.id})
            assert proj.app.control.ping(destination=[name], timeout=3), \
                "the worker did not answer a ping"
        finally:
            paused.execute_command("CLIENT", "UNPAUSE")
            paused.close()
        wait_for(lambda: delayq.pending() == [], timeout=30,
                 what="the worker to cancel the revoked job in the store")
    finally:
        store.close()


def test_revoke_commands_left_at_a_workers_shutdown_are_said_not_dropped_silently(
        proj, redis_server, redis_client, spawn, monkeypatch):
    """A worker stopped while its canceller waits for a stalled store: the commands still
    queued went with the process, and nothing said so."""
    store = RedisServer().start()
    try:
        monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"{store.url}/0")
        name = f"stopped-stalled@{socket.gethostname()}"
        worker = spawn(*WORKER, "-n", name)
        wait_for(lambda: answers(proj.app, name), timeout=30,
                 what="the worker on the stalled store")
        app = _app("stopped-stalled", f"{redis_server.url}/0", f"{store.url}/0")
        results = [app.tasks["stopped-stalled.noop"].apply_delayed(args=(n,), delay=3600)
                   for n in range(2)]
        paused = redis.Redis(port=store.port)
        paused.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
        try:
            for result in results:
                proj.app.control.broadcast("revoke", arguments={"task_id": result.id})
            assert proj.app.control.ping(destination=[name], timeout=3)
            worker.terminate()
            log = finish(worker, timeout=60)
        finally:
            paused.execute_command("CLIENT", "UNPAUSE")
            paused.close()
        assert "revoke commands not applied to the delay store" in log, log[-3000:]
    finally:
        store.close()
