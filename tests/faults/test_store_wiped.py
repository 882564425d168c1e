"""A store wiped under a running carrier (its Redis restarted empty without persistence, or
FLUSHALL): the carrier notices at its next maintenance round, since the ``id`` it read in
``delayq:meta`` is gone. It logs an ERROR once (the stored jobs, pauses and rate limits set
by hand are gone; what to do), sets ``delayq_rate_limits`` again, and writes the shard count
again, so a producer with another ``delayq_shards`` is refused. A ``meta`` that records
another shard count, or a store format this version does not know, stops the carrier with
the ConfigurationError, as it refuses a start."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.errors import ConfigurationError
from celery_delayq.store.base import FORMAT
from celery_delayq.testing.redis_server import RedisServer
from tests.carrier.test_rate_limit import busiest_second, promotions
from tests.conftest import CLUSTER, command_calls, wait_for

pytestmark = pytest.mark.skipif(CLUSTER, reason="a Redis of its own, wiped")

QUEUE = "wiped"
RATE = 10  # jobs a second: 40 due at once take ~4 s


@pytest.fixture
def server():
    """A Redis that keeps nothing on disk: a restart brings it back empty."""
    with RedisServer(appendonly=False) as server:
        yield server


def make_app(server: RedisServer, shards: int = 4, **conf) -> tuple[DelayQ, DelayedTask]:
    """A DelayQ on ``server`` (broker and store) and its task."""
    app = Celery("wiped", broker=f"{server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=shards, delayq_idle_timeout=0.5, delayq_redis_retries=2,
                    delayq_redis_socket_timeout=1.0,
                    broker_connection_retry_on_startup=True, **conf)

    @app.task(base=DelayedTask, name="wiped.noop", shared=False)
    def noop(i):
        return i

    return DelayQ(app), noop


@contextlib.contextmanager
def running(carrier: Carrier) -> Iterator[list[BaseException]]:
    """``carrier.run()`` in a thread for the block; the list holds what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            carrier.run()
        except BaseException as exc:  # what the test looks at
            raised.append(exc)

    thread = threading.Thread(target=run, name="carrier", daemon=True)
    thread.start()
    try:
        yield raised
    finally:
        carrier.stop()
        thread.join(10)
        assert not thread.is_alive(), "the carrier did not stop"


def serving(carrier: Carrier) -> bool:
    return len(carrier.ownership.owned) == carrier.store.keys.shards


def wipe(server: RedisServer, how: str) -> None:
    if how == "flushall":
        redis.Redis(port=server.port).flushall()
    else:
        server.restart()  # no AOF, no snapshot: back empty


