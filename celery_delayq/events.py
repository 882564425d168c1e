"""The names of journal events, as the store's streams hold them.

The Lua scripts write most of them (``journal(n, '<event>', ...)``; a unit test checks each
one is a member here), the worker side (``journal.py``) the task outcomes. ``Event`` is a
``str``: a member equals, hashes and prints as the stored text.
"""

from __future__ import annotations

from enum import Enum


class Event(str, Enum):
    """One kind of journal event (the ``event`` field of a stream entry)."""

    SCHEDULED = "scheduled"  # stored (schedule)
    RESCHEDULED = "rescheduled"  # stored again, a new due time (schedule, reschedule)
    PROMOTED = "promoted"  # with the broker (ack, claim_due pushing directly)
    RECOVERED = "recovered"  # a claim's lease ended before its ack: due again (recover)
    STARTED = "started"  # a worker began it (journal.py)
    SUCCEEDED = "succeeded"  # journal.py, from the task's outcome
    FAILED = "failed"
    RETRIED = "retried"
    IGNORED = "ignored"  # the task raised Ignore: acknowledged, no outcome (Celery's IGNORED)
    #: a worker discarded or stopped the run (Celery's REVOKED, journal.py); ``reason``:
    #: "revoked", "expired" or "terminated"
    REVOKED = "revoked"
    CANCELLED = "cancelled"  # cancel
    MOVED = "moved"  # taken off its old shard by a replace that moved it (cancel)
    DEAD = "dead"  # dead-lettered (dead, repair, Store.bury)
    REPLAYED = "replayed"  # a dead letter due again (replay)
    PAUSED = "paused"  # a task or queue (pause)
    RESUMED = "resumed"
    RATE_LIMIT = "rate_limit"  # a queue's rate limit set or removed (limit)

    def __str__(self) -> str:
        return self.value
