"""Scheduling inside a database transaction, and pushing rows whose Redis write failed.

Inside ``transaction.atomic()``, ``apply_delayed`` writes a ``DelayedTask`` row in that
transaction and the Redis write runs on commit: a rolled-back transaction schedules
nothing. Task retries are written at once (a retry raised inside ``atomic()`` rolls it
back). A row whose Redis write failed stays ``stored=False``; ``push_unstored`` (the
``delayq_reconcile`` command) writes it later. A row the admin cancelled while it was not
in Redis is not written, or, cancelled during its write, has the job just written cancelled.

Each write of a row is claimed on the row first (``store_error`` says who writes it,
``updated_at`` since when): the on-commit write when the row is written, a reconcile by a
conditional UPDATE. So two reconciles, or one and the on-commit write, never both write a
row: the second write of a job promoted meanwhile would be run again. A claim older than
``CLAIM_LEASE`` is taken over (its writer died). A writer that died after its Redis write
left a job the journal records: ``delayq_sync`` marks its row stored.
"""

from __future__ import annotations

import logging
import os
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import DatabaseError, router, transaction
from django.db.models import Q
from django.utils import timezone as dj_timezone

from celery_delayq import DelayedResult, DelayQ, DelayQError
from celery_delayq.decoding import decode
from celery_delayq.envelope import Call
from celery_delayq.errors import JobExists, StoreUnavailable
from celery_delayq.job import shown_arguments
from celery_delayq.reading import utc_of_ms
from celery_delayq.store import CancelOutcome
from celery_delayq.validation import Due

from . import times
from .columns import column_json
from .models import NOT_ENDED, DelayedTask, DelayedTaskEvent, State
from .runtime import delayq as project_delayq
from .times import from_db, to_db

logger = logging.getLogger("celery_delayq.contrib.django")
_connected: weakref.WeakSet[DelayQ] = weakref.WeakSet()

#: How long a claim keeps other writers off a row: far longer than one Redis write, and
#: than ``delayq_sync`` takes to mark stored a row whose writer died after writing it.
CLAIM_LEASE = timedelta(minutes=2)
_WRITING = "being written to Redis"
_ON_COMMIT = f"{_WRITING} on commit"
_CHUNK = 500  # rows read at once by push_unstored


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
    redis_due = None  # the due time Redis holds: a naive row's may be an hour off
    if existing is not None and existing.stored:
        there, redis_due = _in_store(delayq, call)
        if not there:
            existing = None  # cancelled or run since: the mirror lags the store (delayq_sync)
    if existing is not None and if_exists == "keep":
        return DelayedResult(existing.task_id or existing.job_id, existing.job_id,
                             redis_due or from_db(existing.due), delayq)
    if existing is not None and if_exists == "error":
        raise JobExists(call.job_id)
    now = dj_timezone.now()
    eta = _estimate(due)
    row, _ = rows.update_or_create(job_id=call.job_id, defaults={
        **fields, "task_id": call.task_id, "task": call.task,
        "key": call.key or "", "due": to_db(eta), "state": State.SCHEDULED, "stored": False,
        "store_error": _ON_COMMIT, "envelope": call.envelope, "scheduled_at": now,
        **NOT_ENDED,
    })
    transaction.on_commit(lambda: _submit(delayq, row.pk, call, due, if_exists, now),
                          using=using)
    return DelayedResult(call.task_id, call.job_id, eta, delayq)


def _in_store(delayq: DelayQ, call: Call) -> tuple[bool, datetime | None]:
    """Whether the store holds ``call``'s job id (pending or being promoted), as a write
    outside a transaction would find it, and its due time there; (True, None) when its
    Redis cannot say (the row, which says so, is trusted then)."""
    try:
        job = delayq.store.get(call.job_id, call.key)
    except DelayQError:
        return True, None
    if job is None or job.state == "dead":
        return False, None
    return True, job.due


def _submit(delayq: DelayQ, pk: int, call: Call, due: Due, if_exists: str,
            claimed_at: datetime) -> None:
    """The on-commit Redis write; never raised (raised, it would skip the later on-commit
    callbacks and fail the request after its commit): a failure of Redis is recorded on the
    row, one of the database logged (the row keeps its claim, which reconcile takes over)."""
    try:
        _write_committed(delayq, pk, call, due, if_exists, claimed_at)
    except DatabaseError as exc:
        logger.warning("delayed job %s: its row could not be updated after the commit (%s); "
                       "manage.py delayq_reconcile writes the job to Redis, or keeps the one "
                       "Redis has, once the row's claim ends", call.job_id, exc)


def _write_committed(delayq: DelayQ, pk: int, call: Call, due: Due, if_exists: str,
                     claimed_at: datetime) -> None:
    """:func:`_submit`'s work. After a long transaction, its claim is renewed first, unless
    another writer took it over."""
    rows = DelayedTask.objects.filter(pk=pk)
    now = dj_timezone.now()
    if now - claimed_at > CLAIM_LEASE / 2 and not rows.filter(
            state=State.SCHEDULED, stored=False, store_error=_ON_COMMIT).update(updated_at=now):
        return  # written, cancelled or taken over since
    try:
        result = delayq.submit([(call, due)], if_exists)[0]
    except (DelayQError, redis.RedisError) as exc:  # raised, it would skip later on_commits
        logger.warning("delayed job %s is committed but not in Redis yet (%s); "
                       "manage.py delayq_reconcile will push it", call.job_id, exc)
        rows.update(store_error=str(exc))
        _local_event(pk, "store write failed", str(exc))
        return
    due_at = {} if result.eta is None else {"due": to_db(result.eta)}
    _written(delayq, pk, call, task_id=result.id, **due_at)  # (a kept job's own)


