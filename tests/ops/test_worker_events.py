"""Worker journal events cost a task no Redis round trip of its own."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest
from celery import signals

from celery_delayq import journal
from celery_delayq.keys import pack_id
from tests.conftest import wait_for

PAUSE_MS = 2000


def journal_of(delayq, job_ids: list[str], ended_by: str, timeout: float = 20
               ) -> dict[str, list[dict[str, str]]]:
    """Each job's journal entries in order, once each job has an event in ``ended_by``
    (names separated by spaces); fails with what the journal holds."""
    packed = {pack_id(job_id): job_id for job_id in job_ids}
    entries: dict[str, list[dict[str, str]]] = {}

    def ended() -> bool:
        entries.clear()
        for shard in delayq.store.keys:
            for _, fields in delayq.store.client.xrange(shard.journal):
                if fields.get("job") in packed:
                    entries.setdefault(packed[fields["job"]], []).append(fields)
        return all(any(e["event"] in ended_by.split() for e in entries.get(job_id, []))
                   for job_id in job_ids)

    try:
        wait_for(ended, timeout=timeout, what=f"every job's {ended_by} event")
    except BaseException:
        print({job_id: [e["event"] for e in events] for job_id, events in entries.items()})
        raise
    return entries


def test_a_started_event_is_written_without_the_task_waiting_for_redis(delayq, redis_client):
    shard = delayq.store.keys.shard(0)
    event = {"job": "order:1:close", "task": "tests.proj.record", "key": "", "task_id": "t",
             "retries": 0, "due": ""}
    redis_client.client_pause(PAUSE_MS)  # every client's next command waits this long
    began = time.monotonic()
    journal.record_event(delayq, 0, "started", event)
    assert time.monotonic() - began < PAUSE_MS / 2000, "the caller waited for Redis"
    wait_for(lambda: redis_client.xlen(shard.journal) == 1, timeout=10,
             what="the started event, once Redis answers again")


def test_flush_returns_only_once_the_events_the_thread_is_writing_are_written(
        delayq, redis_client):
    shard = delayq.store.keys.shard(0)
    event = {"job": "order:1:close", "task": "tests.proj.record", "key": "", "task_id": "t",
             "retries": 0, "due": ""}
    redis_client.client_pause(500)
    paused = time.monotonic()
    journal.record_event(delayq, 0, "started", event)  # the thread takes it and waits
    time.sleep(0.1)
    journal.flush()  # what a test's cleanup calls before it deletes the store's keys
    assert time.monotonic() - paused >= 0.45, "flush returned while the thread still wrote"
    assert redis_client.xlen(shard.journal) == 1


def test_an_event_whose_shard_header_names_no_shard_is_skipped_and_the_others_written(
        proj, delayq, redis_client, caplog):
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")  # whatever ran before
    task, shards = proj.record, delayq.store.keys.shards
    for n, header in enumerate([shards, 10**9, -1, "x", None, "good"]):
        task.push_request(delayq_job=f"job-{n}", delayq_shard=0 if header == "good" else header,
                          retries=0)
        signals.task_prerun.send(sender=task, task_id=f"t-{n}", task=task)
        task.pop_request()
    journal.flush()

    written = [fields["job"] for shard in delayq.store.keys
               for _, fields in redis_client.xrange(shard.journal)]
    assert written == ["job-5"]
    assert caplog.text.count("has no valid delayq_shard header; started not journaled") == 5


@contextlib.contextmanager
def store_of_its_own(caplog):
    """A DelayQ on a redis-server of its own, which the test may stop and start (no
    retries, a 0.5 s socket timeout), with journal.py's log at INFO."""
    from celery import Celery

    from celery_delayq import DelayQ
    from celery_delayq.testing.redis_server import RedisServer

    caplog.set_level(logging.INFO, logger="celery_delayq.journal")
    with RedisServer() as server:
        app = Celery("own-store", broker=f"{server.url}/0", set_as_current=False)
        app.conf.update(delayq_redis_retries=0, delayq_redis_socket_timeout=0.5)
        delayq = DelayQ(app)
        try:
            yield delayq, server
        finally:
            journal.flush()  # nothing of this server's left in the outbox
            delayq.store.close()


@pytest.mark.parametrize(("end", "said"), [
    ("flush", "3 worker events not written: the store's Redis does not answer"),
    # a stopping worker's (tests/ops/test_worker_stop_flush.py): it ends with the first
    # write that fails, not at the end of its wait
    ("stop", "3 worker events not written as this worker stops (the store's Redis does not "
             "answer)"),
])
def test_events_recorded_while_redis_is_away_are_written_once_it_answers_again(caplog, end,
                                                                               said):
    with store_of_its_own(caplog) as (delayq, server):
        journal_key = delayq.store.keys.shard(0).journal
        server.stop()
        for n in range(3):
            journal.record_event(delayq, 0, "started", {"job": f"order:{n}:close",
                                                        "task": "tests.proj.record"})
        getattr(journal._outbox, end)()
        assert said in caplog.text
        server.start()
        wait_for(lambda: delayq.store.client.xlen(journal_key) == 3, timeout=10,
                 what="the held events, once Redis answers")
        assert [fields["event"] for _, fields in delayq.store.client.xrange(journal_key)] == [
            "started"] * 3
        assert "wrote 3 worker events held while the store's Redis did not answer" in \
            caplog.text


def test_events_dropped_while_redis_is_away_are_logged_once_then_counted(caplog,
                                                                          monkeypatch):
    """Past the events a worker holds, the oldest go: said once per outage (it was said at
    every flush, 10 lines a second for a prefork worker), and counted once Redis answers."""
    monkeypatch.setattr(journal, "_HOLD_AT_MOST", 2)
    with store_of_its_own(caplog) as (delayq, server):
        server.stop()
        for n in range(6):
            journal.record_event(delayq, 0, "started", {"job": f"order:{n}:close",
                                                        "task": "tests.proj.record"})
            journal.flush()
        dropping = [r for r in caplog.records if "oldest worker events" in r.getMessage()]
        assert len(dropping) == 1, caplog.text
        server.start()
        journal.flush()
        assert "dropped 4 worker events while the store's Redis did not answer" in \
            caplog.text
        assert delayq.store.client.xlen(delayq.store.keys.shard(0).journal) == 2


@pytest.mark.parametrize("task", ["flaky", "plain_flaky"])
def test_a_task_retrying_at_once_is_journaled_started_before_its_retry_is_scheduled(
        proj, delayq, carrier, spawn, task):
    """The retry's store write comes after the run's deferred started event, so the
    Django mirror ends the row scheduled, not started (a plain task's retry reaches the
    store through send_task). A worker process of its own: one app, as in production."""
    queue = f"retries-{task}"
    spawn("worker", "-Q", queue, "-P", "threads", "-c", "4", "--without-heartbeat",
          "--without-gossip", "--without-mingle")
    jobs = [getattr(proj, task).apply_async((f"{task} retries at once {n}",),
                                            {"failures": 1, "countdown": 300},
                                            countdown=0.05, queue=queue).job_id
            for n in range(6)]
    for job_id, events in journal_of(delayq, jobs, "retried").items():
        names = [e["event"] for e in events if e["event"] != "promoted"]  # acked any time
        assert names == ["scheduled", "started", "scheduled", "retried"], job_id
