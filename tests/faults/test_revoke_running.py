"""A task revoked while it runs, whose run then retries: natively the retry's message
reaches a worker that keeps the revoke in memory and discards it; here the retry waits in
the store, where a worker started later (a deploy) never heard the revoke. The revoke is
recorded in the store, and the retry the run stores after it is cancelled there."""

from __future__ import annotations

import json
import logging
import time

import redis
from celery import Celery, signals
from celery.app.task import Context

from celery_delayq import DelayQ, revoke
from celery_delayq.envelope import Call
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import finish, prefork_worker, wait_for

QUEUE = "revoke-running"


def test_the_retry_a_revoked_run_stores_is_cancelled_and_its_result_is_revoked(
        proj, delayq, redis_client, spawn):
    worker = prefork_worker(proj, spawn, QUEUE)
    result = proj.slow_flaky.apply_async(("revoked",), {"seconds": 1.5}, queue=QUEUE)
    wait_for(lambda: any(json.loads(run)["label"] == "revoked"
                         for run in redis_client.lrange("test:runs", 0, -1)),
             what="the run")

    result.revoke()  # nothing stored yet: the run goes on, and retries

    wait_for(lambda: result.state == "REVOKED", timeout=20, what="the result REVOKED")
    assert delayq.get(result.id) is None and delayq.pending() == []
    worker.terminate()
    log = finish(worker)
    assert "was revoked while it ran: its retry is cancelled" in log, log[-3000:]


def test_a_revoke_on_a_store_past_its_memory_fraction_records_nothing_and_cancels(caplog):
    """Recorded revokes take memory for hours: past ``delayq_max_memory_fraction`` (the
    broker's Redis, by default) none is written, and the stored jobs are still cancelled."""
    caplog.set_level(logging.WARNING, logger="celery_delayq.revoke")  # whatever the root's
    with RedisServer() as server:
        app = Celery("revoke-full", broker=f"{server.url}/0", set_as_current=False)
        app.conf.delayq_max_memory_fraction = 0.5  # far from maxmemory: the cancel runs
        delayq = DelayQ(app)
        try:
            job = delayq.schedule("tests.proj.record", ("x",), delay=600)
            client = redis.Redis(port=server.port)
            used = client.info("memory")["used_memory"]
            client.config_set("maxmemory", used * 3 // 2)  # 67 % used
            time.sleep(1.1)  # the store reads its memory about once a second (memory.py)

            assert delayq.revoke([job.id, *(f"gone-{n}" for n in range(1000))]) == 1

            assert client.keys("*revoked*") == []
            assert "could not record the revoke of 1,001 tasks in the store" in caplog.text
            client.close()
        finally:
            delayq.store.close()


def test_a_call_of_a_revoked_run_that_is_no_retry_marks_no_later_retry_revoked(
        proj, delayq, redis_client):
    """``Task.replace`` or ``apply_async(task_id=self.request.id)`` of a revoked run is
    cancelled too, but no retry follows: once the run ends, a later retry of that id (sent
    again after the revoke expired) is recorded as Celery records it."""
    result = proj.record.apply_delayed(("x",), delay=600)
    call = Call(job_id=result.job_id, task_id=result.id, task=proj.record.name, key=None,
                envelope="")
    delayq.store.remember_revoked([result.id], 60)
    revoke.drop_retry_if_revoked(delayq, call)
    assert delayq.get(result.job_id) is None
    signals.task_postrun.send(sender=proj.record, task_id=result.id, task=proj.record)

    proj.app.backend.mark_as_retry(result.id, ValueError("again"))
    signals.task_retry.send(sender=proj.record, request=Context(id=result.id))

    assert proj.app.AsyncResult(result.id).state == "RETRY"


def test_a_delayed_results_revoke_is_recorded_as_app_control_revokes_are(proj, delayq):
    result = proj.record.apply_delayed(("x",), delay=600)
    assert not delayq.store.revoked(result.id)
    result.revoke()
    assert delayq.store.revoked(result.id) and delayq.get(result.job_id) is None
