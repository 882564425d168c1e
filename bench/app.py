"""The Celery app the benchmarks run, in-process and as ``celery -A bench.app`` subprocesses.

Its Redis comes from ``DELAYQ_BENCH_REDIS_URL`` (set by the harness before import). Both
probe tasks push one JSON record per run, ``{"id", "due", "start"}`` (ms), onto the
Redis list named by their first argument, so any process can read what ran and when.
A worker's main process also records its garbage collections (:data:`GC_PAUSES`): its event
loop starts no task while one runs.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections import deque

import redis
from celery import Celery, Task, signals
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
#: Each collection of a worker's main process that took at least ``GC_PAUSE_MS``, as JSON
#: ``{"end": ms, "ms": pause, "gen": generation}`` (Celery's per-task reference cycles are
#: freed by the full, generation-2, collections).
GC_PAUSES = "bench:gc_pauses"
GC_PAUSE_MS = 1.0


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


@signals.worker_init.connect
def _record_gc_pauses(**_: object) -> None:
    """Time the worker main process's collections; a thread pushes the long ones to Redis
    (not the callback: it runs inside the collection)."""
    main, began, pauses = os.getpid(), [0.0], deque()

    def note(phase: str, info: dict) -> None:
        if os.getpid() != main:  # a pool child, forked with this callback
            return
        if phase == "start":
            began[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - began[0]) * 1000
        if ms >= GC_PAUSE_MS:
            pauses.append(json.dumps({"end": time.time() * 1000, "ms": ms,
                                      "gen": info["generation"]}))

    def push() -> None:
        while True:
            time.sleep(0.5)
            batch = [pauses.popleft() for _ in range(len(pauses))]
            if batch:
                _records.rpush(GC_PAUSES, *batch)

    gc.callbacks.append(note)
    threading.Thread(target=push, name="bench-gc-pauses", daemon=True).start()
