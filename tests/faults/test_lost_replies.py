"""Calls Redis ran whose reply came too late: later than ``delayq_redis_socket_timeout``.
redis-py sends such a call again on a new connection (``delayq_redis_retries``), so Redis
runs it twice: the answer the caller gets must still be the first run's.

A proxy between the store and Redis forwards every call and, when armed, swallows the
reply to the next call that names a given script, so the client times out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.scripts import SCRIPTS
from celery_delayq.store import CancelOutcome
from tests.conftest import CLUSTER, journal_events, wait_for

pytestmark = pytest.mark.skipif(CLUSTER, reason="the proxy stands before one Redis server")

PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)


class LosingProxy:
    """A TCP proxy to a Redis server that swallows the reply to one armed call."""

    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._marker: bytes | None = None
        self._cutting: bytes | None = None  # connections sending this are cut: no call runs
        self._lock = threading.Lock()
        self.lost = self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_reply_to(self, script: str) -> None:
        """Lose the reply to the next call of this script (its SHA in the request)."""
        with self._lock:
            self._marker = SCRIPTS[script].sha.encode()

    def cut_calls_to(self, script: str | None) -> None:
        """Until called again with None, cut each connection that sends a call of this
        script, before Redis gets it: the call never runs, its caller sees a broken
        connection (as when a cluster slot moves, the call is refused)."""
        with self._lock:
            self._cutting = None if script is None else (  # its EVALSHA (not SCRIPT EXISTS)
                b"EVALSHA\r\n$40\r\n" + SCRIPTS[script].sha.encode())

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            losing = threading.Event()  # this connection's next reply is lost
            threading.Thread(target=self._requests, args=(client, server, losing),
                             daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, losing),
                             daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket,
                  losing: threading.Event) -> None:
        while data := _recv(client):
            with self._lock:
                if self._cutting is not None and self._cutting in data:
                    self.cut += 1
                    break
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    losing.set()
            try:
                server.sendall(data)
            except OSError:
                break
        _close(client, server)

    def _replies(self, server: socket.socket, client: socket.socket,
                 losing: threading.Event) -> None:
        lost = False
        while data := _recv(server):
            if losing.is_set() and not lost:  # Redis ran the call; its caller never hears
                lost = True  # of it: this connection's replies are swallowed until it times out
                self.lost += 1
            if lost:
                continue
            try:
                client.sendall(data)
            except OSError:
                break
        _close(client, server)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@pytest.fixture
def lossy(redis_server, redis_client) -> Iterator[tuple[DelayQ, DelayedTask, LosingProxy]]:
    """A store reached through a LosingProxy, a task of it, and the proxy."""
    for script in SCRIPTS.values():  # loaded: the lost reply is a run's, not a NOSCRIPT
        redis_client.script_load(script.source)
    proxy = LosingProxy(redis_server.port)
    app = Celery("lossy", broker=f"{redis_server.url}/1", set_as_current=False)
    app.conf.update(delayq_redis_url=f"redis://127.0.0.1:{proxy.port}/0", delayq_shards=4,
                    delayq_redis_socket_timeout=0.5)

    @app.task(base=DelayedTask, name="lossy.noop", shared=False)
    def noop(n):
        return n

    delayq = DelayQ(app)
    yield delayq, noop, proxy
    delayq.store.close()
    proxy.close()


@pytest.fixture
def broker(redis_server) -> redis.Redis:
    """The lossy app's broker database, emptied."""
    client = redis.Redis.from_url(f"{redis_server.url}/1")
    client.flushdb()
    return client


def test_a_cancel_whose_reply_was_lost_still_answers_cancelled(lossy):
    delayq, noop, proxy = lossy
    noop.apply_delayed((1,), delay=600, job_id="j")
    proxy.lose_reply_to("cancel")
    assert delayq.cancel_outcome("j") is CancelOutcome.CANCELLED
    assert proxy.lost == 1 and delayq.get("j") is None


def test_a_cancel_by_key_whose_reply_was_lost_still_counts_what_it_cancelled(lossy):
    delayq, noop, proxy = lossy
    for n in range(3):
        noop.apply_delayed((n,), delay=600, key="order:9")
    proxy.lose_reply_to("cancel")
    assert delayq.cancel_key("order:9") == 3
    assert proxy.lost == 1 and delayq.pending() == []


