"""Worker journal events in odd cases: headers of the wrong type in a message, and a store's
Redis that refuses writes for a while (a read-only replica after a failover, a failed RDB
save)."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import redis

from celery_delayq import journal
from celery_delayq.keys import pack_id
from celery_delayq.testing.redis_server import free_port
from tests.conftest import wait_for
from tests.ops.test_worker_events import store_of_its_own


def test_a_message_with_delayq_headers_of_the_wrong_type_leaves_the_workers_journal_working(
        proj, delayq, redis_client, spawn):
    """One message (forged, or made by hand) whose delayq headers are not what a carrier
    sends: it is journaled without the fields it got wrong, or not at all when its job id
    is no text (a warning names its task id); the worker's later events are all written."""
    queue = "odd-headers"
    worker = spawn("worker", "-Q", queue, "-P", "solo", "-l", "info", "--without-heartbeat",
                   "--without-gossip", "--without-mingle")
    no_job = {"job-int": 5, "job-list": ["x"], "job-surrogate": "\ud800", "job-dict": {"a": 1}}
    odd_fields = {"key-dict": {"delayq_key": {"a": 1}}, "due-list": {"delayq_due": [1]},
                  "key-surrogate": {"delayq_key": "\udc80"}, "retries-dict": {"retries": {}}}
    sent = {}
    for label, job in no_job.items():
        sent[label] = proj.app.send_task("tests.proj.record", (label,), queue=queue, headers={
            "delayq_job": job, "delayq_shard": 0}).id
    for label, headers in odd_fields.items():
        sent[label] = proj.app.send_task("tests.proj.record", (label,), queue=queue, headers={
            "delayq_job": label, "delayq_shard": 0, **headers}).id
    ran = lambda labels: {json.loads(run)["label"] for run in  # noqa: E731
                          redis_client.lrange(proj.RUNS, 0, -1)} >= set(labels)
    wait_for(lambda: ran(sent), timeout=30, what="the odd messages to run")
    healthy = [f"healthy-{n}" for n in range(3)]
    for label in healthy:
        proj.app.send_task("tests.proj.record", (label,), queue=queue, headers={
            "delayq_job": label, "delayq_shard": 0, "delayq_key": "k", "delayq_due": 1})

    def events() -> dict[str, list[dict[str, str]]]:
        by_job: dict[str, list[dict[str, str]]] = {}
        for _, fields in redis_client.xrange(delayq.store.keys.shard(0).journal):
            by_job.setdefault(fields.get("job", ""), []).append(fields)
        return by_job

    journaled = lambda: all(  # noqa: E731
        [e["event"] for e in events().get(pack_id(job), [])] == ["started", "succeeded"]
        for job in [*healthy, *odd_fields])
    try:
        wait_for(journaled, timeout=20, what="the events of the later jobs")
    except BaseException:
        print(events(), worker.log.read_text())
        raise
    written = events()
    for label in odd_fields:  # the fields it got wrong are left out, the others written
        assert all(e["task_id"] == sent[label] for e in written[label]), written[label]
    assert {e["key"] for e in written["key-dict"] + written["key-surrogate"]} == {""}
    assert {e["due"] for e in written["due-list"]} == {""}
    assert {e["retries"] for e in written["retries-dict"]} == {"0"}
    assert {e["key"] for job in healthy for e in written[job]} == {"k"}
    assert {e["due"] for job in healthy for e in written[job]} == {"1"}
    log = worker.log.read_text()
    assert "holding worker events" not in log, log
    for label in no_job:  # once a run, not for each of its events
        assert f"task {sent[label]} has a delayq_job header that is no job id" in log, log
    assert "succeeded not journaled" not in log, log


def test_worker_events_redis_could_not_be_sent_are_dropped_one_by_one_and_the_others_written(
        delayq, redis_client, caplog):
    """Fields no Redis command can carry (a caller's mistake) drop that one event, said
    once, not the whole flush; nothing is held as if Redis were away."""
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")
    shard = delayq.store.keys.shard(0)
    good = {"task": "tests.proj.record", "key": "", "task_id": "t", "retries": 0, "due": ""}
    bad = [{"job": 5}, {"job": ["x"]}, {"job": "\ud800"}, {"job": "j", "key": {"a": 1}},
           {"job": "j", "due": [1]}]
    journal.record_event(delayq, 0, "started", {**good, "job": "first"})
    for fields in bad:
        journal.record_event(delayq, 0, "started", {**good, **fields, "task_id": "bad"})
    journal.record_event(delayq, 0, "started", {**good, "job": "last"})
    journal.flush()
    assert [fields["job"] for _, fields in redis_client.xrange(shard.journal)] == [
        "first", "last"]
    dropped = [r for r in caplog.records if "could not journal" in r.getMessage()]
    assert len(dropped) == len(bad), caplog.text
    assert "holding worker events" not in caplog.text
    journal.record_event(delayq, 0, "succeeded", {**good, "job": "next"})
    wait_for(lambda: redis_client.xlen(shard.journal) == 3, timeout=5,
             what="the flush thread to write the next event")


