"""celery_delayq.http_callback against a real HTTP server, a real Redis, worker and carrier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery, signals

from celery_delayq import DelayQ
from celery_delayq.http import EXCERPT_CHARS, TASK_NAME, CallbackRefused
from celery_delayq.testing.redis_server import free_port
from tests.conftest import journal_events, wait_for, wait_for_events
from tests.http.conftest import RETRY_SCHEDULE


def callback(app):
    return app.tasks[TASK_NAME]


def test_due_callback_posts_its_json_body_and_headers(http_delayq, http_carrier,
                                                      callback_server):
    result = callback(http_delayq.app).apply_delayed(
        [callback_server.url("/hooks/paid")],
        {"json": {"order": 42, "status": "paid"}, "headers": {"X-Signature": "abc"}},
        delay=0.2)

    assert result.get(timeout=15) == {"status": 200, "excerpt": "ok"}
    [received] = callback_server.requests
    assert received.path == "/hooks/paid"
    assert received.body == {"order": 42, "status": "paid"}
    assert received.headers["X-Signature"] == "abc"
    assert received.headers["Content-Type"] == "application/json"


def test_failures_are_retried_through_the_store_after_each_scheduled_delay(
        http_delayq, http_carrier, callback_server):
    callback_server.answer(500, b"boom")
    callback_server.answer(502, b"bad gateway")
    callback_server.answer(204, b"")
    result = callback(http_delayq.app).apply_delayed([callback_server.url()],
                                                     {"json": {"n": 1}}, delay=0)

    assert result.get(timeout=15) == {"status": 204, "excerpt": ""}
    times = [r.at for r in callback_server.requests]
    assert len(times) == 3
    assert times[1] - times[0] >= RETRY_SCHEDULE[0]
    assert times[2] - times[1] >= RETRY_SCHEDULE[1]
    events = wait_for_events(http_delayq, retried=2, promoted=3)
    assert events.count("retried") == 2
    assert events.count("promoted") == 3  # every attempt came out of the store
    assert http_delayq.store.dead() == []


def test_exhausted_callback_is_dead_lettered_with_the_last_status_and_an_excerpt(
        http_delayq, http_carrier, callback_server):
    callback_server.answer(503, b"x" * 5000)
    result = callback(http_delayq.app).apply_delayed(
        [callback_server.url()], {"json": {"n": 2}}, delay=0, job_id="partner:7:notify")

    [dead] = wait_for(http_delayq.store.dead, what="a dead-lettered callback")
    assert len(callback_server.requests) == 1 + len(RETRY_SCHEDULE)
    assert dead["job_id"] == "partner:7:notify"
    assert "after 3 attempts" in dead["reason"] and "HTTP 503" in dead["reason"]
    assert "x" * EXCERPT_CHARS in dead["reason"]
    assert "x" * (EXCERPT_CHARS + 1) not in dead["reason"]
    wait_for(lambda: result.state == "FAILURE", what="the task to fail")
    assert "dead" in journal_events(http_delayq)


def test_a_dead_callback_replays_with_a_fresh_retry_schedule(http_delayq, http_carrier,
                                                             callback_server):
    callback_server.answer(503, b"down")
    callback(http_delayq.app).apply_delayed([callback_server.url()], {"json": {"n": 3}},
                                            delay=0, job_id="partner:8:notify")
    wait_for(http_delayq.store.dead, what="a dead-lettered callback")

    callback_server.answers[:] = [(500, b"still down", {}), (200, b"fine", {})]
    assert http_delayq.store.replay("partner:8:notify")

    wait_for(lambda: len(callback_server.requests) == 5, what="two more attempts")
    assert http_delayq.store.dead() == []
    assert callback_server.requests[-1].body == {"n": 3}


def test_connection_errors_are_failures_retried_then_dead_lettered(http_delayq, http_carrier):
    url = f"http://127.0.0.1:{free_port()}/nobody-listens"
    callback(http_delayq.app).apply_delayed([url], delay=0)

    [dead] = wait_for(http_delayq.store.dead, what="a dead-lettered callback")
    assert "no answer" in dead["reason"] and "after 3 attempts" in dead["reason"]


def test_a_redirect_is_a_failure_and_is_not_followed(http_delayq, http_carrier,
                                                     callback_server):
    callback_server.answer(302, b"", Location="http://169.254.169.254/latest/meta-data")
    callback(http_delayq.app).apply_delayed([callback_server.url()], delay=0)

    [dead] = wait_for(http_delayq.store.dead, what="a dead-lettered callback")
    assert "HTTP 302" in dead["reason"]
    assert len(callback_server.requests) == 1 + len(RETRY_SCHEDULE)


def test_a_large_response_body_is_kept_only_as_an_excerpt(http_delayq, http_carrier,
                                                          callback_server):
    callback_server.answer(200, "é".encode() * 500_000)
    result = callback(http_delayq.app).apply_delayed([callback_server.url()], delay=0)

    assert result.get(timeout=15) == {"status": 200, "excerpt": "é" * EXCERPT_CHARS}


@pytest.mark.parametrize("url", [
    "ftp://127.0.0.1/file",
    "file:///etc/passwd",
    "127.0.0.1/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://user:secret@127.0.0.1/hook",
])
def test_a_url_that_is_not_allowed_is_refused_at_the_call_and_nothing_is_stored(
        http_delayq, url):
    task = callback(http_delayq.app)
    with pytest.raises(CallbackRefused):
        task.apply_delayed([url], delay=60)
    with pytest.raises(CallbackRefused):
        task.apply_async([url], countdown=60)
    assert http_delayq.pending() == []


def test_bad_headers_or_timeout_are_refused_at_the_call(http_delayq, callback_server):
    task = callback(http_delayq.app)
    with pytest.raises(CallbackRefused, match="headers"):
        task.apply_delayed([callback_server.url()], {"headers": {"X-N": 1}}, delay=60)
    with pytest.raises(CallbackRefused, match="timeout"):
        task.apply_delayed([callback_server.url()], {"timeout": -1}, delay=60)
    assert http_delayq.pending() == []


def test_an_empty_allow_list_refuses_every_url_and_says_which_setting_to_change():
    app = Celery("strict", broker="redis://127.0.0.1:1/0", set_as_current=False)
    DelayQ(app)
    with pytest.raises(CallbackRefused, match="delayq_http_allowed_hosts is empty"):
        callback(app).apply_delayed(["https://partner.example.com/hook"], delay=60)


def test_the_worker_refuses_a_url_its_own_settings_do_not_allow_and_keeps_it_dead(
        http_delayq, http_carrier, callback_server):
    # Scheduled by name, so no call-site check: the worker's check is the last line.
    result = http_delayq.schedule(TASK_NAME, ["http://localhost:9/hook"], delay=0,
                                  job_id="by-name:1")

    wait_for(lambda: result.state == "FAILURE", what="the task to fail")
    assert isinstance(result.result, CallbackRefused)
    assert "retried" not in journal_events(http_delayq)
    assert callback_server.requests == []
    [dead] = http_delayq.store.dead()  # replayable once the worker allows the host
    assert dead["job_id"] == "by-name:1"
    assert "refused by the worker" in dead["reason"] and "localhost:9" in dead["reason"]


@pytest.fixture
def received_reprs() -> Iterator[dict[str, list[tuple[str, str]]]]:
    """The ``argsrepr`` / ``kwargsrepr`` of each message the worker receives, by task id."""
    received: dict[str, list[tuple[str, str]]] = {}

    def record(request, **_):
        received.setdefault(request.id, []).append((request.argsrepr, request.kwargsrepr))
    signals.task_received.connect(record, weak=False)
    yield received
    signals.task_received.disconnect(record)


def test_a_promoted_callback_message_shows_neither_url_query_nor_header_secrets(
        http_delayq, http_carrier, callback_server, received_reprs):
    callback_server.answer(500, b"boom")
    callback_server.answer(200, b"ok")
    result = callback(http_delayq.app).apply_delayed(
        [callback_server.url("/hook?order=42&token=s3cr3t")],
        {"json": {"n": 1}, "headers": {"Authorization": "Bearer b3arer"}}, delay=0)

    assert result.get(timeout=15)["status"] == 200
    assert callback_server.requests[0].headers["Authorization"] == "Bearer b3arer"
    shown = (repr((callback_server.url("/hook?order=***&token=***"),)),
             "{'json': {'n': 1}, 'headers': {'Authorization': '***'}}")
    assert received_reprs[result.id] == [shown, shown]  # the attempt, then its retry


def test_a_callers_own_argsrepr_is_what_the_message_shows(
        http_delayq, http_carrier, callback_server, received_reprs):
    result = callback(http_delayq.app).apply_async(
        [callback_server.url("/hook?token=s3cr3t")], {"headers": {"X-Key": "k3y"}},
        countdown=0.1, argsrepr="(<callback>,)")

    assert result.get(timeout=15)["status"] == 200
    assert received_reprs[result.id] == [("(<callback>,)", "{'headers': {'X-Key': '***'}}")]
