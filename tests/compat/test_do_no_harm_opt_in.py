"""Do no harm: opting in is explicit; an app that opted in sends undelayed calls natively.

Tasks here are ``shared=False``: Celery adds every ``@app.task`` of the default kind to every
app of the process, and other suites' DelayedTasks would opt apps in. A plain app is checked
in a fresh interpreter by ``test_do_no_harm_imports``.
"""

from __future__ import annotations

import json

from celery import Celery

from celery_delayq import DelayedTask, DelayQ, http
from celery_delayq.http import TASK_NAME


def memory_app(name: str) -> Celery:
    return Celery(name, broker="memory://", set_as_current=False)


def test_an_app_that_opted_in_sends_calls_without_a_delay_on_a_broker_that_is_not_redis():
    app = memory_app("opted-in")

    @app.task(name="opted_in.plain", shared=False)
    def plain():
        return "plain"

    @app.task(base=DelayedTask, name="opted_in.delayed", shared=False)
    def delayed():
        return "delayed"

    DelayQ(app)
    assert app.send_task("opted_in.plain").id
    assert plain.delay().id
    assert delayed.delay().id
    assert app.send_task("opted_in.unregistered", countdown=None, eta=None).id


def test_an_app_that_opted_in_takes_send_task_arguments_by_position_as_celery_does():
    app = memory_app("positional")
    DelayQ(app)
    assert app.send_task("positional.unregistered", [1], {}, None, None, "my-id").id == "my-id"


def test_a_send_task_set_on_the_app_before_it_opted_in_is_still_called():
    app = memory_app("patched")
    native, called = app.send_task, []

    def patched(name, *args, **kwargs):
        called.append(name)
        return native(name, *args, **kwargs)

    app.send_task = patched
    DelayQ(app)
    assert app.send_task("patched.plain").id
    assert called == ["patched.plain"]


def test_a_patch_of_celery_send_task_made_after_opting_in_is_called(monkeypatch):
    """As Sentry's ``sentry_sdk.init`` patches it, often after ``DelayQ(app)``."""
    app = memory_app("instrumented")
    DelayQ(app)
    native, called = Celery.send_task, []

    def instrumented(self, name, *args, **kwargs):
        called.append(name)
        return native(self, name, *args, **kwargs)

    monkeypatch.setattr(Celery, "send_task", instrumented)
    assert app.send_task("instrumented.plain").id
    assert called == ["instrumented.plain"]


def test_the_http_callback_is_registered_when_an_app_with_a_delayq_finalizes():
    app = memory_app("opted-in")
    DelayQ(app)
    assert not app.finalized, "registering must not finalize the app"
    assert isinstance(app.tasks[TASK_NAME], http.HttpCallbackTask)


def test_the_http_callback_is_registered_on_an_app_finalized_before_its_delayq():
    app = memory_app("late")
    app.finalize()
    DelayQ(app)
    assert isinstance(app.tasks[TASK_NAME], http.HttpCallbackTask)


def test_http_register_opts_an_app_in_explicitly():
    app = memory_app("explicit")
    http.register(app)
    http.register(app)  # idempotent
    assert app.tasks[TASK_NAME].name == TASK_NAME
    assert DelayQ.lookup(app) is not None  # the task is a DelayedTask: its app opted in


def test_the_module_level_http_callback_is_the_current_apps_task():
    app = Celery("current", broker="memory://")
    DelayQ(app)
    with app:  # the current app while inside
        assert http.http_callback.name == TASK_NAME
        assert http.http_callback.app is app


def test_a_delayedtask_called_without_a_delay_leaves_its_app_as_it_was():
    """A shared DelayedTask that Celery binds to another app (a test app, say) must not
    opt that app in by a call that is not delayed: its Celery countdowns stay Celery's."""
    app = memory_app("not-opted-in")

    @app.task(base=DelayedTask, name="not_opted_in.delayed", shared=False)
    def delayed():
        return "delayed"

    control_cls = app.control_cls
    assert delayed.delay().id
    assert delayed.apply_async(countdown=None, eta=None).id

    assert DelayQ.lookup(app) is None
    assert "send_task" not in vars(app) and app.control_cls == control_cls
    assert app.send_task("not_opted_in.plain", countdown=5).id  # Celery's own countdown


def test_a_delayedtask_of_an_app_that_did_not_opt_in_sends_its_countdown_as_celery_does(
        redis_server, redis_client):
    """A shared DelayedTask bound to a second app (no ``DelayQ(app2)``, so no carrier serves
    its store) parked that app's countdowns in a store nothing promoted: they never ran."""
    app = Celery("plain-countdown", broker=f"{redis_server.url}/0", set_as_current=False)

    @app.task(base=DelayedTask, name="plain_countdown.delayed", shared=False)
    def delayed():
        return "delayed"

    delayed.apply_async(countdown=60, queue="plain-countdown")
    delayed.apply_async(eta="2999-01-01T00:00:00+00:00", queue="plain-countdown")

    sent = [json.loads(raw) for raw in redis_client.lrange("plain-countdown", 0, -1)]
    assert [message["headers"]["eta"] is not None for message in sent] == [True, True]
    assert DelayQ.lookup(app) is None
    assert [key for key in redis_client.scan_iter("delayq:*")] == []
