"""A store on the broker's Redis reached through the broker URL as Celery's docs write it:
``redis+socket:///path/to/redis.sock?virtual_host=N`` (a Unix socket, kombu's scheme)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisServer

QUEUE = "parked.socket"


@pytest.fixture
def socket_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="delayq-sock-") as directory:
        path = str(Path(directory) / "redis.sock")
        with RedisServer(extra=("--unixsocket", path, "--unixsocketperm", "700")):
            yield path


@pytest.mark.parametrize("direct", [False, True])
def test_a_redis_socket_broker_url_is_the_stores_too(socket_path, direct):
    app = Celery("socket", broker=f"redis+socket://{socket_path}?virtual_host=3",
                 set_as_current=False)
    app.conf.update(delayq_shards=2, delayq_direct_promotion=direct)
    delayq = DelayQ(app)
    result = delayq.schedule("socket.noop", [1], delay=0, queue=QUEUE)
    database = redis.Redis(unix_socket_path=socket_path, db=3, decode_responses=True)
    assert database.keys("delayq:*") and not redis.Redis(unix_socket_path=socket_path).keys()
    carrier = Carrier(app)
    carrier.run_once()
    carrier.close()
    assert result.id in database.lindex(QUEUE, 0)
    assert carrier.stats.promoted == 1
    delayq.store.close()
