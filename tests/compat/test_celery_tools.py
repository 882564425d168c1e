"""Celery's own tools see delayed tasks as they see native countdown tasks.

revoke cancels in the store (for good: no worker memory involved), a cancelled or revoked
result is REVOKED in the backend, ``request.eta`` is the due time, the publish signals and
the ``task-sent`` event fire when a call is scheduled, naive ``expires`` means UTC, and
eager mode needs no Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery, signals
from celery import states as celery_states
from celery.exceptions import AlwaysEagerIgnored, TaskRevokedError
from celery.result import AsyncResult

from celery_delayq import DelayedTask, DelayQ
from tests.compat import worker_and_carrier
from tests.conftest import PROMOTIONS, ROOT, finish, wait_for


def _worker_ready(app, timeout: float = 30) -> None:
    wait_for(lambda: app.control.ping(timeout=0.5), timeout=timeout, what="a worker to answer")


def test_revoke_cancels_in_the_store_so_a_task_never_runs_after_every_worker_restarts(
        proj, delayq, redis_client, spawn):
    worker_args = ("worker", "-Q", "revoke", "-P", "solo", "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    first = spawn(*worker_args)
    _worker_ready(proj.app)
    calls = {label: (proj.plain if label == "by-control" else proj.record).apply_async(
        (label,), countdown=3, queue="revoke")  # plain: through send_task
        for label in ("by-result", "by-control", "by-cli", "kept")}
    by_result, by_control, by_cli, kept = calls.values()
    assert len(delayq.pending()) == 4

    AsyncResult(by_result.id, app=proj.app).revoke()
    proj.app.control.revoke(by_control.id)
    cli = spawn("control", "revoke", by_cli.id)  # a broadcast only the worker hears
    assert "flagged as revoked" in finish(cli)
    wait_for(lambda: [job.task_id for job in delayq.pending()] == [kept.id],  # the worker
             what="the worker to cancel the revoked jobs in the store")  # cancels off its loop

    first.kill()  # every worker forgets its revoked set
    first.wait(10)
    spawn(*worker_args)
    spawn("delayq", "carrier")
    assert kept.get(timeout=30) == "kept"
    time.sleep(0.5)  # anything promoted with it would have run by now
    assert [r["label"] for r in proj.runs()] == ["kept"]
    for revoked in (by_result, by_control, by_cli):
        assert AsyncResult(revoked.id, app=proj.app).state == celery_states.REVOKED


@pytest.mark.parametrize("how", ["cancel", "revoke", "revoke by id"])
def test_cancel_or_revoke_marks_the_result_revoked_so_get_raises_at_once(proj, delayq, how):
    result = proj.record.apply_async(("doomed",), countdown=3600)
    if how == "cancel":
        assert result.cancel() is True
    elif how == "revoke":
        result.revoke()
    else:
        AsyncResult(result.id, app=proj.app).revoke()
    assert delayq.pending() == []
    started = time.monotonic()
    with pytest.raises(TaskRevokedError):
        AsyncResult(result.id, app=proj.app).get(timeout=5)
    assert time.monotonic() - started < 1


def test_cancel_key_marks_the_result_of_every_job_it_cancels_revoked(proj, delayq):
    own = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:7:close",
                                    key="order:7")
    drawn = proj.record.apply_delayed(args=(2,), delay=3600, key="order:7")
    other = proj.record.apply_delayed(args=(3,), delay=3600, key="order:8")

    assert delayq.cancel_key("order:7") == 2

    states = {result.id: AsyncResult(result.id, app=proj.app).state
              for result in (own, drawn, other)}
    assert states == {own.id: celery_states.REVOKED, drawn.id: celery_states.REVOKED,
                      other.id: celery_states.PENDING}


def test_revoke_of_a_job_with_its_own_id_cancels_it_through_its_result(proj, delayq):
    result = proj.record.apply_delayed(args=("own",), delay=3600, job_id="order:1:close")
    assert result.id != result.job_id
    result.revoke()
    assert delayq.pending() == []
    assert AsyncResult(result.id, app=proj.app).state == celery_states.REVOKED


@pytest.mark.parametrize("carrier", PROMOTIONS, indirect=True)
def test_request_eta_of_a_promoted_task_is_its_due_time(proj, worker, carrier):
    result = proj.request_of.apply_async(("delayq_due",), countdown=0.3)
    seen = result.get(timeout=15)
    due = datetime.fromtimestamp(seen["delayq_due"] / 1000, timezone.utc)
    assert datetime.fromisoformat(seen["eta"]) == due


@pytest.fixture
def publish_signals():
    """Handlers of both publish signals, recording what they were sent; the before
    handler adds a header, as tracing instrumentations do."""
    seen: list[tuple[str, dict]] = []

    def before(sender=None, headers=None, body=None, **kwargs):
        seen.append(("before", {"sender": sender, "headers": dict(headers), "body": body,
                                **kwargs}))
        headers["x-trace"] = f"trace-of-{headers['id']}"

    def after(sender=None, headers=None, **kwargs):
        seen.append(("after", {"sender": sender, "headers": dict(headers), **kwargs}))

    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    yield seen
    signals.before_task_publish.disconnect(before)
    signals.after_task_publish.disconnect(after)


def test_publish_signals_fire_at_scheduling_and_added_headers_are_delivered(
        proj, delayq, worker, carrier, publish_signals):
    result = proj.request_of.apply_async(("x-trace",), countdown=0.5)
    assert [name for name, _ in publish_signals] == ["before", "after"]
    before = publish_signals[0][1]
    assert before["sender"] == proj.request_of.name
    assert before["headers"]["id"] == result.id
    # a relative delay is counted on Redis's clock: the producer's estimate is close
    assert abs(datetime.fromisoformat(before["headers"]["eta"]) - result.eta) < timedelta(
        seconds=1)
    assert before["body"][0] == ["x-trace"]
    assert before["routing_key"] == "celery"
    seen = result.get(timeout=15)
    assert seen["x-trace"] == f"trace-of-{result.id}"
    # the carrier's publish fires nothing: the worker's own result publish is not a task
    assert [name for name, _ in publish_signals] == ["before", "after"]

    many = proj.request_of.apply_delayed_many([{"delay": 3600}, {"delay": 3600}])
    assert [name for name, _ in publish_signals[2:]] == ["before", "after"] * 2  # paired
    for result in many:
        assert delayq.get(result.job_id).options["h"] == {"x-trace": f"trace-of-{result.id}"}


def test_task_sent_event_at_scheduling_when_enabled(proj, redis_client):
    events: list[dict] = []
    connection = proj.app.connection_for_read()
    receiver = proj.app.events.Receiver(connection, handlers={"*": events.append})
    thread = threading.Thread(target=receiver.capture, daemon=True,
                              kwargs={"limit": None, "timeout": None, "wakeup": False})

    def heard(kind: str) -> list[dict]:
        return [event for event in events if event["type"] == kind]

    def probe_heard() -> list[dict]:  # the receiver subscribes once it first waits
        with proj.app.events.default_dispatcher() as dispatcher:
            dispatcher.send("compat-probe")
        time.sleep(0.05)
        return heard("compat-probe")

    thread.start()
    try:
        wait_for(probe_heard, what="the event receiver to listen")
        proj.app.conf.task_send_sent_event = True
        try:
            result = proj.record.apply_async(("sent",), countdown=3600)
        finally:
            proj.app.conf.task_send_sent_event = False
        [event] = wait_for(lambda: heard("task-sent"), what="the task-sent event")
    finally:
        receiver.should_stop = True
        thread.join(5)
        connection.close()
    assert event["uuid"] == result.id and event["name"] == proj.record.name
    assert event["queue"] == "celery"
    assert abs(datetime.fromisoformat(event["eta"]) - result.eta) < timedelta(seconds=1)


def test_naive_expires_with_a_countdown_means_utc_as_native(proj, delayq, worker, carrier):
    expires = datetime.now(timezone.utc) + timedelta(minutes=5)
    result = proj.record.apply_async(("naive",), countdown=0.2,
                                     expires=expires.replace(tzinfo=None))
    assert delayq.get(result.id).options["o"]["expires"] == expires.isoformat()
    assert result.get(timeout=15) == "naive"
    past = proj.record.apply_async(("expired",), countdown=0.2,
                                   expires=(expires - timedelta(hours=1)).replace(tzinfo=None))
    with pytest.raises(TaskRevokedError):
        past.get(timeout=15)


@pytest.fixture
def eager_app():
    """An eager app whose broker is in memory and whose store is a Redis nobody serves."""
    app = Celery("eager", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, delayq_redis_url="redis://127.0.0.1:1/0",
                    delayq_redis_retries=0, delayq_redis_socket_timeout=0.5)
    DelayQ(app)

    @app.task(base=DelayedTask, name="eager.add", shared=False)
    def add(a, b):
        return a + b

    return app


def test_eager_mode_runs_delayed_calls_at_once_without_redis(eager_app):
    add = eager_app.tasks["eager.add"]
    result = add.apply_delayed(args=(1, 2), delay=3600, job_id="order:1")
    assert result.get() == 3 and result.job_id == "order:1"
    assert result.cancel() is False  # it already ran
    assert [r.get() for r in add.apply_delayed_many([{"args": (2, 3), "delay": 60}])] == [5]
    assert add.apply_async((3, 4), countdown=3600).get() == 7
    with pytest.warns(AlwaysEagerIgnored):  # as Celery's send_task: to the broker
        eager_app.send_task("eager.add", (1, 1), countdown=3600)


def test_revoke_in_eager_mode_needs_no_redis(eager_app):
    """Eager calls run at once: nothing was stored, and no Redis serves the store's URL."""
    result = eager_app.tasks["eager.add"].apply_delayed(args=(1, 2), delay=3600)
    assert result.get() == 3
    eager_app.control.revoke(result.id)
    AsyncResult(result.id, app=eager_app).revoke()
    result.revoke()


