"""The Celery project the tests run: in-process, and as ``celery -A tests.proj`` subprocesses.

Its Redis comes from ``DELAYQ_TEST_REDIS_URL`` (set by ``tests/conftest.py``), the delay
store's from ``DELAYQ_TEST_STORE_URL`` when the store runs on a cluster, and its default
queue from ``DELAYQ_TEST_DEFAULT_QUEUE`` when its CLI reads a store another app made. Tasks
record each run in the Redis list ``test:runs`` so tests can count executions made by
any process.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import redis
from celery import Celery, chain
from celery.exceptions import Ignore, Reject

from celery_delayq import DelayedTask, DelayQ

REDIS_URL = os.environ.get("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
RUNS = "test:runs"

app = Celery("proj", broker=f"{REDIS_URL}/0", backend=f"{REDIS_URL}/0")
app.conf.update(
    delayq_redis_url=os.environ.get("DELAYQ_TEST_STORE_URL"),  # default: the broker's Redis
    delayq_shards=4,
    delayq_idle_timeout=1.0,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_redirect_stdouts=False,  # pytest owns stdout; several embedded workers may run
    task_default_queue=os.environ.get("DELAYQ_TEST_DEFAULT_QUEUE", "celery"),
    # Short only where a test re-delivers an acks_late task of a killed worker.
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("DELAYQ_TEST_VISIBILITY", 3600)),
        "unacked_restore_interval": 1,
    },
)
delayq = DelayQ(app)
_runs = redis.Redis.from_url(f"{REDIS_URL}/0")


def _record(task, label) -> None:
    request = task.request
    _runs.rpush(RUNS, json.dumps({
        "label": label, "task_id": request.id, "retries": request.retries,
        "job": request.get("delayq_job"), "due_ms": request.get("delayq_due"),
        "started_ms": time.time() * 1000,
    }))


@app.task(base=DelayedTask, bind=True)
def record(self, label):
    """Record this run and return the label."""
    _record(self, label)
    return label


@app.task(base=DelayedTask, bind=True, max_retries=3)
def flaky(self, label, failures=1, countdown=0.5):
    """Fail ``failures`` times, retrying through the store, then succeed."""
    _record(self, label)
    if self.request.retries < failures:
        raise self.retry(countdown=countdown)
    return label


@app.task(base=DelayedTask, bind=True, max_retries=3)
def slow_flaky(self, label, seconds=1.0, countdown=600):
    """Record this run, take ``seconds``, then retry once through the store."""
    _record(self, label)
    time.sleep(seconds)
    if self.request.retries < 1:
        raise self.retry(countdown=countdown)
    return label


@app.task(base=DelayedTask, bind=True)
def forwards_headers(self, label, children=3):
    """Record this run, then schedule ``children`` delayed ``record`` calls that carry this
    run's headers on (a tracing habit: ``headers=self.request.headers``)."""
    _record(self, label)
    return [record.apply_async((f"{label} child {n}",), countdown=0.2,
                               headers=self.request.headers).id for n in range(children)]


@app.task(bind=True, max_retries=3)
def plain_flaky(self, label, failures=1, countdown=0.5):
    """``flaky`` without DelayedTask: its retry reaches the store through send_task."""
    return flaky.run.__func__(self, label, failures, countdown)  # type: ignore[attr-defined]


@app.task(base=DelayedTask, bind=True, acks_late=True)
def slow(self, label, seconds=3.0):
    """Record this run, then take ``seconds`` (acknowledged only when done)."""
    _record(self, label)
    time.sleep(seconds)
    return label


@app.task(bind=True)
def plain(self, label):
    """A task without DelayedTask: its countdown reaches the store through send_task."""
    _record(self, label)
    return label


@app.task(base=DelayedTask, bind=True)
def anything(self, *args, **kwargs):
    """Take any arguments (for tests of what the store keeps of them); return them."""
    return [list(args), kwargs]


@app.task(base=DelayedTask, bind=True)
def request_of(self, *headers):
    """What the task sees of its request: ``eta`` (ISO text or None) and the named headers."""
    return {"eta": self.request.eta, **{name: self.request.get(name) for name in headers}}


@app.task(base=DelayedTask, bind=True)
def fails(self, label):
    """Record this run, then raise."""
    _record(self, label)
    raise ValueError(label)


@app.task(base=DelayedTask, bind=True)
def ignored(self, label):
    """Record this run, then raise ``Ignore`` (no outcome recorded)."""
    _record(self, label)
    raise Ignore()


@app.task(base=DelayedTask, bind=True)
def rejected(self, label):
    """Record this run, then reject the message for good."""
    _record(self, label)
    raise Reject(label, requeue=False)


@app.task(base=DelayedTask, bind=True)
def rejected_as_its_journal_stalls(self, label):
    """Reject the message for good while this process's journal writer is held for 0.5 s
    (a CPU-starved process): its ``started`` event has not been written yet."""
    from celery_delayq import journal

    held = threading.Event()

    def hold() -> None:
        with journal._outbox._writing:
            held.set()
            time.sleep(0.5)

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    _record(self, label)
    raise Reject(label, requeue=False)


@app.task(base=DelayedTask, bind=True)
def replaced(self, label, queue="celery"):
    """Record this run, then replace it with ``record`` on ``queue``."""
    _record(self, label)
    raise self.replace(record.s(f"{label} replacement").set(queue=queue))


@app.task(base=DelayedTask, bind=True)
def replaced_by_a_chain(self, label):
    """Record this run, then replace it with a chain whose last step, which takes this
    run's task id, is delayed an hour (the previous step's worker sends it)."""
    _record(self, label)
    raise self.replace(chain(record.s(f"{label} step"), record.s().set(countdown=3600)))


@app.task(base=DelayedTask, bind=True, time_limit=1)
def over_time_limit(self, label):
    """Record this run, then outlast the hard time limit (prefork kills it)."""
    _record(self, label)
    time.sleep(10)


@app.task(base=DelayedTask, bind=True)
def kills_its_process(self, label):
    """Record this run, then SIGKILL its own process: only for a spawned prefork worker."""
    _record(self, label)
    time.sleep(0.3)  # its started event is written first
    os.kill(os.getpid(), signal.SIGKILL)


def runs() -> list[dict]:
    """Every recorded run, in order."""
    return [json.loads(raw) for raw in _runs.lrange(RUNS, 0, -1)]
