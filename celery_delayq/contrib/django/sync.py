"""Mirror the store's journal into ``DelayedTask`` rows (``manage.py delayq_sync``).

Each shard's journal stream is read from the last applied entry on; a batch of events
and the shard's cursor are saved in one database transaction, so a restarted sync
resumes exactly where it stopped and never applies an event twice.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from django.db import DatabaseError, transaction

from celery_delayq import DelayQ, DelayQError
from celery_delayq.envelope import decode
from celery_delayq.errors import PayloadError
from celery_delayq.keys import ShardKeys

from .models import DelayedTask, DelayedTaskEvent, JournalCursor, State
from .runtime import delayq as project_delayq

logger = logging.getLogger("celery_delayq.contrib.django.sync")

_ENVELOPE_EVENTS = frozenset({"scheduled", "rescheduled", "replayed"})
_DUE_EVENTS = frozenset({"scheduled", "rescheduled", "recovered", "replayed"})
_ROW_FIELDS = [
    "task_id", "task", "args", "kwargs", "queue", "key", "due", "state", "retries", "stored",
    "store_error", "envelope", "scheduled_at", "promoted_at", "started_at", "finished_at",
    "cancelled_at", "cancelled_by", "dead_at", "reason",
]


class JournalSync:
    """Applies journal events of one store to the database, batch by batch."""

    def __init__(self, delayq: DelayQ | None = None, batch: int = 500) -> None:
        self.delayq = delayq or project_delayq()
        self.store = self.delayq.store
        self.batch = batch
        self._stop = threading.Event()

    def run_once(self) -> int:
        """Apply every event journaled so far; returns how many were applied."""
        total = 0
        for shard in self.store.keys:
            while True:
                applied = self._apply_batch(shard)
                total += applied
                if applied < self.batch:
                    break
        return total

    def run(self, interval: float = 0.5) -> None:
        """Apply events until :meth:`stop`, polling every ``interval`` seconds when idle."""
        backoff = interval
        while not self._stop.is_set():
            try:
                applied = self.run_once()
                backoff = interval
            except (DelayQError, DatabaseError) as exc:
                logger.warning("journal sync failed, retrying in %.1fs: %s", backoff, exc)
                applied = 0
                backoff = min(backoff * 2, 10.0)
            if not applied:
                self._stop.wait(backoff)

    def stop(self) -> None:
        self._stop.set()

    def lag(self) -> float:
        """Seconds between now and the newest journal entry not yet applied (0 if none)."""
        oldest = None
        for shard in self.store.keys:
            entries = self.store.read_journal(shard, self._cursor(shard).last_id, count=1)
            if entries:
                at = int(entries[0][0].split("-")[0]) / 1000
                oldest = at if oldest is None else min(oldest, at)
        return 0.0 if oldest is None else max(time.time() - oldest, 0.0)

    # -- one batch ---------------------------------------------------------------------

    def _cursor(self, shard: ShardKeys) -> JournalCursor:
        cursor, _ = JournalCursor.objects.get_or_create(prefix=self.store.keys.prefix,
                                                        shard=shard.shard)
        return cursor

    def _apply_batch(self, shard: ShardKeys) -> int:
        cursor = self._cursor(shard)
        entries = self.store.read_journal(shard, cursor.last_id, count=self.batch)
        if not entries:
            return 0
        wanted = sorted({f["job"] for _, f in entries
                         if f.get("event") in _ENVELOPE_EVENTS and f.get("job")})
        envelopes = self.store.envelopes(shard, wanted)
        with transaction.atomic():
            locked = JournalCursor.objects.select_for_update().get(pk=cursor.pk)
            if locked.last_id != cursor.last_id:  # another sync moved it meanwhile
                return 0
            job_ids = {f["job"] for _, f in entries if f.get("job")}
            rows = DelayedTask.objects.in_bulk(job_ids, field_name="job_id")
            known = set(rows)
            events = []
            for stream_id, fields in entries:
                job_id = fields.get("job")
                if not job_id:
                    continue
                at = _at(stream_id)
                row = rows.get(job_id)
                if row is None:
                    row = rows[job_id] = DelayedTask(job_id=job_id, task=fields.get("task", ""),
                                                     created_at=at)
                apply_event(row, fields, at, envelopes.get(job_id),
                            self.store.config.default_queue)
                events.append(DelayedTaskEvent(
                    delayed_task=row, event=fields.get("event", ""), at=at,
                    due=_ms(fields.get("due")), detail=_detail(fields), stream_id=stream_id))
            new = [row for job_id, row in rows.items() if job_id not in known]
            DelayedTask.objects.bulk_create(new)
            DelayedTask.objects.bulk_update([rows[j] for j in known], _ROW_FIELDS)
            for event in events:  # rows created above have their pk now
                event.delayed_task_id = event.delayed_task.pk
            DelayedTaskEvent.objects.bulk_create(events)
            locked.last_id = entries[-1][0]
            locked.save(update_fields=["last_id", "updated_at"])
        return len(entries)


def apply_event(row: DelayedTask, fields: dict[str, str], at: datetime,
                envelope: str | None = None, default_queue: str = "") -> None:
    """Move ``row`` to what one journal event says (events of a shard arrive in order)."""
    event = fields.get("event", "")
    due = _ms(fields.get("due"))
    if fields.get("task"):
        row.task = fields["task"]
    if fields.get("key"):
        row.key = fields["key"]
    if event in _DUE_EVENTS:
        if envelope and event in _ENVELOPE_EVENTS:
            _fill_from_envelope(row, envelope, default_queue)
        row.state = State.SCHEDULED
        row.due = due or row.due
        row.stored, row.store_error = True, ""
        if event != "recovered":
            row.scheduled_at = at
    elif event == "promoted":
        row.promoted_at = at
        # A carrier acks after publishing, so "promoted" may follow "started"; and a
        # retry scheduled meanwhile has another due time: neither is moved back.
        if row.state == State.SCHEDULED and (due is None or row.due is None
                                             or abs((row.due - due).total_seconds()) < 0.002):
            row.state = State.PROMOTED
    elif event == "started":
        row.state, row.started_at = State.STARTED, at
        row.task_id = fields.get("task_id") or row.task_id
        row.retries = _int(fields.get("retries"), row.retries)
    elif event in ("succeeded", "failed"):
        row.state, row.finished_at = State(event), at
    elif event == "retried":
        row.retries = max(row.retries, _int(fields.get("retries"), 0) + 1)
    elif event == "cancelled":
        row.state, row.cancelled_at = State.CANCELLED, at
        row.cancelled_by = fields.get("by", "")[:255]
    elif event == "dead":
        row.state, row.dead_at, row.reason = State.DEAD, at, fields.get("reason", "")


def _fill_from_envelope(row: DelayedTask, envelope: str, default_queue: str) -> None:
    try:
        env = decode(envelope)
    except PayloadError:
        return
    row.envelope = envelope
    row.args, row.kwargs = env.get("a", []), env.get("k", {})
    row.queue = env.get("q") or default_queue
    row.task_id = env.get("i", row.job_id)
    row.retries = _int(env.get("o", {}).get("retries"), 0)


def _detail(fields: dict[str, str]) -> str:
    parts = []
    for name in ("by", "reason", "task_id", "retries"):
        if fields.get(name) not in (None, ""):
            parts.append(f"{name}: {fields[name]}")
    return "; ".join(parts)


def _at(stream_id: str) -> datetime:
    return datetime.fromtimestamp(int(stream_id.split("-")[0]) / 1000, timezone.utc)


def _ms(value: str | None) -> datetime | None:
    if value in (None, ""):
        return None
    return datetime.fromtimestamp(float(value) / 1000, timezone.utc)


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
