"""Repair the store from the database (``manage.py delayq_reconcile``)."""

from __future__ import annotations

from celery_delayq import DelayQ

from .models import DelayedTask
from .runtime import delayq as project_delayq
from .sync import JournalSync
from .transactional import PushReport, push_unstored

_CHUNK = 500


def mark_missing(delayq: DelayQ | None = None) -> list[str]:
    """Mark pending rows whose job Redis no longer holds as unstored; returns their ids.

    The journal is applied first (twice, around the check), so a job promoted or
    cancelled meanwhile is not taken for a lost one. Use it after Redis lost data:
    a row whose journal events were trimmed before the sync saw them looks lost too.
    """
    delayq = delayq or project_delayq()
    sync = JournalSync(delayq)
    sync.run_once()
    suspects = _absent(delayq, list(DelayedTask.objects.pending().filter(stored=True)))
    sync.run_once()
    missing = [row.job_id for row in DelayedTask.objects.pending().filter(
        job_id__in=[row.job_id for row in suspects])]
    DelayedTask.objects.filter(job_id__in=missing).update(
        stored=False, store_error="missing from Redis")
    return missing


def reconcile(delayq: DelayQ | None = None, missing: bool = False) -> PushReport:
    """Push unstored rows; with ``missing``, first find pending rows Redis lost."""
    delayq = delayq or project_delayq()
    if missing:
        mark_missing(delayq)
    return push_unstored(delayq)


def _absent(delayq: DelayQ, rows: list[DelayedTask]) -> list[DelayedTask]:
    absent: list[DelayedTask] = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        held = delayq.store.held([(row.job_id, row.key or None) for row in chunk])
        absent.extend(row for row, there in zip(chunk, held, strict=True) if not there)
    return absent
