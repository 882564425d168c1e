"""What the admin actions do to one row (or, pause and resume, to one task): call the
store, update the row, say what happened.

Each function returns ``(done, message)``; the message is what the store really did
("cancelled", "too late: already running", ...).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import router
from django.utils import timezone

from celery_delayq.errors import JobExists
from celery_delayq.reading import counted
from celery_delayq.store import CancelOutcome

from .models import DelayedTask, State
from .runtime import delayq as project_delayq
from .runtime import resume_command
from .times import to_db

_NOT_PENDING = {
    State.PROMOTED: "too late: already promoted",
    State.STARTED: "too late: already running",
    State.SUCCEEDED: "too late: already finished",
    State.FAILED: "too late: already finished",
    State.IGNORED: "too late: already finished",
    State.CANCELLED: "already cancelled",
    State.DEAD: "dead-lettered: replay it (the Replay action or `celery delayq replay`)",
}
_GONE = "not in the store any more (probably promoted; delayq_sync will tell)"
_NOT_DEAD = "not among the dead letters any more (replayed or dropped; delayq_sync will tell)"


def cancel(row: DelayedTask, by: str) -> tuple[bool, str]:
    """Cancel the row's job in the store; one not in Redis yet is cancelled on the row, which
    its writer (on commit, or ``delayq_reconcile``) checks after writing it. A row written
    to Redis meanwhile is read again from the database written to (a replica may lag) and
    the store asked again, once."""
    for _ in range(2):
        if row.state != State.SCHEDULED:
            return False, _NOT_PENDING[row.state]
        outcome = project_delayq().cancel_outcome(row.job_id, row.key or None, by=by)
        if outcome is CancelOutcome.TOO_LATE:
            return False, outcome.value
        rows = DelayedTask.objects.filter(pk=row.pk)
        if outcome is CancelOutcome.UNKNOWN:
            if row.stored:
                return False, _GONE
            rows = rows.filter(state=State.SCHEDULED, stored=False)  # still not written
        cancelled = rows.update(state=State.CANCELLED, cancelled_at=timezone.now(),
                                cancelled_by=by[:255])
        if cancelled or outcome is CancelOutcome.CANCELLED:
            return True, "cancelled"
        row.refresh_from_db(using=router.db_for_write(DelayedTask))  # written meanwhile
    return False, "changed while it was cancelled: try again"


def run_now(row: DelayedTask) -> tuple[bool, str]:
    """Make the row's pending job due now."""
    return _retime(row, delay=0)


def reschedule(row: DelayedTask, *, delay: float | timedelta | None = None,
               eta: datetime | None = None) -> tuple[bool, str]:
    """Give the row's pending job a new due time (``delay`` from now, or ``eta``)."""
    return _retime(row, delay=delay, eta=eta)


def _retime(row: DelayedTask, **due) -> tuple[bool, str]:
    if row.state != State.SCHEDULED:
        return False, _NOT_PENDING[row.state]
    if not row.stored:
        return False, "not in Redis yet: run delayq_reconcile first"
    new_due = project_delayq().reschedule(row.job_id, key=row.key or None, **due)
    if new_due is None:
        return False, _GONE
    DelayedTask.objects.filter(pk=row.pk).update(due=to_db(new_due))
    if due.get("delay") == 0:
        return True, "due now"
    return True, f"due {timezone.localtime(new_due):%Y-%m-%d %H:%M:%S}"


def replay(row: DelayedTask) -> tuple[bool, str]:
    """Put the row's dead-lettered job back, due now."""
    if row.state != State.DEAD:
        return False, "not dead-lettered"
    try:
        replayed = project_delayq().store.replay(row.job_id)
    except JobExists:
        return False, "a pending job has its id: cancel that one first"
    if not replayed:
        return False, _NOT_DEAD
    # a row the journal moved on meanwhile (the job replayed, promoted, run) stays so
    DelayedTask.objects.filter(pk=row.pk, state=State.DEAD).update(state=State.SCHEDULED,
                                                                  due=timezone.now())
    return True, "replayed: due now"


def drop(row: DelayedTask, by: str) -> tuple[bool, str]:
    """Give up the row's dead-lettered job for good (journaled as cancelled ``by``)."""
    if row.state != State.DEAD:
        return False, "not dead-lettered"
    if not project_delayq().store.drop(row.job_id, by=by):
        return False, _NOT_DEAD
    DelayedTask.objects.filter(pk=row.pk).update(
        state=State.CANCELLED, cancelled_at=timezone.now(), cancelled_by=by[:255])
    return True, "dropped"


def pause(task: str, by: str, paused: dict[str, list[str]]) -> tuple[bool, str]:
    """Pause ``task`` (``paused``: what ``DelayQ.paused()`` said): its due jobs are held."""
    if task in paused["tasks"]:
        return False, f"{task} was already paused"
    project_delayq().pause(task=task, by=by)
    return True, f"Paused {task}: its due tasks wait until it is resumed."


def resume(task: str, by: str, paused: dict[str, list[str]],
           queues: list[str]) -> tuple[bool, str]:
    """Resume ``task``; ``queues``: those of its selected rows, to name one that is paused."""
    if task not in paused["tasks"]:
        held = [queue for queue in queues if queue in paused["queues"]]
        if not held:
            return False, f"{task} was not paused"
        queues_are = f"queue {held[0]} is" if len(held) == 1 else f"queues {', '.join(held)} are"
        commands = "; ".join(f"`{resume_command('queue', queue)}`" for queue in held)
        return False, f"{task} was not paused, but its {queues_are}: resume with {commands}"
    released = project_delayq().resume(task=task, by=by)
    return True, (f"Resumed {task}: {counted(released, 'held task')} released, "
                  "due now (oldest first).")