@dataclass
class PushReport:
    """What ``push_unstored`` did."""

    pushed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: (``reconcile --missing``) rows not in Redis left alone: see ``reconcile.Missing``
    unknown: list[str] = field(default_factory=list)
    #: rows another writer (an on-commit write, another reconcile) had claimed and has not
    #: written yet: left to it
    busy: list[str] = field(default_factory=list)


def push_unstored(delayq: DelayQ | None = None, queryset=None,
                  progress: Callable[[int], None] | None = None) -> PushReport:
    """Write pending rows that are not in Redis (``stored=False``) to the store, keeping
    jobs Redis already has; each row is due at its recorded time (now if that has passed).
    Each row is claimed first: one another writer holds is left to it, one cancelled since
    it was listed is skipped, or, during its write, its job cancelled. The rows are read in
    chunks, and each write is its own transaction, so no read stays open across writes (on
    SQLite another connection's commit then fails the next write). ``progress`` is given
    the running count of rows pushed."""
    delayq = delayq or project_delayq()
    report = PushReport()
    rows = DelayedTask.objects.unstored() if queryset is None else queryset
    pks = list(rows.values_list("pk", flat=True))
    by = f"{_WRITING} by delayq_reconcile (pid {os.getpid()} on {socket.gethostname()})"
    down: StoreUnavailable | None = None  # then the rest are not tried: each would wait
    for start in range(0, len(pks), _CHUNK):
        chunk = DelayedTask.objects.where_written().in_bulk(pks[start:start + _CHUNK])
        for row in (chunk[pk] for pk in pks[start:start + _CHUNK] if pk in chunk):
            if down is not None:
                report.failed[row.job_id] = f"not tried: {down}"
                continue
            down = _push(delayq, row, by, report)
            if progress is not None:
                progress(len(report.pushed))
    report.busy = [job_id for start in range(0, len(report.busy), _CHUNK)
                   for job_id in DelayedTask.objects.unstored().filter(  # its writer is done
                       job_id__in=report.busy[start:start + _CHUNK]).values_list(
                       "job_id", flat=True)]
    return report


def _push(delayq: DelayQ, row: DelayedTask, by: str,
          report: PushReport) -> StoreUnavailable | None:
    """Claim one row and write its job, keeping one Redis has; the store's error when it
    is unavailable (the rest are then not tried)."""
    now = dj_timezone.now()
    claimable = ~Q(store_error__startswith=_WRITING) | Q(updated_at__lt=now - CLAIM_LEASE)
    rows = DelayedTask.objects.where_written().filter(pk=row.pk)
    if not rows.unstored().filter(claimable).update(store_error=by, updated_at=now):
        if rows.unstored().exists():  # else written, cancelled or run since it was listed
            report.busy.append(row.job_id)
        return None
    if not row.envelope:
        report.failed[row.job_id] = error = "no stored call to push (envelope unknown)"
        rows.update(store_error=error)
        return None
    call = Call(job_id=row.job_id, task_id=row.task_id or row.job_id, task=row.task,
                key=row.key or None, envelope=row.envelope)
    due_ms = round(from_db(row.due).timestamp() * 1000) if row.due else None
    due = Due(at_ms=due_ms, delay_ms=None) if due_ms else Due(at_ms=None, delay_ms=0)
    try:
        result = delayq.submit([(call, due)], "keep")[0]
    except DelayQError as exc:
        report.failed[row.job_id] = str(exc)
        rows.update(store_error=str(exc))
        return exc if isinstance(exc, StoreUnavailable) else None
    if _written(delayq, row.pk, call, task_id=result.id, due=to_db(result.eta) or row.due):
        _local_event(row.pk, "pushed", "written to Redis by delayq_reconcile")
        report.pushed.append(row.job_id)
    return None


def _written(delayq: DelayQ, pk: int, call: Call, **changes) -> bool:
    """Mark the row stored after its job's Redis write (``changes``: the task id and due
    time Redis holds, a kept job's); if the row was cancelled meanwhile, cancel the job just
    written (False). When that cancel fails, the row is scheduled again with a "cancel
    failed" event saying why (the error is not raised)."""
    rows = DelayedTask.objects.where_written().filter(pk=pk)
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
            rows.filter(state=State.CANCELLED).update(store_error="")  # its claim
            return False
        why = "a carrier took it first: it runs"
    logger.error("delayed job %s was cancelled while it was written to Redis, but %s",
                 call.job_id, why)
    rows.filter(state=State.CANCELLED).update(
        state=State.SCHEDULED, stored=True, store_error="", **NOT_ENDED, **changes)
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


def _estimate(due: Due) -> datetime:
    """The due time (UTC) by the local clock: Redis's clock decides it on commit."""
    if due.at_ms is not None:
        return utc_of_ms(due.at_ms)
    return times.utc_now() + timedelta(milliseconds=due.delay_ms or 0)


def _local_event(pk: int, event: str, detail: str) -> None:
    DelayedTaskEvent.objects.create(delayed_task_id=pk, event=event, at=dj_timezone.now(),
                                    detail=detail)
