"""Repair the store from the database (``manage.py delayq_reconcile``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from django.db.models import Max

from celery_delayq import DelayQ
from celery_delayq.events import Event

from .models import DelayedTask, DelayedTaskEvent, JournalCursor
from .runtime import delayq as project_delayq
from .sync import JournalSync
from .times import db_time_of_ms
from .transactional import PushReport, push_unstored

_CHUNK = 500


class Missing(NamedTuple):
    """What :func:`mark_missing` found among pending rows whose job Redis does not hold."""

    marked: list[str]  # lost by Redis: marked unstored, so reconcile pushes them
    unknown: list[str]  # not updated since journal events were lost: may have run or been
    #                     cancelled meanwhile, so left alone unless include_unknown


def mark_missing(delayq: DelayQ | None = None, include_unknown: bool = False) -> Missing:
    """Mark pending rows whose job Redis no longer holds as unstored.

    The journal is applied first (twice, around the check), so a job promoted or cancelled
    meanwhile is not taken for a lost one. A row not updated since its shard's journal lost
    events (``JournalCursor.lost_until``: trimmed before the sync read them, or lost with
    Redis's data) may have run or been cancelled in what was lost: it is left alone and
    listed as ``unknown``, unless ``include_unknown`` (Redis is known to have lost it).
    """
    delayq = delayq or project_delayq()
    sync = JournalSync(delayq)
    sync.run_once()
    suspects = _absent(delayq, list(DelayedTask.objects.pending().filter(stored=True)))
    sync.run_once()
    rows = list(DelayedTask.objects.pending().filter(
        job_id__in=[row.job_id for row in suspects]).annotate(seen=Max("events__at")))
    unknown = [] if include_unknown else _not_updated_since_a_loss(delayq, rows)
    marked = [row.job_id for row in rows if row.job_id not in unknown]
    DelayedTask.objects.filter(job_id__in=marked).update(
        stored=False, store_error="missing from Redis")
    return Missing(sorted(marked), sorted(unknown))


def reconcile(delayq: DelayQ | None = None, missing: bool = False,
              include_unknown: bool = False,
              progress: Callable[[int], None] | None = None) -> PushReport:
    """Push unstored rows; with ``missing``, first find pending rows Redis lost (the
    report's ``unknown`` lists those :func:`mark_missing` left alone). ``progress`` is
    given the running count of rows pushed."""
    delayq = delayq or project_delayq()
    found = mark_missing(delayq, include_unknown) if missing else Missing([], [])
    report = push_unstored(delayq, progress=progress)
    report.unknown = found.unknown
    return report


def _not_updated_since_a_loss(delayq: DelayQ, rows: list[DelayedTask]) -> list[str]:
    """The rows (annotated with ``seen``, their last event's time) whose last event or
    creation comes before the journal of their shard lost events up to its cursor's
    ``lost_until``; for a row that was moved (replaced under a key of another shard, whose
    journal may have lost that), before any shard's."""
    lost = {cursor.shard: db_time_of_ms(cursor.lost_until.split("-")[0])
            for cursor in JournalCursor.objects.filter(prefix=delayq.store.keys.prefix)
            .exclude(lost_until="")}
    if not lost:
        return []
    keys = delayq.store.keys
    latest = max((until for until in lost.values() if until is not None), default=None)
    moved = set(DelayedTaskEvent.objects.filter(
        delayed_task__in=rows, event=Event.MOVED).values_list("delayed_task__job_id", flat=True))
    return [row.job_id for row in rows
            if (until := latest if row.job_id in moved
                else lost.get(keys.shard_for(row.job_id, row.key or None).shard))
            and (row.seen or row.created_at) <= until]


def _absent(delayq: DelayQ, rows: list[DelayedTask]) -> list[DelayedTask]:
    absent: list[DelayedTask] = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        held = delayq.store.held([(row.job_id, row.key or None) for row in chunk])
        absent.extend(row for row, there in zip(chunk, held, strict=True) if not there)
    return absent
