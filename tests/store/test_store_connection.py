"""The store's client of one Redis server (connection.StoreRedis), which keeps a connection
at hand for script calls: whoever shares the client, each call gets its own reply, on a
connection that works; and a server that fails its connections gives StoreUnavailable,
whatever redis-py version runs it."""

from __future__ import annotations

import os
import select
import signal
import threading
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import CLUSTER
from tests.hanging_up import HangingUp

pytestmark = pytest.mark.skipif(CLUSTER, reason="the store on one Redis server")


def make_app(url: str, **conf) -> tuple[Celery, DelayedTask]:
    app = Celery("connection", broker=f"{url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url=f"{url}/0", **conf)

    @app.task(base=DelayedTask, name="connection.probe", shared=False)
    def probe(n):
        return n

    DelayQ(app)
    return app, probe


def pending(delayq: DelayQ) -> int:
    return sum(row["pending"] for row in delayq.store.stats())


def assert_due_in(result, seconds: float) -> None:
    """The due time the store answered is the one this call asked for (within 5 s)."""
    expected = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    assert abs((result.eta - expected).total_seconds()) < 5, (result.eta, expected)


def test_a_call_after_redis_closed_the_connection_succeeds_without_retries():
    with RedisServer(appendonly=True) as server:
        app, probe = make_app(server.url, delayq_redis_retries=0)
        probe.apply_delayed((1,), delay=60)
        server.restart()  # the connection the client holds is closed by the server
        assert_due_in(probe.apply_delayed((2,), delay=120), 120)
        assert pending(DelayQ.of(app)) == 2
        app.close()


def test_threads_sharing_a_store_each_get_the_reply_to_their_own_call(proj, redis_client):
    errors: list[BaseException] = []

    def schedule(thread: int) -> None:
        try:
            for n in range(150):
                delay = 3600 * (thread + 1) + n  # an answer to another call is hours off
                assert_due_in(proj.record.apply_delayed((n,), delay=delay), delay)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=schedule, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert pending(proj.delayq) == 6 * 150


def connections(server: RedisServer) -> int:
    """Connections the server has open, less the one asking."""
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.info("clients")["connected_clients"]) - 1
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_schedules_on_a_connection_of_its_own():
    with RedisServer() as server:
        app, probe = make_app(server.url)
        probe.apply_delayed((0,), delay=60)  # the parent's connection is at hand
        before = connections(server)
        go, done = os.pipe(), os.pipe()
        child = os.fork()
        if child == 0:
            status = 1  # a call failed
            try:
                assert_due_in(probe.apply_delayed((1,), delay=7200), 7200)
                own = connections(server) == before + 1
                os.write(done[1], b"\x00" if own else b"\x02")
                os.read(go[0], 1)  # then both processes call at once
                for n in range(500):
                    assert_due_in(probe.apply_delayed((n,), delay=7200 + n), 7200 + n)
                status = 0
            finally:
                os.write(done[1], bytes([status]))
                os._exit(status)
        try:
            first = os.read(done[0], 1)
            assert first != b"\x02", "the child called on the parent's connection"
            assert first == b"\x00", "the child's first call failed"
            os.write(go[1], b"go")
            for n in range(500):
                assert_due_in(probe.apply_delayed((n,), delay=60 + n), 60 + n)
            ready, _, _ = select.select([done[0]], [], [], 60)
            assert ready and os.read(done[0], 1) == b"\x00", "the child's calls failed"
        finally:
            os.kill(child, signal.SIGKILL)  # gone already, unless a step above failed
            os.waitpid(child, 0)
        assert pending(DelayQ.of(app)) == 1002
        app.close()


def test_a_store_that_hangs_up_on_every_connection_is_reported_unavailable():
    hanging_up = HangingUp()
    app, probe = make_app(hanging_up.url, delayq_redis_retries=1,
                          delayq_redis_socket_timeout=0.5)
    with pytest.raises(StoreUnavailable, match="is unavailable after 1 retries"):
        probe.apply_delayed((1,), delay=60)
    with pytest.raises(StoreUnavailable, match="is unavailable after 1 retries"):
        DelayQ.of(app).pending()
    app.close()
    hanging_up.close()


def test_calls_on_a_server_gone_connect_at_most_once_per_try():
    server = RedisServer().start()
    app, probe = make_app(server.url, delayq_redis_retries=2, delayq_redis_socket_timeout=0.5)
    probe.apply_delayed((1,), delay=60)  # the connection at hand is connected
    server.stop()
    hanging_up = HangingUp(server.port)  # in its place: each try's connection is counted
    try:
        for _ in range(3):
            before = hanging_up.accepted()
            with pytest.raises(StoreUnavailable):
                probe.apply_delayed((2,), delay=60)
            tries = hanging_up.accepted() - before
            assert 1 <= tries <= 3, f"{tries} connections: more than one per try (1 + 2 retries)"
    finally:
        hanging_up.close()
        server.close()
        app.close()


def test_a_sentinel_that_finds_no_master_is_told_in_a_line_not_a_clients_description():
    """redis-py's MasterNotFoundError carries a kilobyte of its client's pool and
    connection options; the admin showed all of it on every page while Sentinel was away."""
    app = Celery("sentinel-away", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(delayq_redis_retries=1, delayq_redis_socket_timeout=0.3,
                    delayq_redis_url="sentinel://127.0.0.1:1",
                    delayq_redis_transport_options={"master_name": "shop"})
    with pytest.raises(StoreUnavailable) as away:
        DelayQ(app).schedule("t", delay=5)
    said = str(away.value)
    assert "No master found for 'shop'" in said and "Connection refused" in said
    assert "ConnectionPool" not in said and len(said) < 400, said
