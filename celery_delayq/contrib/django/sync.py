"""Mirror the store's journal into ``DelayedTask`` rows (``manage.py delayq_sync``).

Each shard's journal stream is read from the last applied entry on; a batch of events
and the shard's cursor are saved in one database transaction, so a restarted sync
resumes exactly where it stopped and never applies an event twice.

An entry that cannot be mirrored (no event or one no writer makes, a due time or id that
is no time or one a field does not hold, text that is not UTF-8 or holds NUL, a value longer
than its column) is skipped;
a job whose envelope cannot be decoded or mirrored (arguments a database's JSON column
refuses: NaN, Infinity, a NUL or a lone surrogate) is mirrored without its arguments. Both
are counted and logged once per :meth:`JournalSync.run_once`, and the cursor moves past
them.

Events lost after a shard's last applied entry (its journal trimmed past it, before or
during a pass) are logged and noted on its cursor (``lost_until``) before the next batch is
applied.

Reading a shard's journal to its end is noted on its cursor (``caught_up_at``, by Redis's
clock), so ``delayq_prune`` knows that a shard with no new entries holds nothing back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import DatabaseError, DataError, IntegrityError, router, transaction
from django.db.models import Max, Q
from django.utils import timezone

from celery_delayq import DelayQ, DelayQError
from celery_delayq.errors import DamagedShard
from celery_delayq.events import Event
from celery_delayq.job import Job, shown_arguments
from celery_delayq.keys import ShardKeys
from celery_delayq.reading import Unreadable, is_text
from celery_delayq.stopping import StopFlag
from celery_delayq.store.streams import Entries, id_order

from .columns import column_json
from .models import NOT_ENDED, DelayedTask, DelayedTaskEvent, JournalCursor, State
from .runtime import delayq as project_delayq
from .times import db_time_of_ms, to_db

logger = logging.getLogger("celery_delayq.contrib.django.sync")

_EVENTS = frozenset(event.value for event in Event)
_ENVELOPE_EVENTS = frozenset({Event.SCHEDULED, Event.RESCHEDULED, Event.REPLAYED})
_DUE_EVENTS = frozenset({Event.SCHEDULED, Event.RESCHEDULED, Event.RECOVERED, Event.REPLAYED})
#: A worker's events of one run, with its task id.
_RUN_EVENTS = frozenset({Event.STARTED, Event.SUCCEEDED, Event.FAILED, Event.IGNORED,
                         Event.RETRIED, Event.REVOKED})
_ROW_FIELDS = [
    "task_id", "task", "args", "kwargs", "queue", "key", "due", "state", "retries", "stored",
    "store_error", "envelope", "scheduled_at", "promoted_at", "started_at", "finished_at",
    "cancelled_at", "cancelled_by", "dead_at", "reason", "journaled_ms",
]
#: A new cursor's ``last_id``: before every entry.
INITIAL_ID = JournalCursor._meta.get_field("last_id").default
#: Journal fields stored in a column of limited length, and that length.
_LIMITED = {"job": DelayedTask._meta.get_field("job_id").max_length,
            "task": DelayedTask._meta.get_field("task").max_length,
            "key": DelayedTask._meta.get_field("key").max_length,
            "task_id": DelayedTask._meta.get_field("task_id").max_length,
            "queue": DelayedTask._meta.get_field("queue").max_length,
            "event": DelayedTaskEvent._meta.get_field("event").max_length}
_MAX_RETRIES = 2**31 - 1  # the largest PositiveIntegerField on every database
#: How old an idle shard's ``caught_up_at`` grows before a pass writes it again (prune,
#: which reads it, counts in days).
_CAUGHT_UP_EVERY = timedelta(minutes=1)


class _Mirrored(NamedTuple):
    """A job's stored envelope, the job read from it, and its arguments as its row holds
    them."""

    envelope: str
    job: Job
    args: Any
    kwargs: Any


class JournalSync:
    """Applies journal events of one store to the database, batch by batch."""

    def __init__(self, delayq: DelayQ | None = None, batch: int = 500) -> None:
        self.delayq = delayq or project_delayq()
        self.store = self.delayq.store
        self.batch = batch
        self._stop = StopFlag()

    def run_once(self) -> int:
        """Apply every event journaled so far; returns how many entries were read
        (skipped ones included). A shard whose journal key holds another type of value
        (damaged), or whose batch the database refuses (``IntegrityError``, ``DataError``),
        is passed over with an error logged: the others are mirrored. Other database
        errors (the database away) stop the pass."""
        total = 0
        skipped = Unreadable("delayq_sync", logger)
        with self.store.unavailable():
            began = db_time_of_ms(self.store.now_ms())
        try:
            for shard in self.store.keys:
                try:
                    total += self._apply_shard(shard, began, skipped)
                except DamagedShard as exc:
                    logger.error("delayq_sync: shard %d's journal %s cannot be read, its "
                                 "events are not mirrored until it is repaired: %s",
                                 shard.shard, shard.journal, exc)
                except (DataError, IntegrityError) as exc:
                    logger.error("delayq_sync: the database refused a batch of shard %d's "
                                 "journal, its events are not mirrored while it does: %s",
                                 shard.shard, exc)
        finally:
            skipped.log()
        return total

    def _apply_shard(self, shard: ShardKeys, began: datetime | None,
                     skipped: Unreadable) -> int:
        """Apply a shard's events journaled so far, batch by batch; ``began``: when the
        pass began (Redis's clock, as a field holds it)."""
        total = 0
        while True:
            applied = self._apply_batch(shard, began, skipped)
            total += applied
            if applied < self.batch:
                return total

    def run(self, interval: float = 0.5) -> None:
        """Apply events until :meth:`stop`, polling every ``interval`` seconds when idle."""
        backoff = interval
        while not self._stop.requested:
            try:
                applied = self.run_once()
                backoff = interval
            except (DelayQError, DatabaseError) as exc:
                logger.warning("journal sync failed, retrying in %.1fs: %s", backoff, exc)
                applied = 0
                backoff = min(backoff * 2, 10.0)
            if not applied:
                self._stop.sleep(backoff)

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

    def _read_batch(self, shard: ShardKeys, cursor: JournalCursor) -> Entries:
        """The next batch of a shard's entries after ``cursor``. They are read from the
        cursor's own entry on, inclusive: when it is missing, events after it may be lost
        (:meth:`_note_lost_events`), and that is noted before the batch is applied."""
        if cursor.last_id == INITIAL_ID:
            return self.store.read_journal(shard, count=self.batch)
        entries = self.store.read_journal(shard, _before(cursor.last_id),
                                          count=self.batch + 1)
        if entries and entries[0][0] == cursor.last_id:
            return entries[1:]
        self._note_lost_events(shard, cursor)
        return entries

    def _note_lost_events(self, shard: ShardKeys, cursor: JournalCursor) -> None:
        """Record on the cursor, and log, that journal entries after it are gone (trimmed
        by ``delayq_journal_maxlen`` while the sync was stopped or behind, or lost with
        Redis's data): rows not updated since may show an old state, and
        ``delayq_reconcile --missing`` leaves them alone."""
        lost = self.store.journal_lost_after(shard, cursor.last_id)
        if lost is None or (cursor.lost_until
                            and id_order(lost) <= id_order(cursor.lost_until)):
            return  # none lost, or no more than already noted
        JournalCursor.objects.filter(pk=cursor.pk).update(lost_until=lost)
        logger.error(
            "the journal of shard %d was trimmed past delayq_sync's position %s (or Redis "
            "lost it): its events up to %s are lost, and rows of the jobs they concerned may "
            "show an old state: `delayq_sync --backfill` mirrors the jobs still pending, and "
            "`delayq_reconcile --missing` leaves the others alone. Raise "
            "delayq_journal_maxlen (now %d) or keep delayq_sync running",
            shard.shard, cursor.last_id, lost, self.delayq.config.journal_maxlen)

    def _cursor(self, shard: ShardKeys) -> JournalCursor:
        cursor, _ = JournalCursor.objects.get_or_create(prefix=self.store.keys.prefix,
                                                        shard=shard.shard)
        return cursor

    def _apply_batch(self, shard: ShardKeys, began: datetime | None,
                     skipped: Unreadable) -> int:
        """Apply the next batch of a shard's entries; one short of ``batch`` reaches the
        journal's end, and the cursor notes that at ``began`` its journal was applied."""
        cursor = self._cursor(shard)
        entries = self._read_batch(shard, cursor)
        caught_up = began if len(entries) < self.batch else None
        if not entries:
            _note_caught_up(cursor, caught_up)
            return 0
        readable = []
        for stream_id, fields in entries:
            why = _unreadable(stream_id, fields)
            if why:
                skipped.add(f"journal entry {stream_id} of shard {shard.shard}", why)
            elif fields.get("job"):
                readable.append((stream_id, fields))
        envelopes = self._envelopes(shard, readable, skipped)
        with transaction.atomic(using=router.db_for_write(JournalCursor)):
            locked = JournalCursor.objects.select_for_update().get(pk=cursor.pk)
            if locked.last_id != cursor.last_id:  # another sync moved it meanwhile
                return 0
            job_ids = {f["job"] for _, f in readable}
            rows = DelayedTask.objects.where_written().in_bulk(job_ids, field_name="job_id")
            known = set(rows)
            events = []
            for stream_id, fields in readable:
                job_id = fields["job"]
                at = _at(stream_id)
                assert at is not None  # else _unreadable left the entry out
                row = rows.get(job_id)
                if row is None:
                    row = rows[job_id] = DelayedTask(job_id=job_id, task=fields.get("task", ""),
                                                     created_at=at)
                apply_event(row, fields, stream_id, envelopes.get(job_id))
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
        _note_caught_up(locked, caught_up)
        return len(entries)

    def backfill(self, progress: Callable[[int], None] | None = None) -> int:
        """Mirror every job the store holds pending that has no row, or whose row says
        another state or due time (its events were trimmed before the sync read them, or
        it was scheduled before the app was installed); returns how many rows it wrote.
        A row some event reached since the backfill began is left to the journal.
        ``progress`` is given the running count after each chunk of the store read."""
        began, written = timezone.now(), 0
        skipped = Unreadable("delayq_sync --backfill", logger)
        for shard, jobs in self.store.every_pending():
            envelopes = self._readable(shard, [job.job_id for job in jobs], skipped)
            rows = {row.job_id: row for row in DelayedTask.objects.where_written().filter(
                job_id__in=list(envelopes)).annotate(seen=Max("events__at"))}
            new, changed = [], []
            for job in jobs:
                row = rows.get(job.job_id)
                if job.job_id not in envelopes or (row is not None and (
                        (row.seen or row.created_at) >= began
                        or (row.state == State.SCHEDULED and row.due == to_db(job.due)))):
                    continue
                if row is None:
                    row = DelayedTask(job_id=job.job_id, task=job.task, created_at=began)
                    new.append(row)
                else:
                    changed.append(row)
                _fill_from_envelope(row, envelopes[job.job_id])
                row.key, row.due, row.state = job.key or "", to_db(job.due), State.SCHEDULED
                row.stored, row.store_error = True, ""
            with transaction.atomic(using=router.db_for_write(DelayedTask)):
                DelayedTask.objects.bulk_create(new, ignore_conflicts=True)
                DelayedTask.objects.bulk_update(changed, _ROW_FIELDS)
            written += len(new) + len(changed)
            if progress is not None:
                progress(written)
        skipped.log()
        return written

    def _envelopes(self, shard: ShardKeys, entries: list[tuple[str, dict[str, str]]],
                   skipped: Unreadable) -> dict[str, _Mirrored]:
        """The stored envelopes of the jobs these entries schedule, read; those that cannot
        be read are counted and left out."""
        return self._readable(shard, sorted(
            {f["job"] for _, f in entries if f.get("event") in _ENVELOPE_EVENTS}), skipped)

    def _readable(self, shard: ShardKeys, job_ids: list[str],
                  skipped: Unreadable) -> dict[str, _Mirrored]:
        """The stored envelopes of these jobs, read; those gone, or that cannot be read or
        mirrored, are left out (the latter counted)."""
        envelopes = {}
        for job_id, raw in self.store.envelopes(shard, job_ids).items():
            if raw is None:
                continue  # promoted or cancelled since
            job = Job.read(job_id, raw, None, "", shard.shard, self.store.config.default_queue)
            shown = shown_arguments(job.args, job.kwargs, job.options.get("o", {}))
            args, args_refused = column_json("args", shown[0])
            kwargs, kwargs_refused = column_json("kwargs", shown[1])
            why = (job.unreadable or _unmirrorable(job_id, job) or args_refused
                   or kwargs_refused)
            if why:
                skipped.add(f"envelope of job {job_id!r} on shard {shard.shard}", why)
            else:
                envelopes[job_id] = _Mirrored(raw, job, args, kwargs)
        return envelopes


def _note_caught_up(cursor: JournalCursor, at: datetime | None) -> None:
    """Note on ``cursor`` that its shard's journal was applied up to ``at`` (None: it was
    not read to its end); an idle shard's at most once per ``_CAUGHT_UP_EVERY``, and never
    moved back (by another sync)."""
    if at is None or (cursor.caught_up_at is not None
                      and cursor.caught_up_at > at - _CAUGHT_UP_EVERY):
        return
    JournalCursor.objects.filter(Q(caught_up_at=None) | Q(caught_up_at__lt=at),
                                 pk=cursor.pk).update(caught_up_at=at)


def _unmirrorable(job_id: str, job: Job) -> str:
    """Why a job read from its envelope has no row ("" when it has): a name longer than its
    column, or holding NUL (PostgreSQL's text refuses it)."""
    for name, value in (("task_id", job.task_id), ("queue", job.queue), ("job", job_id),
                        ("task", job.task), ("key", job.key or "")):
        if len(value) > _LIMITED[name]:
            return f"{name} is longer than {_LIMITED[name]} characters"
        if "\x00" in value:
            return f"{name} holds NUL"
    return ""


def _unreadable(stream_id: str, fields: dict[str, str]) -> str:
    """Why a journal entry cannot be mirrored ("" when it can)."""
    if "unreadable" in fields:  # set by Store.read_journal
        return fields["unreadable"]
    if _at(stream_id) is None:
        return "its id is no time"
    for name, value in fields.items():
        if not (is_text(name) and is_text(value)) or "\x00" in value:
            return f"field {name!r} is not UTF-8 text or holds NUL"
    event = fields.get("event")
    if event not in _EVENTS:
        return "it has no event" if event is None else f"event {event!r} is no journal event"
    for name, limit in _LIMITED.items():
        if len(fields.get(name, "")) > limit:
            return f"{name} is longer than {limit} characters"
    if fields.get("due") and _ms(fields["due"]) is None:
        return f"due {fields['due']!r} is no time"
    if fields.get("retries") and _int(fields["retries"], -1) == -1:
        return f"retries {fields['retries']!r} is not a count"
    return ""


def apply_event(row: DelayedTask, fields: dict[str, str], stream_id: str,
                envelope: _Mirrored | None = None) -> None:
    """Move ``row`` to what one journal event (entry ``stream_id``) says, unless it says
    nothing of the job's state; ``envelope``: the job's stored envelope, read.

    A shard's events arrive in order, but the sync reads shard after shard: an event older
    than the one that last changed the row (``journaled_ms``, Redis's clock: local times
    repeat an hour when the clocks go back) is of another shard (a job moved to another
    key's shard, or scheduled again under a dead letter's id) and changes nothing. Nor does
    ``moved`` (the job lives on, on another shard), the drop of a dead letter whose id a
    job scheduled since has, or a worker's event of a run whose task id and due time are
    not the row's (a call the job id had before it was replaced, or a message forged with
    its ``delayq_job`` header; a run for the row's due time is its own, though its task id
    was not known: a call that ran before the sync read it); a drop of the row's own dead
    letter does not date it either, so such a job's events, older than the drop, still
    move it."""
    event, ms = fields.get("event", ""), int(stream_id.split("-")[0])
    dropped = event == Event.CANCELLED and fields.get("from") == "dead"
    due = _ms(fields.get("due"))
    another_run = (event in _RUN_EVENTS and row.task_id
                   and (fields.get("task_id") or row.task_id) != row.task_id
                   and (due is None or not _same_due(row.due, due)))
    if (event == Event.MOVED or (row.journaled_ms is not None and ms < row.journaled_ms)
            or (dropped and row.state != State.DEAD) or another_run):
        return
    if not dropped:
        row.journaled_ms = ms
    at = _at(stream_id)
    assert at is not None  # else _unreadable left the entry out
    if fields.get("task"):
        row.task = fields["task"]
    if fields.get("key"):
        row.key = fields["key"]
    if event in _DUE_EVENTS:
        if envelope and event in _ENVELOPE_EVENTS:
            _fill_from_envelope(row, envelope)
        row.state = State.SCHEDULED
        for name, value in NOT_ENDED.items():
            setattr(row, name, value)
        row.due = due or row.due
        row.stored, row.store_error = True, ""
        if event != Event.RECOVERED:
            row.scheduled_at = at
    elif event == Event.PROMOTED:
        row.promoted_at = at
        # A carrier acks after publishing, so "promoted" may follow "started"; and a
        # retry scheduled meanwhile has another due time: neither is moved back.
        if row.state == State.SCHEDULED and _same_due(row.due, due):
            row.state = State.PROMOTED
    elif event == Event.STARTED:
        row.state, row.started_at = State.STARTED, at
        row.task_id = fields.get("task_id") or row.task_id
        row.retries = _int(fields.get("retries"), row.retries)
    elif event in (Event.SUCCEEDED, Event.FAILED, Event.IGNORED):
        row.state, row.finished_at = State(event), at
    elif event == Event.RETRIED:
        row.retries = max(row.retries, min(_int(fields.get("retries"), 0) + 1, _MAX_RETRIES))
    elif event == Event.CANCELLED:
        row.state, row.cancelled_at = State.CANCELLED, at
        row.cancelled_by = fields.get("by", "")[:255]
    elif event == Event.REVOKED:
        # A worker discarded or stopped the run (its result is REVOKED, as a cancel's): a
        # row still waiting for it ends cancelled. The carrier's ack may come after a
        # discard at receipt, so a row still scheduled for that due time is waiting too.
        if row.state in (State.PROMOTED, State.STARTED) or (
                row.state == State.SCHEDULED and _same_due(row.due, due)):
            row.state, row.cancelled_at = State.CANCELLED, at
            row.cancelled_by = revoked_by(fields.get("reason") or "revoked")[:255]
    elif event == Event.DEAD:
        row.state, row.dead_at, row.reason = State.DEAD, at, fields.get("reason", "")


def revoked_by(reason: str) -> str:
    """A row's ``cancelled_by`` when a worker discarded or stopped its run for ``reason``
    ("revoked", "expired", "terminated")."""
    return f"worker: {reason}"


def _same_due(stored: datetime | None, due: datetime | None) -> bool:
    """Whether an event's ``due`` is the row's (either unknown: taken as the same)."""
    return due is None or stored is None or abs((stored - due).total_seconds()) < 0.002


def _fill_from_envelope(row: DelayedTask, envelope: _Mirrored) -> None:
    job = envelope.job
    row.envelope, row.args, row.kwargs = envelope.envelope, envelope.args, envelope.kwargs
    row.queue, row.task_id = job.queue, job.task_id
    row.retries = _int(job.options.get("o", {}).get("retries"), 0)


def _detail(fields: dict[str, str]) -> str:
    parts = []
    for name in ("by", "from", "reason", "task_id", "retries"):
        if fields.get(name) not in (None, ""):
            parts.append(f"{name}: {fields[name]}")
    return "; ".join(parts)


def _before(entry_id: str) -> str:
    """The stream entry id just before ``entry_id`` (not ``0-0``)."""
    ms, seq = id_order(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2**64 - 1}"


def _at(stream_id: str) -> datetime | None:
    return db_time_of_ms(stream_id.split("-")[0])


def _ms(value: str | None) -> datetime | None:
    return None if value in (None, "") else db_time_of_ms(value)


def _int(value, default: int) -> int:
    """``value`` as a count a PositiveIntegerField holds, else ``default``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return number if 0 <= number <= _MAX_RETRIES else default