def test_a_schedule_whose_reply_was_lost_is_no_conflict_with_itself(lossy):
    delayq, noop, proxy = lossy
    proxy.lose_reply_to("schedule")
    result = noop.apply_delayed((1,), delay=600, job_id="j", if_exists="error")
    assert proxy.lost == 1
    (job,) = delayq.pending()
    assert (job.job_id, job.task_id, job.args) == ("j", result.id, [1])


@pytest.mark.parametrize("job_id,if_exists", [("j", "keep"), ("j", "replace"), (None, "keep")],
                         ids=["keep", "replace", "drawn"])
def test_a_schedule_whose_reply_was_lost_stores_nothing_again_once_published(
        lossy, broker, job_id, if_exists):
    """A job due at once is published and acked before redis-py sends the call again:
    the second run stored it again, so it was published twice (or a cancel then said
    CANCELLED for a task already in the broker). It answers the first run's reply now."""
    delayq, noop, proxy = lossy
    proxy.lose_reply_to("schedule")
    called: list = []
    producer = threading.Thread(target=lambda: called.append(noop.apply_delayed(
        (1,), delay=0, queue="lossy.q", job_id=job_id, if_exists=if_exists)))
    producer.start()
    run_carrier_until(Carrier(delayq.app), broker, "lossy.q", 1)  # before the call returns
    producer.join(10)
    (result,) = called
    assert proxy.lost == 1
    assert delayq.pending() == [] and delayq.cancel(result.job_id) is False
    run_carrier_until(Carrier(delayq.app), broker, "lossy.q", 2, seconds=1.5)
    published = [json.loads(raw)["headers"]["id"] for raw in broker.lrange("lossy.q", 0, -1)]
    assert published == [result.id]


def test_a_kept_call_of_a_job_being_promoted_answers_again_when_sent_twice(
        redis_server, redis_client, monkeypatch):
    """The kept job has no due time (a carrier holds it): the reply read back from the
    call's answer key (kept for a call with a job due within the resend window), when
    redis-py sent the very call again, was cut short there: a bare IndexError for calls
    that were stored. (One shard: the call goes alone, not in a reservation's pipeline.)"""
    app = Celery("twice", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=1, delayq_prefix="twice")
    delayq = DelayQ(app)
    store = delayq.store
    delayq.schedule("twice.noop", ["a"], job_id="a", eta=PAST)
    assert [job for claim in store.claim(list(store.keys), 10, 60_000) for job in claim.jobs]
    client_type, sha = type(store.client), SCRIPTS["schedule"].sha
    ask = client_type._ask

    def sent_twice(self, connection, *command):  # Redis ran the first; its reply was lost
        if command[:2] == ("EVALSHA", sha):
            ask(self, connection, *command)
        return ask(self, connection, *command)

    monkeypatch.setattr(client_type, "_ask", sent_twice)
    kept, new = delayq.schedule_many("twice.noop", [  # one call: a job due at once
        {"args": ["a"], "delay": 600, "job_id": "a"},
        {"args": ["b"], "delay": 0, "job_id": "b"}], if_exists="keep")
    assert (kept.eta, new.eta == delayq.get("b").due) == (None, True)
    store.close()


def dead_letter(delayq, noop) -> None:
    noop.apply_delayed((1,), eta=PAST, job_id="j")
    store = delayq.store
    (claim,) = [claim for claim in store.claim(list(store.keys), 10, 60_000) if claim.jobs]
    assert store.dead_letter(claim.shard, claim.jobs[0], "cannot publish")


def test_a_replay_whose_reply_was_lost_still_answers_replayed(lossy):
    delayq, noop, proxy = lossy
    dead_letter(delayq, noop)
    proxy.lose_reply_to("replay")
    assert delayq.store.replay("j") is True
    assert proxy.lost == 1 and [job.job_id for job in delayq.pending()] == ["j"]


