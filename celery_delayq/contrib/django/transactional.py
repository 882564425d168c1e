"""Scheduling inside a database transaction, and pushing rows whose Redis write failed.

Inside ``transaction.atomic()``, ``apply_delayed`` writes a ``DelayedTask`` row in that
transaction and the Redis write runs on commit: a rolled-back transaction schedules
nothing. Task retries are written at once (a retry raised inside ``atomic()`` rolls it
back). A row whose Redis write failed stays ``stored=False``; ``push_unstored`` (the
``delayq_reconcile`` command) writes it later. A row the admin cancelled while it was not
in Redis is not written, or, cancelled during its write, has the job just written cancelled.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import router, transaction
from django.utils import timezone as dj_timezone

from celery_delayq import DelayedResult, DelayQ, DelayQError
from celery_delayq.decoding import decode
from celery_delayq.envelope import Call
from celery_delayq.errors import JobExists, StoreUnavailable
from celery_delayq.job import shown_arguments
from celery_delayq.reading import utc_of_ms
from celery_delayq.store import CancelOutcome
from celery_delayq.validation import Due

from .columns import column_json
from .models import DelayedTask, DelayedTaskEvent, State
from .runtime import delayq as project_delayq
from .times import from_db, to_db

logger = logging.getLogger("celery_delayq.contrib.django")
_connected: weakref.WeakSet[DelayQ] = weakref.WeakSet()


def connect(delayq: DelayQ | None = None) -> None:
    """Make ``apply_delayed`` transactional for the project's app (once per ``DelayQ``)."""
    delayq = delayq or project_delayq()
    if delayq not in _connected:
        delayq.add_interceptor(intercept)
        _connected.add(delayq)


def intercept(delayq: DelayQ, call: Call, due: Due, if_exists: str) -> DelayedResult | None:
    """Take over calls made inside an atomic block; None lets the store write right away."""
    if not getattr(settings, "DELAYQ_TRANSACTIONAL", True):
        return None
    using = router.db_for_write(DelayedTask)
    if not transaction.get_connection(using).in_atomic_block:
        return None
    fields = _fields_of(call.envelope, delayq.config.default_queue)
    if fields["retries"]:
        # ``raise self.retry(...)`` inside atomic() rolls the block back: a retry deferred
        # to its commit would be lost, so it is written now, as Celery would publish it.
        return None
    rows = DelayedTask.objects.using(using)
    existing = rows.filter(job_id=call.job_id, state=State.SCHEDULED).first()
    if existing is not None and if_exists == "keep":
        return DelayedResult(existing.task_id or existing.job_id, existing.job_id,
                             from_db(existing.due), delayq)
    if existing is not None and if_exists == "error":
        raise JobExists(call.job_id)
    now = dj_timezone.now()
    eta = _estimate(due, now)
    row, _ = rows.update_or_create(job_id=call.job_id, defaults={
        **fields, "task_id": call.task_id, "task": call.task,
        "key": call.key or "", "due": eta, "state": State.SCHEDULED, "stored": False,
        "store_error": "", "envelope": call.envelope, "scheduled_at": now,
    })
    transaction.on_commit(lambda: _submit(delayq, row.pk, call, due, if_exists), using=using)
    return DelayedResult(call.task_id, call.job_id, from_db(eta), delayq)


def _submit(delayq: DelayQ, pk: int, call: Call, due: Due, if_exists: str) -> None:
    """The on-commit Redis write; a failure is recorded on the row, never raised."""
    rows = DelayedTask.objects.filter(pk=pk)
    try:
        result = delayq.submit([(call, due)], if_exists)[0]
    except (DelayQError, redis.RedisError) as exc:  # raised, it would skip later on_commits
        logger.warning("delayed job %s is committed but not in Redis yet (%s); "
                       "manage.py delayq_reconcile will push it", call.job_id, exc)
        rows.update(store_error=str(exc))
        _local_event(pk, "store write failed", str(exc))
        return
    due_at = {} if result.eta is None else {"due": to_db(result.eta)}
    _written(delayq, pk, call, **due_at)


@dataclass
class PushReport:
    """What ``push_unstored`` did."""

    pushed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: (``reconcile --missing``) rows not in Redis left alone: see ``reconcile.Missing``
    unknown: list[str] = field(default_factory=list)


