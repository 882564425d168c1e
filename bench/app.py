"""The Celery app the benchmarks run, in-process and as ``celery -A bench.app`` subprocesses.

Its Redis comes from ``DELAYQ_BENCH_REDIS_URL`` (set by the harness before import). Both
probe tasks push one JSON record per run, ``{"id", "due", "start"}`` (ms), onto the
Redis list named by their first argument, so any process can read what ran and when.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task
from kombu import Queue

from celery_delayq import DelayedTask, DelayQ

REDIS_URL = os.environ.get("DELAYQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379")
BROKER_URL = f"{REDIS_URL}/0"
#: Jobs of the promotion-throughput phase go to this queue, which no worker consumes.
SINK_QUEUE = "bench.sink"

app = Celery("bench", broker=BROKER_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue="celery",
    # Declared, so a carrier started with --direct routes the sink queue from the start.
    task_queues=[Queue("celery"), Queue(SINK_QUEUE)],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    # native_probe.apply_async(countdown=...) must stay Celery's own ETA (the comparison arm):
    # by default DelayQ routes send_task's countdown/eta through the store too.
    delayq_route_send_task=False,
    # "0" turns off the worker's started/succeeded journal events (two XADDs per task).
    delayq_worker_events=os.environ.get("DELAYQ_BENCH_WORKER_EVENTS", "1") != "0",
)
delayq = DelayQ(app)
_records = redis.Redis.from_url(BROKER_URL)


def _record(task: Task, runs_key: str) -> None:
    started_ms = time.time() * 1000
    request = task.request
    _records.rpush(runs_key, json.dumps(
        {"id": request.id, "due": request.get("delayq_due"), "start": started_ms}))


@app.task(base=DelayedTask, bind=True, name="bench.delayed_probe")
def delayed_probe(self, runs_key: str) -> None:
    """Scheduled with ``apply_delayed``; the carrier's ``delayq_due`` header is its due time."""
    _record(self, runs_key)


@app.task(bind=True, name="bench.native_probe")
def native_probe(self, runs_key: str) -> None:
    """Scheduled with Celery's own ``apply_async(countdown=...)``."""
    _record(self, runs_key)
