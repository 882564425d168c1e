"""A project with Celery's RPC result backend (``rpc://``): a worker sends each result as a
message to the calling thread's reply queue (the message's ``reply_to``), not to a store.
Its store has a prefix of its own, beside ``tests.proj``'s on the same Redis."""

from __future__ import annotations

import os

from celery import Celery

from celery_delayq import DelayedTask, DelayQ

REDIS_URL = os.environ.get("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")

app = Celery("rpc_proj", broker=f"{REDIS_URL}/0", backend="rpc://", set_as_current=False)
app.conf.update(delayq_prefix="delayq-rpc", delayq_shards=2, delayq_idle_timeout=1.0,
                task_default_queue="rpc", broker_connection_retry_on_startup=True)
delayq = DelayQ(app)


@app.task(base=DelayedTask, name="rpc_proj.add")
def add(x: int, y: int) -> int:
    return x + y