def test_a_drop_whose_reply_was_lost_still_answers_dropped(lossy):
    delayq, noop, proxy = lossy
    dead_letter(delayq, noop)
    proxy.lose_reply_to("drop")
    assert delayq.store.drop("j", by="test") is True
    assert proxy.lost == 1 and delayq.store.dead() == []


def run_carrier_until(carrier: Carrier, broker: redis.Redis, queue: str, count: int,
                      seconds: float = 15) -> None:
    """Serve the store until ``count`` messages are on ``queue`` (``seconds`` at most)."""
    started = time.monotonic()
    try:
        while broker.llen(queue) < count and time.monotonic() - started < seconds:
            time.sleep(min(carrier.run_once(), 0.05))
    finally:
        carrier.close()


def test_an_ack_whose_reply_was_lost_journals_each_job_promoted_once(lossy, broker):
    delayq, noop, proxy = lossy
    for n in range(5):
        noop.apply_delayed((n,), eta=PAST, queue="lossy.q", job_id=f"j{n}")
    proxy.lose_reply_to("ack")
    run_carrier_until(Carrier(delayq.app), broker, "lossy.q", 5)
    assert proxy.lost == 1 and broker.llen("lossy.q") == 5
    assert journal_events(delayq).count("promoted") == 5


def test_an_ack_redis_did_not_take_is_sent_again_not_dropped(lossy, broker):
    """A refused ack (here its connection cut on every try; on a cluster, its shard's slot
    moving) was dropped: the batch's leases ran out and every job was published twice."""
    delayq, noop, proxy = lossy
    for n in range(5):
        noop.apply_delayed((n,), eta=PAST, queue="lossy.q", job_id=f"j{n}")
    proxy.cut_calls_to("ack")
    carrier = Carrier(delayq.app, lease=3.0)
    serving = threading.Thread(target=carrier.run)
    serving.start()
    try:
        wait_for(lambda: broker.llen("lossy.q") == 5 and proxy.cut, what="a refused ack")
        time.sleep(1.5)  # past redis-py's tries (0.7 s): the carrier pauses, tries again
        proxy.cut_calls_to(None)
        time.sleep(4)  # past the lease: a batch not acked is recovered and published again
    finally:
        carrier.stop()
        serving.join(10)
    assert broker.llen("lossy.q") == 5 and carrier.stats.recovered == 0
    assert journal_events(delayq).count("promoted") == 5


def test_a_replace_whose_index_clean_up_fails_is_still_a_stored_replace(lossy, caplog):
    """Forgetting the replaced task id's index is one more round trip after the write: its
    failure was raised, and the caller took the stored call for a failed one."""
    delayq, noop, proxy = lossy
    caplog.set_level(logging.WARNING, "celery_delayq")  # (an earlier test may raise it)
    noop.apply_delayed((1,), delay=600, job_id="order:1:close")
    proxy.cut_calls_to("unindex")
    try:
        again = noop.apply_delayed((2,), delay=600, job_id="order:1:close",
                                   if_exists="replace")
    finally:
        proxy.cut_calls_to(None)
    assert proxy.cut and [job.args for job in delayq.pending()] == [[2]]
    assert delayq.revoke([again.id]) == 1
    assert "could not forget the task id index of 1 job" in caplog.text


def test_jobs_of_a_claim_whose_reply_was_lost_are_published_once_a_lease_later(
        lossy, broker):
    """The claim ran (its jobs are leased) but the carrier never saw them: the claim sent
    again finds nothing more, and the leased jobs come back when their lease ends."""
    delayq, noop, proxy = lossy
    for n in range(5):
        noop.apply_delayed((n,), eta=PAST, queue="lossy.q", job_id=f"j{n}")
    proxy.lose_reply_to("claim_due")
    started = time.monotonic()
    run_carrier_until(Carrier(delayq.app, lease=1.0), broker, "lossy.q", 5)
    published = [json.loads(raw)["headers"]["delayq_job"]
                 for raw in broker.lrange("lossy.q", 0, -1)]
    assert proxy.lost == 1
    assert sorted(published) == [f"j{n}" for n in range(5)]  # each once
    assert time.monotonic() - started >= 1.0  # after the lease the lost claim took
