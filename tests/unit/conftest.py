"""An app that needs no broker: unit tests only build envelopes and messages."""

from __future__ import annotations

import pytest
from celery import Celery
from kombu import Exchange, Queue


@pytest.fixture
def app():
    app = Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_routes = {"unit.routed": {"queue": "refunds"}}
    app.conf.task_queues = [
        Queue("celery"),
        Queue("refunds"),
        Queue("topical", Exchange("events", type="topic"), routing_key="shop.#"),
    ]
    return app