def push_unstored(delayq: DelayQ | None = None, queryset=None) -> PushReport:
    """Write pending rows that are not in Redis (``stored=False``) to the store, keeping
    jobs Redis already has; each row is due at its recorded time (now if that has passed).
    A row cancelled since it was listed is skipped, or, during its write, its job cancelled."""
    delayq = delayq or project_delayq()
    report = PushReport()
    rows = DelayedTask.objects.unstored() if queryset is None else queryset
    down: StoreUnavailable | None = None  # then the rest are not tried: each would wait
    for row in rows.iterator():
        if not DelayedTask.objects.filter(pk=row.pk, state=State.SCHEDULED).exists():
            continue  # cancelled (or run) since it was listed
        if down is not None:
            report.failed[row.job_id] = f"not tried: {down}"
            continue
        if not row.envelope:
            report.failed[row.job_id] = "no stored call to push (envelope unknown)"
            continue
        call = Call(job_id=row.job_id, task_id=row.task_id or row.job_id, task=row.task,
                    key=row.key or None, envelope=row.envelope)
        due_ms = round(from_db(row.due).timestamp() * 1000) if row.due else None
        due = Due(at_ms=due_ms, delay_ms=None) if due_ms else Due(at_ms=None, delay_ms=0)
        try:
            result = delayq.submit([(call, due)], "keep")[0]
        except DelayQError as exc:
            report.failed[row.job_id] = str(exc)
            DelayedTask.objects.filter(pk=row.pk).update(store_error=str(exc))
            if isinstance(exc, StoreUnavailable):
                down = exc
            continue
        if _written(delayq, row.pk, call, due=to_db(result.eta) or row.due):
            _local_event(row.pk, "pushed", "written to Redis by delayq_reconcile")
            report.pushed.append(row.job_id)
    return report


def _written(delayq: DelayQ, pk: int, call: Call, **changes) -> bool:
    """Mark the row stored after its job's Redis write; if the row was cancelled meanwhile,
    cancel the job just written (False). When that cancel fails, the row is scheduled again
    with a "cancel failed" event saying why (the error is not raised)."""
    rows = DelayedTask.objects.filter(pk=pk)
    if rows.filter(state=State.SCHEDULED).update(stored=True, store_error="", **changes):
        return True
    row = rows.filter(state=State.CANCELLED).first()
    if row is None:  # run since (the sync moved it on)
        return True
    try:
        outcome = delayq.cancel_outcome(call.job_id, call.key, by=row.cancelled_by)
    except (DelayQError, redis.RedisError) as exc:
        why = f"the cancel did not reach Redis ({exc}): it is pending there"
    else:
        if outcome is not CancelOutcome.TOO_LATE:
            return False
        why = "a carrier took it first: it runs"
    logger.error("delayed job %s was cancelled while it was written to Redis, but %s",
                 call.job_id, why)
    rows.filter(state=State.CANCELLED).update(
        state=State.SCHEDULED, stored=True, store_error="", cancelled_at=None,
        cancelled_by="", **changes)
    _local_event(pk, "cancel failed", f"cancelled while it was written to Redis, but {why}")
    return True


def _fields_of(envelope: str, default_queue: str) -> dict:
    env = decode(envelope)
    args, kwargs = shown_arguments(env.get("a", []), env.get("k", {}), env.get("o", {}))
    # as the sync mirrors them: kombu's objects as text, what a column refuses left out
    return {"args": column_json("args", args)[0] or [],
            "kwargs": column_json("kwargs", kwargs)[0] or {},
            "queue": env.get("q") or default_queue,
            "retries": int(env.get("o", {}).get("retries", 0) or 0)}


def _estimate(due: Due, now: datetime) -> datetime | None:
    """The due time by the local clock (Redis's clock decides it on commit), as the
    database holds it (``now`` too)."""
    if due.at_ms is not None:
        return to_db(utc_of_ms(due.at_ms))
    return now + timedelta(milliseconds=due.delay_ms or 0)


def _local_event(pk: int, event: str, detail: str) -> None:
    DelayedTaskEvent.objects.create(delayed_task_id=pk, event=event, at=dj_timezone.now(),
                                    detail=detail)
