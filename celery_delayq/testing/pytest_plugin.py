"""pytest plugin: test code that schedules delayed tasks, without sleeping.

Installed with celery-delayq (entry point ``pytest11``), so pytest loads it in every run of
every project: it does nothing until a test asks for one of its fixtures (no autouse fixture,
no hook that touches an app or creates a ``DelayQ``), and imports nothing but pytest until
then (a project's ``conftest.py`` may have to run before Celery, Redis or ``ssl`` are
imported: gevent's monkey-patching). It offers the ``delayq`` fixture, a
:class:`~celery_delayq.testing.tester.DelayQTester` over a real Redis and a test clock::

    def test_unpaid_order_closes_after_30_minutes(delayq):
        order = place_order()                      # schedules close_order in 30 min
        assert [j.task for j in delayq.pending()] == ["shop.close_order"]
        delayq.advance(minutes=30)                 # runs it here, in this process
        assert order.refresh().status == "closed"

Which Celery app: override the ``delayq_app`` fixture, or set the ini option
``delayq_app = "package.module:app"``. Which Redis: the ini option ``delayq_redis_url``
or the environment variable ``DELAYQ_PYTEST_REDIS_URL``; without either, one
``redis-server`` is started for the session (``RedisServer``). Each test gets a key
prefix of its own on it, deleted afterwards. See ``docs/testing.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures that need them, when a test asks for one
    from celery import Celery

    from .tester import DelayQTester

ENV_REDIS_URL = "DELAYQ_PYTEST_REDIS_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("delayq_app", "Celery app the delayq fixture uses, as 'module:attribute' "
                  "(or override the delayq_app fixture)", default="")
    parser.addini("delayq_redis_url", "Redis the delayq fixture uses instead of starting a "
                  f"redis-server (the {ENV_REDIS_URL} environment variable wins)", default="")


@pytest.fixture(scope="session")
def delayq_redis_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """The Redis of the delay store in tests: configured, or a redis-server for the session."""
    url = os.environ.get(ENV_REDIS_URL) or pytestconfig.getini("delayq_redis_url")
    if url:
        yield url
        return
    from .redis_server import RedisServer

    with RedisServer() as server:
        yield server.url


@pytest.fixture
def delayq_app(pytestconfig: pytest.Config) -> Celery:
    """The Celery app under test: override this fixture, or set the ``delayq_app`` ini option."""
    from celery import Celery
    from celery.utils.imports import symbol_by_name

    spec = pytestconfig.getini("delayq_app")
    if not spec:
        raise pytest.UsageError(
            "the delayq fixture needs your Celery app: set `delayq_app = \"module:app\"` in "
            "the [pytest] ini options, or define a `delayq_app` fixture that returns it")
    app = symbol_by_name(spec)
    if not isinstance(app, Celery):
        raise pytest.UsageError(f"delayq_app = {spec!r} is a {type(app).__name__}, not a "
                                "Celery app")
    return app


@pytest.fixture
def delayq(delayq_app: Celery, delayq_redis_url: str) -> Iterator[DelayQTester]:
    """The app's delay store on a test Redis, with a test clock; see :class:`DelayQTester`."""
    from .tester import DelayQTester

    with DelayQTester(delayq_app, delayq_redis_url) as tester:
        yield tester


