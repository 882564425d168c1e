"""A call's queue given as a kombu ``Queue`` object (by the call or a ``task_routes`` entry).

Natively the producer declares the Queue object it was given, then publishes. A delayed
call is published later by a carrier, which declares the queue the app knows by that
name: a Queue object is accepted only when it is that queue, and refused at the call,
with nothing stored, when it is another (its message would go where no queue is bound).

One opted-in project (``qobjproj``, written to a temporary directory) runs a real worker
and a real carrier in processes of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from celery import Celery, Task
from celery.exceptions import QueueNotFound
from kombu import Exchange, Queue

from celery_delayq import DelayQ, UnknownQueue
from tests.compat.test_do_no_harm_imports import plain_environ
from tests.conftest import sent_natively, wait_for

DB = 13  # a database of the session's Redis no other suite uses

PROJECT = '''
"""The project of tests/compat/test_queue_objects.py."""
import os

from celery import Celery
from kombu import Exchange, Queue

from celery_delayq import DelayedTask, DelayQ

URL = os.environ["QOBJ_URL"]
EVENTS = Exchange("qobj.events", type="topic")


def topic():
    """The app's queue bound to a topic exchange, as a caller builds it anew."""
    return Queue("qobj.topic", EVENTS, routing_key="qobj.#")


#: what Celery creates for a queue name the app does not declare
MADE = Queue("qobj.made", Exchange("qobj.made"), "qobj.made")
#: the reviewer's: a name the app does not declare, bound to a topic exchange
ELSEWHERE = Queue("qobj.elsewhere", Exchange("qobj.other", type="topic"), routing_key="c2.#")

app = Celery("qobjproj", broker=URL, backend=URL)
app.conf.update(broker_connection_retry_on_startup=True, task_default_queue="qobj",
                task_queues=[Queue("qobj"), topic()], delayq_shards=2,
                delayq_idle_timeout=0.2, worker_hijack_root_logger=False,
                task_routes={"qobj.routed_declared": {"queue": topic()},
                             "qobj.routed_elsewhere": {"queue": ELSEWHERE}})
DelayQ(app)


def _where(task, x):
    info = task.request.delivery_info
    return [x, info.get("exchange"), info.get("routing_key")]


@app.task(base=DelayedTask, bind=True, name="qobj.where")
def where(self, x):
    return _where(self, x)


@app.task(base=DelayedTask, bind=True, name="qobj.routed_declared")
def routed_declared(self, x):
    return _where(self, x)


@app.task(base=DelayedTask, bind=True, name="qobj.routed_elsewhere")
def routed_elsewhere(self, x):
    return _where(self, x)
