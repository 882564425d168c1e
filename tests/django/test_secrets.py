"""The admin, its actions, the deploy check, the management commands and the logs never
show the store's password, in any URL form, when the store is down or refuses it.

The store is a real ``requirepass`` redis-server; everything the pages, messages, checks
and log records say is grepped for the password (and for the wrong one tried).
"""

from __future__ import annotations

import io
import logging
import secrets
import sys

import pytest
from celery import Celery
from django.core.management import CommandError, call_command
from django.db import transaction
from django.urls import reverse

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.contrib.django.models import DelayedTask as Row
from celery_delayq.contrib.django.transactional import connect
from celery_delayq.testing.redis_server import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:delayq_delayedtask_changelist"
PASSWORD, WRONG = "pw" + secrets.token_hex(8), "pw" + secrets.token_hex(8)
FORMS = {"userinfo": "redis://:{pw}@127.0.0.1:{port}/0",
         "query": "redis://127.0.0.1:{port}/0?password={pw}"}

#: The app the Django app works with (settings.DELAYQ_CELERY_APP names it).
project_app: Celery | None = None


def locked_app(url: str) -> tuple[DelayQ, DelayedTask]:
    app = Celery("locked", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(delayq_redis_url=url, delayq_redis_retries=1,
                    delayq_redis_socket_timeout=0.5)
    delayq = DelayQ(app)
    connect(delayq)

    @app.task(base=DelayedTask, name="locked.remind", shared=False)
    def remind(n):
        return n

    return delayq, remind


@pytest.fixture(params=[(form, fault) for form in FORMS for fault in ("down", "wrong password")],
                ids="-".join)
def failing_store(request, settings, monkeypatch):
    """Job ``remind:1`` stored, then the project's store down or given a wrong password;
    ``remind:2`` committed while it fails."""
    form, fault = request.param
    with RedisServer(extra=("--requirepass", PASSWORD)) as server:
        good, remind = locked_app(FORMS[form].format(pw=PASSWORD, port=server.port))
        with transaction.atomic():
            remind.apply_delayed(args=(1,), delay=600, job_id="remind:1")
        assert Row.objects.get(job_id="remind:1").stored
        if fault == "down":
            server.stop()
            bad = good
        else:
            bad, remind = locked_app(FORMS[form].format(pw=WRONG, port=server.port))
        monkeypatch.setattr(sys.modules[__name__], "project_app", bad.app)
        settings.DELAYQ_CELERY_APP = f"{__name__}:project_app"
        with transaction.atomic():
            remind.apply_delayed(args=(2,), delay=600, job_id="remind:2")
        yield
        good.store.close()
        bad.store.close()


def _act(client, action: str, job_id: str, **extra):
    pk = Row.objects.get(job_id=job_id).pk
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [pk],
                                             **extra}, follow=True)


def test_admin_pages_actions_checks_and_logs_never_show_the_store_password(
        failing_store, admin_client, caplog):
    unstored = Row.objects.get(job_id="remind:2")
    assert not unstored.stored and "***" in unstored.store_error
    printed = []
    with caplog.at_level(logging.DEBUG):
        printed.append(admin_client.get(reverse(CHANGELIST)).content.decode())
        for row in Row.objects.all():
            page = admin_client.get(reverse("admin:delayq_delayedtask_change", args=[row.pk]))
            printed.append(page.content.decode())
        errors = [
            _act(admin_client, "cancel_tasks", "remind:2"),
            _act(admin_client, "run_now", "remind:1"),
            _act(admin_client, "reschedule_tasks", "remind:1", apply="Reschedule",
                 delay_minutes="5"),
            _act(admin_client, "pause_tasks", "remind:1"),
        ]
        out = io.StringIO()
        call_command("check", "--deploy", stdout=out, stderr=out)
        with pytest.raises(CommandError, match="1 delayed tasks are still not in Redis"):
            call_command("delayq_reconcile", stdout=out, stderr=out)
        with pytest.raises(CommandError, match=r"Redis at .* (is unavailable|refused the "
                                                r"credentials)") as sync_failed:
            call_command("delayq_sync", "--once", stdout=out, stderr=out)
    messages = [(m.level_tag, str(m)) for e in errors for m in e.context["messages"]]
    # each action's error, then the list page's warning that it cannot show what is paused
    assert [level for level, _ in messages] == ["error", "warning"] * 4
    assert all(m.startswith(("error: Redis at", "What is paused is unknown (no banner): "
                             "Redis could not say: Redis at",
                             "error: nothing done, Redis could not say what is paused: "
                             "Redis at")) for _, m in messages)
    assert "delayq.W002" in out.getvalue() and "remind:2: Redis at" in out.getvalue()
    unavailable = sync_failed.value.__cause__  # StoreUnavailable, from redis-py's error
    out.write(f"{sync_failed.value}\n{unavailable!r}\n{unavailable.__cause__!r}")
    printed += [e.content.decode() for e in errors] + [out.getvalue(), caplog.text]
    everything = "\n".join(printed)
    assert "***" in printed[-3] and "store write failed" in everything
    assert PASSWORD not in everything and WRONG not in everything
