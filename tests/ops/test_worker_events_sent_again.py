"""A batch of worker events whose write is sent again is written once (docs/reliability.md,
"Lost replies"): Redis stalls longer than the store's socket timeout (``DEBUG SLEEP``), the
client gives up on the reply and the write is sent again, by redis-py's retry or by the
outbox holding the batch for its next write; Redis runs every copy once it wakes."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator

import redis

from celery_delayq import journal
from celery_delayq.keys import unpack_id
from celery_delayq.testing.redis_server import RedisServer, binary
from tests.conftest import wait_for

SOCKET_TIMEOUT = 0.5
EVENT = {"task": "tests.proj.record", "key": "", "task_id": "t", "retries": 0, "due": ""}


def _debug_allowed() -> tuple[str, ...]:
    """The option Redis 7 needs for ``DEBUG`` (6.2 knows no such option)."""
    version = subprocess.run([binary(), "--version"], capture_output=True, text=True).stdout
    major = int(version.split("v=", 1)[1].split(".", 1)[0])
    return ("--enable-debug-command", "yes") if major >= 7 else ()


@contextlib.contextmanager
def stalling_store(retries: int) -> Iterator[tuple[object, redis.Redis]]:
    """A DelayQ of 2 shards on a redis-server of its own, waiting ``SOCKET_TIMEOUT`` for a
    reply and sending a call again ``retries`` times, and a client of that server."""
    from celery import Celery

    from celery_delayq import DelayQ

    with RedisServer(extra=_debug_allowed()) as server, \
            contextlib.closing(redis.Redis(port=server.port, decode_responses=True)) as client:
        app = Celery("stalling-store", broker=f"{server.url}/0", set_as_current=False)
        app.conf.update(delayq_redis_retries=retries, delayq_shards=2,
                        delayq_redis_socket_timeout=SOCKET_TIMEOUT)
        delayq = DelayQ(app)
        delayq.store.client.ping()  # the store's record written while Redis answers
        try:
            yield delayq, client
        finally:
            journal.flush()  # nothing of this server's left in the outbox
            delayq.store.close()


@contextlib.contextmanager
def redis_asleep(client: redis.Redis, seconds: float) -> Iterator[None]:
    """Redis answers nobody for ``seconds`` (from just before the block begins)."""
    with contextlib.closing(redis.Redis(port=client.connection_pool.connection_kwargs["port"],
                                        socket_timeout=seconds + 10)) as sleeper:
        thread = threading.Thread(target=sleeper.execute_command,
                                  args=("DEBUG", "SLEEP", seconds))
        thread.start()
        time.sleep(0.1)  # Redis is asleep
        try:
            yield
        finally:
            thread.join()


def journaled(delayq, client: redis.Redis) -> Counter[tuple[int, str, str]]:
    """How often each (shard, event, job) is in the journals."""
    return Counter((shard.shard, fields["event"], unpack_id(fields["job"]))
                   for shard in delayq.store.keys
                   for _, fields in client.xrange(shard.journal))


def test_a_batch_of_worker_events_redis_py_sends_again_after_a_stall_is_written_once():
    with stalling_store(retries=3) as (delayq, client):
        entries = [(shard, event, {**EVENT, "job": f"job-{n}"})
                   for n, shard in enumerate([0, 1, 0])
                   for event in ("started", "succeeded")]
        with redis_asleep(client, 2 * SOCKET_TIMEOUT):  # the second try gets the reply
            assert delayq.store.journal_many(entries) == []
        assert journaled(delayq, client) == Counter(
            (shard, event, fields["job"]) for shard, event, fields in entries)


def test_worker_events_the_outbox_holds_after_a_write_timed_out_are_written_once(caplog):
    """The write that timed out ran once Redis woke; the outbox, which held its events,
    writes them again, and events recorded meanwhile are written too."""
    with stalling_store(retries=0) as (delayq, client):
        with redis_asleep(client, 3 * SOCKET_TIMEOUT):
            for n in range(3):
                journal.record_event(delayq, n % 2, "succeeded", {**EVENT, "job": f"job-{n}"})
            journal.flush()  # times out: the events are held
            assert "3 worker events not written" in caplog.text, caplog.text
            journal.record_event(delayq, 1, "succeeded", {**EVENT, "job": "job-3"})
        expected = Counter({(n % 2, "succeeded", f"job-{n}"): 1 for n in range(4)})
        wait_for(lambda: set(journaled(delayq, client)) == set(expected), timeout=10,
                 what="every event, once Redis answers again")
        journal.flush()  # whatever the outbox still held is written by now
        assert journaled(delayq, client) == expected
