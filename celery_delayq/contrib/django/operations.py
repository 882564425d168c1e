"""What the admin actions do to one row: call the store, update the row, say what happened.

Each function returns ``(done, message)``; the message is what the store really did
("cancelled", "too late: already running", ...).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from celery_delayq.store import CancelOutcome

from .models import DelayedTask, State
from .runtime import delayq as project_delayq

_NOT_PENDING = {
    State.PROMOTED: "too late: already promoted",
    State.STARTED: "too late: already running",
    State.SUCCEEDED: "too late: already finished",
    State.FAILED: "too late: already finished",
    State.CANCELLED: "already cancelled",
    State.DEAD: "dead-lettered: replay it with `celery delayq replay`",
}
_GONE = "not in the store any more (probably promoted; delayq_sync will tell)"


def cancel(row: DelayedTask, by: str) -> tuple[bool, str]:
    """Cancel the row's job in the store; a job never written to Redis is cancelled here."""
    if row.state != State.SCHEDULED:
        return False, _NOT_PENDING[row.state]
    outcome = project_delayq().cancel_outcome(row.job_id, row.key or None, by=by)
    if outcome is CancelOutcome.UNKNOWN and row.stored:
        return False, _GONE
    if outcome is CancelOutcome.TOO_LATE:
        return False, outcome.value
    DelayedTask.objects.filter(pk=row.pk).update(
        state=State.CANCELLED, cancelled_at=timezone.now(), cancelled_by=by[:255])
    return True, "cancelled"


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
    DelayedTask.objects.filter(pk=row.pk).update(due=new_due)
    if due.get("delay") == 0:
        return True, "due now"
    return True, f"due {timezone.localtime(new_due):%Y-%m-%d %H:%M:%S}"
