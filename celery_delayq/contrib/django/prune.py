"""Forgetting old finished rows of the mirror, so its tables stop growing.

A row goes once it has succeeded, failed, been ignored (``Ignore``) or been cancelled longer
ago than the retention, with its events. Rows still pending, promoted, started or dead (a
dead letter Redis still holds, replayable) stay. So does every row whose end the sync has
not passed on every shard (a lagging ``delayq_sync``): a journal event still to come for it
would make it again, with only that event's fields. Rows go in chunks, each in a transaction
that holds the journal cursors, so a sync batch meanwhile waits, then sees them gone.

How far the sync has passed on a shard is the later of two times. Its position (the last
applied entry's id, a time on Redis's clock): every entry up to it is applied. And when it
last read the shard's journal to its end (``caught_up_at``, Redis's clock before the read):
every entry made before then is applied, since an entry's id is never earlier than the
time it is made. The position alone held pruning back for good on a shard with no new
entries (or none ever: its position ``0-0`` reads as 1970); a shard the sync has not read
to its end since a time still holds rows that ended after it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import router, transaction
from django.db.models import Q

from celery_delayq import DelayQ

from . import times
from .models import DelayedTask, JournalCursor, State
from .runtime import delayq as project_delayq
from .times import db_time_of_ms, to_db

#: Rows deleted per transaction.
CHUNK = 1000


def prune(older_than: timedelta, delayq: DelayQ | None = None, *, chunk: int = CHUNK,
          progress: Callable[[int], None] | None = None) -> int:
    """Delete the rows (and their events) that succeeded, failed or were cancelled more
    than ``older_than`` ago and before the sync passed that time on every shard; how many
    went. ``progress`` is given the running count after each chunk."""
    prefix = (delayq or project_delayq()).store.keys.prefix
    applied = [_passed(cursor) for cursor in JournalCursor.objects.filter(prefix=prefix)]
    bounds = [to_db(times.utc_now() - older_than), *applied]
    if not applied or None in bounds:  # no sync yet (no row can have finished)
        return 0
    cutoff = min(bound for bound in bounds if bound is not None)
    ended = (Q(state__in=(State.SUCCEEDED, State.FAILED, State.IGNORED),
               finished_at__lt=cutoff)
             | Q(state=State.CANCELLED, cancelled_at__lt=cutoff))
    deleted = 0
    while True:
        with transaction.atomic(using=router.db_for_write(DelayedTask)):
            list(JournalCursor.objects.select_for_update().filter(prefix=prefix))
            pks = list(DelayedTask.objects.filter(ended).values_list("pk", flat=True)[:chunk])
            DelayedTask.objects.filter(pk__in=pks).delete()  # and their events (CASCADE)
        deleted += len(pks)
        if len(pks) < chunk:
            return deleted
        if progress is not None:
            progress(deleted)


def _passed(cursor: JournalCursor) -> datetime | None:
    """The time up to which the sync has applied a shard's journal: the later of its
    position and when it last read the journal to its end (None: neither is a time)."""
    times = [at for at in (db_time_of_ms(cursor.last_id.split("-")[0]), cursor.caught_up_at)
             if at is not None]
    return max(times, default=None)
