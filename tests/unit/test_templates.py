"""Single calls reuse the template of their task and options (``envelope.Templates``),
except where a template could differ from one call to the next."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from celery._state import _task_stack
from kombu import Exchange, Queue

from celery_delayq import decoding
from celery_delayq.envelope import Templates
from tests.unit.calls import KEYS


def stored(templates: Templates, args=(42,), **options) -> dict:
    call = templates.get("unit.plain", options, args=args).call(
        args, None, job_id=None, key=None, max_payload_bytes=4096, max_nesting=64)
    return decoding.decode(call.envelope)


def test_a_call_inside_a_task_is_its_child_after_calls_outside_it(app):
    templates = Templates(app, KEYS)
    assert "o" not in stored(templates)  # the template of calls from outside a task
    @app.task(name="unit.parent")
    def parent():
        """The task a worker is running."""

    parent.push_request(id="parent-1", root_id="root-1", called_directly=False)
    _task_stack.push(parent)
    try:
        inside = stored(templates)
    finally:
        _task_stack.pop()
        parent.pop_request()
    assert inside["o"] == {"parent_id": "parent-1", "root_id": "root-1"}
    assert "o" not in stored(templates)


def test_a_relative_expires_counts_from_each_call(app):
    templates = Templates(app, KEYS)
    first = datetime.fromisoformat(stored(templates, expires=60)["o"]["expires"])
    time.sleep(0.2)
    second = datetime.fromisoformat(stored(templates, expires=60)["o"]["expires"])
    assert (second - first).total_seconds() >= 0.2


def test_calls_with_other_options_get_their_own_template(app):
    templates = Templates(app, KEYS)
    assert "q" not in stored(templates)
    assert stored(templates, queue="refunds")["q"] == "refunds"
    assert stored(templates, priority=3)["p"] == {"priority": 3}
    assert stored(templates, time_limit=30)["o"]["time_limit"] == 30
    assert isinstance(stored(templates, time_limit=30.0)["o"]["time_limit"], float)
    assert stored(templates, headers={"tenant": "acme"})["h"] == {"tenant": "acme"}
    assert "q" not in stored(templates) and "h" not in stored(templates)


def test_a_router_sees_each_calls_arguments(app):
    def by_amount(name, args, kwargs, options, task=None, **_):
        return {"queue": "refunds"} if args and args[0] > 100 else None

    app.conf.task_routes = [by_amount]
    templates = Templates(app, KEYS)
    assert "q" not in stored(templates, args=(5,))
    assert stored(templates, args=(500,))["q"] == "refunds"
    assert "q" not in stored(templates, args=(7,))


def test_with_the_rpc_backend_each_thread_stores_its_own_reply_queue(app):
    """Celery's ``rpc://`` sends a result to the queue the message's ``reply_to`` names:
    the calling thread's (``app.thread_oid``), as ``send_task`` sets it."""
    app.conf.result_backend = "rpc://"
    templates = Templates(app, KEYS)
    replies = [stored(templates)["o"]["reply_to"]]
    thread = threading.Thread(target=lambda: replies.append(stored(templates)["o"]["reply_to"]))
    thread.start()
    thread.join()
    assert replies[0] == app.thread_oid and replies[1] not in ("", replies[0])
    assert stored(templates, reply_to="own.queue")["o"]["reply_to"] == "own.queue"


def test_without_the_rpc_backend_no_reply_queue_is_stored(app):
    app.conf.result_backend = "redis://127.0.0.1:1/0"
    assert "o" not in stored(Templates(app, KEYS))


def test_a_route_to_a_queue_object_goes_through_the_apps_queue_of_its_name(app):
    """The app's ``topical`` queue is bound to ``events`` by ``shop.#``: a route to that name
    bound otherwise is published as the carrier declares the queue."""
    elsewhere = Queue("topical", Exchange("events", type="topic"), routing_key="other.#")
    app.conf.task_routes = {"unit.plain": {"queue": elsewhere}}
    assert stored(Templates(app, KEYS))["r"] == "shop.#"
