"""A broker that keeps its connections open and stops answering (a partition that drops
packets, a hung proxy): the carrier must not wait on it for ever."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import threading
import time

import pytest
from celery import Celery

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.errors import ConfigurationError
from tests.conftest import ROOT, celery_cli, wait_for
from tests.faults.test_carrier_faults import PARKED, schedule_due_now, store_count
from tests.stalling import StallingProxy

QUEUE = "stalls"
TIMEOUT = 1.0  # delayq_redis_socket_timeout: how long the carrier waits for one reply


@pytest.fixture
def stalling(redis_server, redis_client):
    """An app whose broker is the session's Redis behind a :class:`StallingProxy`; its
    store is that Redis, reached directly."""
    proxy = StallingProxy(redis_server.port)
    app = Celery("stalls", broker=f"{proxy.url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url=f"{redis_server.url}/0", delayq_shards=2,
                    delayq_redis_socket_timeout=TIMEOUT, delayq_lease_seconds=5,
                    delayq_idle_timeout=0.2)
    yield app, proxy
    proxy.close()


def schedule(app, first: int, n: int) -> None:
    for i in range(first, first + n):
        DelayQ.of(app).schedule("stalls.noop", args=[i], delay=0, queue=QUEUE)


def run_carrier(app) -> tuple[Carrier, threading.Thread]:
    carrier = Carrier(app)
    thread = threading.Thread(target=carrier.run, name="carrier", daemon=True)
    thread.start()
    return carrier, thread


def test_a_carrier_whose_broker_stops_answering_pauses_stops_when_asked_and_loses_nothing(
        stalling, redis_client, caplog):
    """Before, it waited on the broker's socket for good: nothing logged, a stop request
    never seen, its claimed jobs' leases running out (another carrier would publish them
    twice)."""
    app, proxy = stalling
    caplog.set_level(logging.INFO, "celery_delayq")
    schedule(app, 0, 10)
    carrier, thread = run_carrier(app)
    wait_for(lambda: redis_client.llen(QUEUE) == 10, what="the first 10 published")

    proxy.stall()
    schedule(app, 10, 10)
    wait_for(lambda: "carrier paused" in caplog.text, timeout=8 * TIMEOUT,
             what="the carrier saying the broker does not answer")
    carrier.stop()
    thread.join(6 * TIMEOUT)
    assert not thread.is_alive(), "the carrier still waits on the broker"
    assert store_count(redis_client, "due") == 10 and store_count(redis_client, "inflight") == 0

    proxy.resume()  # which may deliver what the stalled publish had sent: published twice
    carrier, thread = run_carrier(app)
    wait_for(lambda: published(redis_client) == set(range(20)), what="the other 10 published")
    carrier.stop()
    thread.join(10)


def published(client) -> set[int]:
    """The argument of every message in the queue."""
    return {json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
            for raw in client.lrange(QUEUE, 0, -1)}


def test_a_second_stop_signal_stops_a_carrier_stuck_on_its_servers_at_once(
        proj, redis_server, redis_client, tmp_path):
    """The first signal waits for the call in hand (up to the socket timeout, times the
    retries); an operator's second Ctrl-C must not."""
    proxy = StallingProxy(redis_server.port)  # the broker and the store behind it
    schedule_due_now(proj, 20_000)
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=proxy.url, PYTHONPATH=ROOT)
    with open(tmp_path / "carrier.log", "w") as log:
        carrier = subprocess.Popen(celery_cli("delayq", "carrier", "--batch", "100"), cwd=ROOT,
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: redis_client.llen(PARKED) > 0, timeout=60,  # a start under load
                 what="first promotions")
        proxy.stall()
        time.sleep(0.5)
        carrier.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert carrier.poll() is None, "stopped by the first signal while stuck"
        carrier.send_signal(signal.SIGINT)
        carrier.wait(3)
    finally:
        carrier.kill()
        proxy.close()
    output = (tmp_path / "carrier.log").read_text()
    assert carrier.returncode == 1 and "SIGINT again, stopping now" in output, output


def test_a_batch_published_past_its_lease_is_reported_once(proj, redis_client, caplog):
    """Its jobs may have been recovered meanwhile and published twice: the log says so,
    and how to fix it, once per episode rather than per batch."""
    schedule_due_now(proj, 3_000)
    caplog.set_level(logging.WARNING, "celery_delayq")
    carrier = Carrier(proj.app, batch=500, lease=0.001)
    for _ in range(4):
        carrier.run_once()
    warnings = [r.getMessage() for r in caplog.records if "as long as the lease" in r.getMessage()]
    assert len(warnings) == 1 and "raise delayq_lease_seconds" in warnings[0], warnings
    carrier.close()


def test_a_carrier_says_which_store_and_broker_it_serves(stalling, proj, caplog):
    """A carrier given the wrong broker logged only "promoted 50 jobs" (to a broker no
    worker reads), and one whose store followed the broker served an empty store."""
    app, proxy = stalling
    caplog.set_level(logging.INFO, "celery_delayq")
    for served in (app, proj.app):
        carrier = Carrier(served)
        carrier.stop()  # run() says where it serves, then stops at once
        thread = threading.Thread(target=carrier.run)  # (not the main thread: no handlers)
        thread.start()
        thread.join(10)
    served = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving")]
    assert len(served) == 2, served
    assert f"publishing to the broker at {proxy.url}/0" in served[0]
    assert "delayq_redis_url is not set: the broker's Redis" in served[1]


@pytest.mark.parametrize("direct", [False, True], ids=["kombu", "direct"])
@pytest.mark.parametrize(("broker", "options", "says"), [
    ("sentinel://127.0.0.1:1/0", {}, "'master_name' transport option must be specified"),
    ("redis://127.0.0.1:1/zero", {}, "Database is int"),
], ids=["sentinel without master_name", "database not a number"])
def test_broker_settings_kombu_refuses_stop_a_carrier_saying_so(redis_server, redis_client,
                                                                 broker, options, says, direct):
    """kombu's ValueError for them crashed the carrier with a traceback at its first look
    at the broker (the memory guard's, or the first publish)."""
    app = Celery("refused", broker=broker, set_as_current=False)
    app.conf.update(delayq_redis_url=f"{redis_server.url}/0", delayq_prefix="refused",
                    broker_transport_options=options)
    delayq = DelayQ(app)
    app.task(base=DelayedTask, name="refused.task", shared=False)(_noop).apply_delayed(delay=0)
    carrier = Carrier(app, direct=direct)
    try:
        with pytest.raises(ConfigurationError, match=f"{says}.*broker_transport_options"):
            carrier.run_once()
    finally:
        carrier.close()
    assert len(delayq.pending()) == 1, "the job is still stored"


def _noop():
    pass