PRODUCE_TRACED = """
from opentelemetry import trace
from tests.compat.otel_proj import record
with trace.get_tracer("checkout").start_as_current_span("checkout"):
    print(record.apply_async(("traced",), countdown=0.5, queue="traced").id)
"""


def test_opentelemetry_continues_the_producers_trace_across_the_delay(
        proj, redis_client, tmp_path):
    """Producer, carrier and worker are processes of their own, all instrumented."""
    spans_file = tmp_path / "spans.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, DELAYQ_TEST_SPANS=str(spans_file))
    with worker_and_carrier("tests.compat.otel_proj", "traced", env):
        produced = subprocess.run(
            [sys.executable, "-c", PRODUCE_TRACED],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        task_id = produced.stdout.strip()
        assert AsyncResult(task_id, app=proj.app).get(timeout=30) == "traced"

        def span(name: str) -> dict | None:
            spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
            return next((s for s in spans if s["name"] == name), None)

        run = wait_for(lambda: span(f"run/{proj.record.name}"), what="the worker's span")
    publish = span(f"apply_async/{proj.record.name}")
    assert publish is not None and publish["attributes"]["messaging.message.id"] == task_id
    assert run["context"]["trace_id"] == publish["context"]["trace_id"]
    assert run["parent_id"] == publish["context"]["span_id"]
    # the carrier's publish is no second apply_async
    spans = [json.loads(line)["name"] for line in spans_file.read_text().splitlines()]
    assert spans.count(f"apply_async/{proj.record.name}") == 1


@pytest.mark.parametrize("own_id", [False, True], ids=["drawn id", "own id under a key"])
def test_cancel_by_job_id_marks_the_cancelled_jobs_task_id_revoked(proj, delayq, own_id):
    options = {"job_id": "order:5:close", "key": "order:5"} if own_id else {}
    result = proj.record.apply_delayed(args=("doomed",), delay=3600, **options)
    assert (result.id != result.job_id) is own_id

    assert delayq.cancel(result.job_id) is True  # no key: found on its key's shard too
    assert AsyncResult(result.id, app=proj.app).state == celery_states.REVOKED
    assert delayq.cancel(result.job_id) is False


def test_the_rpc_result_backend_returns_a_delayed_tasks_result_to_its_caller(proj):
    """Celery's ``rpc://`` backend sends a result to the calling thread's reply queue,
    named by the message's ``reply_to``, which the stored call keeps."""
    from tests.compat.rpc_proj import add, delayq

    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        with worker_and_carrier("tests.compat.rpc_proj", "rpc", env):
            assert add.apply_delayed((2, 3), delay=0.2).get(timeout=30) == 5
            assert add.apply_async((4, 5), countdown=0.2).get(timeout=30) == 9
    finally:
        delayq.store.close()
