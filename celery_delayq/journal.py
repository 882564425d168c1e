"""Worker-side journal events: started, succeeded, failed, retried for delayed tasks.

The store's scripts journal scheduled / rescheduled / cancelled / promoted / dead
themselves; a worker adds what happens to a promoted task through Celery's signals,
recognising it by the ``delayq_job`` header the carrier sets.
"""

from __future__ import annotations

import logging
import threading

from celery import signals
from celery import states as celery_states

from .envelope import HEADER_DUE, HEADER_JOB, HEADER_KEY, HEADER_SHARD
from .errors import DelayQError

logger = logging.getLogger("celery_delayq.journal")

_OUTCOMES = {
    celery_states.SUCCESS: "succeeded",
    celery_states.FAILURE: "failed",
    celery_states.RETRY: "retried",
}
_connected = threading.Event()


def connect() -> None:
    """Connect the signal handlers once per process (they serve every app)."""
    if not _connected.is_set():
        signals.task_prerun.connect(_on_prerun, weak=False)
        signals.task_postrun.connect(_on_postrun, weak=False)
        _connected.set()


def _on_prerun(sender=None, task_id=None, task=None, **_) -> None:
    _record(task, task_id, "started")


def _on_postrun(sender=None, task_id=None, task=None, state=None, **_) -> None:
    event = _OUTCOMES.get(state)
    if event:
        _record(task, task_id, event)


def _record(task, task_id: str | None, event: str) -> None:
    request = getattr(task, "request", None)
    job_id = request.get(HEADER_JOB) if request is not None else None
    if job_id is None:
        return
    from .extension import DelayQ

    delayq = DelayQ.lookup(task.app)
    if delayq is None or not delayq.config.worker_events:
        return
    try:
        delayq.store.journal(int(request.get(HEADER_SHARD)), event, {
            "job": job_id, "task": task.name, "key": request.get(HEADER_KEY) or "",
            "task_id": task_id or "", "retries": request.retries or 0,
            "due": request.get(HEADER_DUE) or "",
        })
    except (DelayQError, TypeError, ValueError) as exc:
        logger.warning("could not journal %s of delayed job %s: %s", event, job_id, exc)
