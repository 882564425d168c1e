"""Fixtures of the Django app's tests: the demo shop's Celery app on the session's Redis.

The shop's broker and delay store use database 1 of the session's redis-server, so the
core tests' worker (database 0) never sees the shop's tasks. Every test here uses a real
(transactional) test database, a real worker and a real carrier where it says so.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import redis

from tests.conftest import running_worker


@pytest.fixture(scope="session")
def shop_app(redis_server):
    """The demo project's Celery app, pointed at the session's Redis before first use."""
    from demo_project.celery_app import app, delayq

    assert "config" not in delayq.__dict__, "the demo's DelayQ was configured too early"
    url = f"{redis_server.url}/1"
    # The names under the app's CELERY namespace: Celery before 5.7 reads those first.
    app.conf.update(CELERY_BROKER_URL=url, CELERY_DELAYQ_REDIS_URL=url,
                    CELERY_DELAYQ_IDLE_TIMEOUT=1.0, CELERY_DELAYQ_REDIS_RETRIES=1)
    return app


@pytest.fixture
def shop_delayq(shop_app, shop_redis):
    from celery_delayq import DelayQ

    return DelayQ.of(shop_app)


@pytest.fixture
def shop_redis(redis_server):
    """A client of the shop's Redis database, emptied (but for kombu's keys) per test."""
    from celery_delayq import journal

    journal.flush()  # the session worker's events of the previous test stay out of this one
    client = redis.Redis.from_url(f"{redis_server.url}/1", decode_responses=True)
    stale = [k for k in client.scan_iter(count=1000)
             if not k.startswith(("_kombu", "unacked"))]
    if stale:
        client.delete(*stale)
    yield client
    client.close()


@pytest.fixture(scope="session")
def shop_worker(shop_app, django_db_blocker):
    """A real Celery worker (threads) running the shop's tasks for the whole session."""
    with contextlib.ExitStack() as stack:
        with django_db_blocker.unblock():  # a starting worker runs Django's model checks,
            worker = stack.enter_context(running_worker(  # which may query (JSONField, SQLite)
                shop_app, concurrency=4, shutdown_timeout=30))
        yield worker


@pytest.fixture
def shop_carrier(shop_delayq):
    from celery_delayq.carrier import Carrier

    carrier = Carrier(shop_delayq.app, idle_timeout=0.5)
    thread = threading.Thread(target=carrier.run, name="carrier", daemon=True)
    thread.start()
    yield carrier
    carrier.stop()
    thread.join(10)


@pytest.fixture
def sync(shop_delayq):
    """The journal sync of the shop's store, driven by the test (``sync.run_once()``)."""
    from celery_delayq.contrib.django.sync import JournalSync

    return JournalSync(shop_delayq)


@pytest.fixture
def fast_shop(settings):
    """Demo timings short enough for a test."""
    settings.SHOP_ORDER_TIMEOUT = 0.3
    settings.SHOP_REFUND_GAPS = [0.1, 0.2, 0.3]
    return settings


@pytest.fixture
def lone_store():
    """A Celery app whose delay store is a Redis the test may stop and restart, scheduling
    transactionally, with its task ``lone.remind``: (server, delayq, remind)."""
    from celery import Celery

    from celery_delayq import DelayedTask, DelayQ
    from celery_delayq.contrib.django.transactional import connect
    from celery_delayq.testing.redis_server import RedisServer

    with RedisServer() as server:
        app = Celery("lone", broker=f"{server.url}/0", set_as_current=False)
        app.conf.update(delayq_redis_url=f"{server.url}/0", delayq_redis_retries=1,
                        delayq_redis_socket_timeout=1.0)
        delayq = DelayQ(app)
        connect(delayq)

        @app.task(base=DelayedTask, name="lone.remind", shared=False)
        def remind(n):
            return n

        yield server, delayq, remind
        delayq.store.close()