def errors(caplog) -> list[str]:
    """The ERRORs logged, but a restart's "carrier paused" (Redis away a moment)."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
            and not r.getMessage().startswith("carrier paused:")]


@pytest.mark.parametrize("how", ["flushall", "restart"])
def test_a_wiped_store_is_logged_once_and_its_rate_limits_are_set_again(server, caplog, how):
    delayq, noop = make_app(server, delayq_rate_limits={QUEUE: f"{RATE}/s"})
    carrier = Carrier(delayq.app)
    with caplog.at_level(logging.INFO, logger="celery_delayq"), running(carrier):
        wait_for(lambda: serving(carrier) and delayq.rate_limits(), what="the carrier")
        delayq.pause(task="wiped.other")
        wipe(server, how)
        wait_for(lambda: delayq.rate_limits() == {QUEUE: f"{RATE}/s"}, timeout=5,
                 what="delayq_rate_limits set again")
        assert delayq.paused() == {"tasks": [], "queues": []}  # gone, as the log says
        noop.apply_delayed_many([{"args": (n,), "delay": 0} for n in range(40)], queue=QUEUE)
        wait_for(lambda: len(promotions(delayq)) == 40, timeout=20, what="40 promotions")
    said = errors(caplog)
    assert len(said) == 1, said
    assert "Redis lost the store's data" in said[0]
    for words in ("jobs stored before are gone", "pauses and rate limits set by hand",
                  "delayq_rate_limits are set again", "appendonly yes",
                  "manage.py delayq_reconcile --missing", "docs/operations.md"):
        assert words in said[0], (words, said[0])
    times = [at for at, _, _ in promotions(delayq).values()]
    shards = delayq.store.keys.shards
    assert busiest_second(times) <= RATE + shards, times  # one bucket per shard of slack
    assert redis.Redis(port=server.port).llen(QUEUE) == 40  # none lost on the way


def test_after_a_wipe_a_producer_with_another_shard_count_is_refused(server, caplog):
    delayq, _ = make_app(server)
    carrier = Carrier(delayq.app)
    client = redis.Redis(port=server.port, decode_responses=True)
    with caplog.at_level(logging.INFO, logger="celery_delayq"), running(carrier):
        wait_for(lambda: serving(carrier), what="the carrier")
        client.flushall()
        wait_for(lambda: client.hget(delayq.store.keys.meta, "shards") == "4", timeout=5,
                 what="the carrier writing its shard count again")
        _, noop = make_app(server, shards=8)
        with pytest.raises(ConfigurationError,
                           match=r"records delayq_shards=4 .*this app says 8"):
            noop.apply_delayed(args=(1,), delay=0)
    assert not any(client.scan_iter("delayq:{[4-7]}:*")), "the refused producer wrote"
    assert len(errors(caplog)) == 1  # the wipe; the refusal is the producer's


def test_a_carrier_whose_store_now_records_another_shard_count_stops_saying_why(
        server, caplog):
    delayq, _ = make_app(server)
    carrier = Carrier(delayq.app)
    client = redis.Redis(port=server.port, decode_responses=True)
    with caplog.at_level(logging.INFO, logger="celery_delayq"), running(carrier) as raised:
        wait_for(lambda: serving(carrier), what="the carrier")
        with client.pipeline() as wiped:  # a producer with 8 shards wrote first
            wiped.flushall().hset(delayq.store.keys.meta, "shards", 8).execute()
        wait_for(lambda: raised, timeout=5, what="the carrier to stop")
    assert isinstance(raised[0], ConfigurationError), raised
    said = errors(caplog)
    assert len(said) == 1, said  # once: it stopped, it does not retry
    for words in ("record delayq:meta changed while this carrier ran",
                  "records delayq_shards=8",
                  "this app says 4", "HSET delayq:meta shards 4"):
        assert words in said[0], (words, said[0])
    assert not any(client.scan_iter("delayq:{*}:owner")), "shard leases left held"
    assert client.hget(delayq.store.keys.meta, "shards") == "8"  # left for the operator


def test_a_store_record_of_an_earlier_version_gets_its_format_and_a_producer_its_refusal(
        server):
    """A store made before ``meta`` held a format (shards only) is of format 1: the first
    process records it. A producer of a version that knows an earlier format only is then
    refused, as one is once a later release moves the store on."""
    client = redis.Redis(port=server.port, decode_responses=True)
    client.hset("delayq:meta", "shards", 4)
    delayq, noop = make_app(server)
    noop.apply_delayed((1,), delay=60)
    assert client.hget("delayq:meta", "format") == str(FORMAT)
    client.hset("delayq:meta", "format", FORMAT + 1)
    _, later = make_app(server)
    with pytest.raises(ConfigurationError, match="newer celery-delayq"):
        later.apply_delayed((2,), delay=60)
    assert [job.args for job in delayq.pending()] == [[1]]


#: meta records written by another process → what a carrier refusing that store says
REFUSED = {
    "another shard count": ({"shards": 8}, r"delayq_shards=8.*this app says 4"),
    "a newer format": ({"shards": 4, "format": FORMAT + 1},
                       rf"store format {FORMAT + 1} .*newer celery-delayq.*knows format "
                       rf"{FORMAT}: upgrade celery-delayq"),
    "a format unknown": ({"format": "x"}, r"'format' holds 'x'.*HSET delayq:meta format 1"),
    "another default queue": ({"queue": "orders"},
                              r"task_default_queue='orders'.*this app says 'celery'"),
}


@pytest.mark.parametrize("record", REFUSED)
def test_a_carrier_refused_at_its_start_says_why_once_and_writes_nothing(
        server, caplog, record):
    meta, refusal = REFUSED[record]
    client = redis.Redis(port=server.port, decode_responses=True)
    client.hset("delayq:meta", mapping=meta)
    delayq, _ = make_app(server)
    with caplog.at_level(logging.INFO, logger="celery_delayq"), \
            pytest.raises(ConfigurationError, match=refusal):
        Carrier(delayq.app).run()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].startswith("stopping the carrier: "), said
    assert sorted(client.scan_iter()) == ["delayq:meta"]


def test_a_carrier_run_in_the_main_thread_leaves_the_signal_handlers_as_they_were(server):
    """Its handlers stayed after ``run()`` returned: in an embedding process (a test run)
    a later Ctrl-C only set the stopped carrier's flag, and the next one ``os._exit``-ed."""
    stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = [signal.getsignal(signum) for signum in stop_signals]
    meta, refusal = REFUSED[next(iter(REFUSED))]
    redis.Redis(port=server.port).hset("delayq:meta", mapping=meta)
    delayq, _ = make_app(server)
    with pytest.raises(ConfigurationError, match=refusal):
        Carrier(delayq.app).run()
    assert [signal.getsignal(signum) for signum in stop_signals] == before


def test_a_maintenance_round_reads_the_store_record_with_one_call(server):
    delayq, _ = make_app(server)
    carrier = Carrier(delayq.app)
    carrier.run_once()  # the first round writes the record's id
    before = {name: command_calls(delayq.store, name) for name in ("hmget", "hsetnx")}
    for _ in range(3):
        carrier._next_maintenance = 0
        carrier.run_once()
    after = {name: command_calls(delayq.store, name) for name in ("hmget", "hsetnx")}
    carrier.close()
    assert after["hmget"] - before["hmget"] == 3
    assert after["hsetnx"] == before["hsetnx"]  # no write while the record is there
