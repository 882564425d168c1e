"""The carrier's broker connections bound each wait for a reply, as the store's do."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_delayq import broker


def app(url: str, **transport_options) -> Celery:
    celery = Celery("broker", broker=url, set_as_current=False)
    celery.conf.broker_transport_options = {"visibility_timeout": 60, **transport_options}
    return celery


@pytest.mark.parametrize(("url", "waits"), [
    ("redis://h:6379/0", {"socket_timeout": 2.5, "socket_connect_timeout": 2.5}),
    ("amqp://guest@h//", {"read_timeout": 2.5, "write_timeout": 2.5}),
    ("memory://", {}),
])
def test_a_carriers_connection_waits_at_most_the_timeout_for_the_broker(url, waits):
    """kombu waits for ever by default: a broker that stops answering held a carrier."""
    connection = broker.connection(app(url), 2.5)
    assert connection.transport_options == {"visibility_timeout": 60, **waits}


def test_a_wait_the_broker_transport_options_set_is_kept():
    connection = broker.connection(app("redis://h/0", socket_timeout=30), 2.5)
    assert connection.transport_options["socket_timeout"] == 30
    assert connection.transport_options["socket_connect_timeout"] == 2.5
