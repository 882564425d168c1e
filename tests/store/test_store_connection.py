"""The store's client on connections that fail: whatever redis-py version runs it, the
caller gets StoreUnavailable."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from tests.conftest import CLUSTER

pytestmark = pytest.mark.skipif(CLUSTER, reason="the address stands for one Redis server")


def make_app(url: str, **conf) -> tuple[Celery, DelayedTask]:
    app = Celery("connection", broker=f"{url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url=f"{url}/0", **conf)

    @app.task(base=DelayedTask, name="connection.probe", shared=False)
    def probe(n):
        return n

    DelayQ(app)
    return app, probe


@pytest.fixture
def hanging_up() -> Iterator[str]:
    """The URL of an address that accepts each connection and closes it at once (a Redis
    restarting, a proxy with no server behind it)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed at teardown
                return
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_store_that_hangs_up_on_every_connection_is_reported_unavailable(hanging_up):
    app, probe = make_app(hanging_up, delayq_redis_retries=1, delayq_redis_socket_timeout=0.5)
    with pytest.raises(StoreUnavailable, match="is unavailable after 1 retries"):
        probe.apply_delayed((1,), delay=60)
    with pytest.raises(StoreUnavailable, match="is unavailable after 1 retries"):
        DelayQ.of(app).pending()
    app.close()
