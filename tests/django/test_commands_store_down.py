"""The management commands while the project's store is down: a clear error, exit 1, no
traceback, and nothing changed in the database."""

from __future__ import annotations

import sys

import pytest
from celery import Celery
from django.core.management import CommandError, call_command

from celery_delayq import DelayQ
from celery_delayq.contrib.django.models import DelayedTask
from celery_delayq.testing.redis_server import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)

#: The app the Django app works with once a test points settings.DELAYQ_CELERY_APP here.
project_app: Celery | None = None


@pytest.fixture
def store_down(settings, monkeypatch):
    with RedisServer() as server:
        app = Celery("gone", broker="redis://127.0.0.1:1/0", set_as_current=False)
        app.conf.update(delayq_redis_url=f"{server.url}/0", delayq_redis_retries=1,
                        delayq_redis_socket_timeout=0.5)
        delayq = DelayQ(app)
        delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                        job_id="order:1:close")
        monkeypatch.setattr(sys.modules[__name__], "project_app", app)
        settings.DELAYQ_CELERY_APP = f"{__name__}:project_app"
        server.stop()
        yield delayq
        delayq.store.close()


@pytest.mark.parametrize("command", [["delayq_sync", "--once"],
                                     ["delayq_sync", "--once", "--backfill"],
                                     ["delayq_reconcile", "--missing"]])
def test_a_command_says_the_store_is_unavailable_and_changes_nothing(store_down, command):
    with pytest.raises(CommandError, match="is unavailable"):
        call_command(*command)
    assert not DelayedTask.objects.exists()