'''


@dataclasses.dataclass
class Project:
    """The project, imported here, with a worker and a carrier running."""

    module: object
    app: Celery

    def natively(self) -> contextlib.AbstractContextManager[None]:
        return sent_natively(self.app)


@pytest.fixture(scope="module")
def project(redis_server, tmp_path_factory) -> Iterator[Project]:
    import redis

    home = tmp_path_factory.mktemp("qobjproj")
    (home / "qobjproj.py").write_text(PROJECT)
    url = f"{redis_server.url}/{DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    processes = []
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("QOBJ_URL", url)
            patch.syspath_prepend(str(home))
            module = importlib.import_module("qobjproj")
            env = dict(plain_environ(), PYTHONPATH=str(home), QOBJ_URL=url)
            celery = [sys.executable, "-m", "celery", "-A", "qobjproj"]
            for n, args in enumerate((
                    ["worker", "-Q", "qobj,qobj.topic,qobj.made", "-P", "threads", "-c", "2",
                     "--without-heartbeat", "--without-gossip", "--without-mingle"],
                    ["delayq", "carrier"])):
                with open(home / f"process-{n}.log", "w") as out:
                    processes.append(subprocess.Popen(celery + args, cwd=home, env=env,
                                                      stdout=out, stderr=subprocess.STDOUT))
            assert module.where.apply_async(("warm",), countdown=0.1).get(timeout=60)
            yield Project(module, module.app)
            gc.collect()  # results unsubscribe now (on Celery 5.3, at exit they wait for Redis)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        sys.modules.pop("qobjproj", None)
        client.flushdb()
        client.close()


def test_a_queue_object_equal_to_the_declared_one_is_delivered_as_natively(project):
    module = project.module
    with project.natively():
        native = Task.apply_async(module.where, ("x",), countdown=0.3, queue=module.topic())
    delayed = module.where.apply_async(("x",), countdown=0.3, queue=module.topic())
    parked = module.where.apply_delayed(("x",), delay=0.3, queue=module.topic())
    routed = module.routed_declared.apply_async(("x",), countdown=0.3)
    expected = native.get(timeout=20)
    assert expected == ["x", "qobj.events", "qobj.#"]
    assert [r.get(timeout=20) for r in (delayed, parked, routed)] == [expected] * 3


def test_a_queue_object_equal_to_the_one_celery_creates_for_its_name_is_delivered(project):
    module = project.module
    with project.natively():
        native = Task.apply_async(module.where, ("m",), countdown=0.3, queue=module.MADE)
    delayed = module.where.apply_async(("m",), countdown=0.3, queue=module.MADE)
    assert delayed.get(timeout=20) == native.get(timeout=20) == ["m", "", "qobj.made"]


#: calls of a Queue object the app does not declare, bound to a topic exchange of its own
ELSEWHERE_CALLS = {
    "apply_async": lambda m: m.where.apply_async((1,), countdown=1, queue=m.ELSEWHERE),
    "apply_delayed": lambda m: m.where.apply_delayed((1,), delay=1, queue=m.ELSEWHERE),
    "apply_delayed_many": lambda m: m.where.apply_delayed_many(
        [{"args": (1,), "delay": 1}], queue=m.ELSEWHERE)[0],
    "send_task": lambda m: m.app.send_task("qobj.where", (1,), countdown=1,
                                           queue=m.ELSEWHERE),
    "task_routes": lambda m: m.routed_elsewhere.apply_async((1,), countdown=1),
}


@pytest.mark.parametrize("call", list(ELSEWHERE_CALLS))
def test_a_queue_object_the_app_does_not_declare_is_delivered_to_the_queue_of_its_name(
        project, call):
    """Natively the producer declares the Queue it is given; the carrier, publishing later,
    declares the app's queue of that name (here one Celery creates). The call stored the
    Queue's own topic exchange, which had no binding then: kombu dropped the message."""
    import redis

    sent = ELSEWHERE_CALLS[call](project.module)
    broker = redis.Redis.from_url(project.module.URL)
    wait_for(lambda: sent.id in [json.loads(raw)["headers"]["id"]
                                 for raw in broker.lrange("qobj.elsewhere", 0, -1)],
             timeout=20, what="the message on qobj.elsewhere")
    broker.delete("qobj.elsewhere")
    broker.close()


def test_a_queue_object_of_a_declared_name_bound_otherwise_goes_through_the_apps_queue(
        project):
    module = project.module
    rebound = Queue("qobj.topic", module.EVENTS, routing_key="elsewhere.#")
    delayed = module.where.apply_async(("r",), countdown=0.3, queue=rebound)
    assert delayed.get(timeout=20) == ["r", "qobj.events", "qobj.#"]


@contextlib.contextmanager
def opted_in(redis_server, **settings) -> Iterator[Celery]:
    """An app of the project's store (no worker, no carrier) with these settings."""
    app = Celery("qobj-other", broker=f"{redis_server.url}/{DB}", set_as_current=False)
    app.conf.update(task_default_queue="qobj", delayq_shards=2, **settings)
    DelayQ(app)
    try:
        yield app
    finally:
        DelayQ._opt_out(app)


def test_a_queue_object_the_app_does_not_declare_is_refused_when_queues_are_not_created(
        redis_server):
    with opted_in(redis_server, task_create_missing_queues=False) as app:
        with pytest.raises(QueueNotFound, match="unknown queue"):
            app.send_task("qobj.any", countdown=1, queue=Queue("undeclared"))
        assert DelayQ.of(app).pending() == []


@pytest.mark.parametrize("queue", [Queue("qobj.prio"), Queue("qobj.prio", Exchange("qobj.prio"),
                                                             "qobj.prio")],
                         ids=["default exchange", "its own exchange"])
def test_a_queue_object_is_taken_on_an_app_with_a_max_priority(redis_server, queue):
    """Celery adds ``x-max-priority`` to the app's queues; the Queue given has none."""
    with opted_in(redis_server, task_queue_max_priority=10) as app:
        stored = app.send_task("qobj.any", countdown=600, queue=queue)
        assert DelayQ.of(app).get(stored.job_id).queue == "qobj.prio"
        assert DelayQ.of(app).cancel(stored.job_id)


def test_an_unknown_queue_is_celerys_queue_not_found(redis_server):
    """``except QueueNotFound:`` catches a delayed call's unknown queue as a native one's."""
    with opted_in(redis_server, task_create_missing_queues=False) as app:
        with pytest.raises(QueueNotFound):
            Celery.send_task(app, "qobj.any", queue="nowhere")  # native
        with pytest.raises(QueueNotFound) as refused:
            app.send_task("qobj.any", countdown=1, queue="nowhere")
        assert isinstance(refused.value, UnknownQueue)
        assert str(refused.value).startswith("unknown queue: "), "not quoted as a KeyError"