def test_a_write_failing_for_a_reason_not_redis_drops_only_the_events_it_fails_for(
        delayq, redis_client, caplog, monkeypatch):
    """Whatever a client fault raises (not the store's Redis away), the flush is written
    one event at a time: the events it fails for go, each said once, the others are
    written, and nothing waits as if Redis were away."""
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")
    shard = delayq.store.keys.shard(0)
    journal_many = delayq.store.journal_many

    def failing(entries, token=None):
        if any(fields.get("task_id") == "faulty" for _, _, fields in entries):
            raise TypeError("a fault of the client")
        return journal_many(entries, token)

    monkeypatch.setattr(delayq.store, "journal_many", failing)
    good = {"task": "tests.proj.record", "key": "", "task_id": "t", "retries": 0, "due": ""}
    for job in ("first", "faulty", "last"):
        journal.record_event(delayq, 0, "started",
                             {**good, "job": job, "task_id": "faulty" if job == "faulty"
                              else "t"})
    journal.flush()
    assert [fields["job"] for _, fields in redis_client.xrange(shard.journal)] == [
        "first", "last"]
    assert caplog.text.count("could not journal the started event of task faulty") == 1
    assert "holding worker events" not in caplog.text


@contextlib.contextmanager
def _own_store(caplog):
    with store_of_its_own(caplog) as (delayq, server), \
            contextlib.closing(redis.Redis(port=server.port)) as client:
        delayq.store.client.ping()  # the store's record written while it takes writes
        yield delayq, client, server


def _refused_then_written(delayq, client, refusing, taking, caplog) -> None:
    journal_key = delayq.store.keys.shard(0).journal
    refusing()
    for n in range(3):
        journal.record_event(delayq, 0, "started", {"job": f"order:{n}:close",
                                                    "task": "tests.proj.record"})
    journal.flush()
    assert client.xlen(journal_key) == 0
    assert "3 worker events not written" in caplog.text, caplog.text
    assert "could not journal" not in caplog.text
    taking()
    wait_for(lambda: client.xlen(journal_key) == 3, timeout=10,
             what="the held events, once Redis takes writes again")


def test_worker_events_refused_by_a_read_only_replica_are_written_once_it_takes_writes(
        caplog):
    """A failover that demoted the store's Redis: its refusals are kept as for a Redis
    that is away or full, and written once it is a master again."""
    with _own_store(caplog) as (delayq, client, _):
        _refused_then_written(
            delayq, client, lambda: client.execute_command("REPLICAOF", "127.0.0.1",
                                                           free_port()),
            lambda: client.execute_command("REPLICAOF", "NO", "ONE"), caplog)


def test_worker_events_refused_after_a_failed_rdb_save_are_written_once_it_saves(caplog):
    """MISCONF (stop-writes-on-bgsave-error): the store's Redis refuses writes until a
    snapshot succeeds; the events wait for it."""
    with _own_store(caplog) as (delayq, client, server):
        in_the_way = os.path.join(server.directory, "dump.rdb")

        def save() -> str:
            client.bgsave()
            wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0,
                     timeout=10, what="the snapshot to end")
            return client.info("persistence")["rdb_last_bgsave_status"]

        def refusing() -> None:
            client.config_set("save", "3600 1")
            os.mkdir(in_the_way)  # the snapshot cannot be renamed onto a directory
            assert save() == "err"

        def taking() -> None:
            os.rmdir(in_the_way)
            assert save() == "ok"

        try:
            _refused_then_written(delayq, client, refusing, taking, caplog)
        finally:  # else the server refuses to stop: it cannot save
            client.config_set("save", "")
            if os.path.isdir(in_the_way):
                os.rmdir(in_the_way)
