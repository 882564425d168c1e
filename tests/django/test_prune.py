"""delayq_prune: old finished rows of the mirror go, with their events; nothing else does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.core.management import CommandError, call_command

from celery_delayq.contrib.django.models import (
    DelayedTask,
    DelayedTaskEvent,
    JournalCursor,
    State,
)
from celery_delayq.contrib.django.prune import prune

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime.now(timezone.utc)


def _cursors(shop_delayq, at: datetime) -> None:
    """Every shard's journal applied up to ``at``."""
    for shard in shop_delayq.store.keys:
        JournalCursor.objects.create(prefix=shop_delayq.store.keys.prefix, shard=shard.shard,
                                     last_id=f"{int(at.timestamp() * 1000)}-0")


def _row(job_id: str, state: str, days_ago: float, **fields) -> DelayedTask:
    at = NOW - timedelta(days=days_ago)
    ended = {State.SUCCEEDED: "finished_at", State.FAILED: "finished_at",
             State.CANCELLED: "cancelled_at", State.DEAD: "dead_at"}.get(state, "started_at")
    row = DelayedTask.objects.create(job_id=job_id, task="shop.tasks.close_unpaid_order",
                                     state=state, due=at, **{ended: at, **fields})
    DelayedTaskEvent.objects.create(delayed_task=row, event=state, at=at)
    return row


@pytest.fixture
def mirror(shop_delayq):
    _cursors(shop_delayq, NOW)
    _row("old:succeeded", State.SUCCEEDED, 40)
    _row("old:failed", State.FAILED, 40)
    _row("old:cancelled", State.CANCELLED, 40)
    _row("new:succeeded", State.SUCCEEDED, 10)
    _row("old:dead", State.DEAD, 40)  # a dead letter Redis holds: replayable
    _row("old:started", State.STARTED, 40)  # never finished: an operator looks at it
    _row("old:scheduled", State.SCHEDULED, 40)
    # its id scheduled again after it finished long ago: pending now
    _row("again:scheduled", State.SCHEDULED, 0, finished_at=NOW - timedelta(days=40))


def _left() -> list[str]:
    return sorted(DelayedTask.objects.values_list("job_id", flat=True))


def test_prune_deletes_rows_finished_before_the_retention_with_their_events(shop_delayq,
                                                                            mirror):
    assert prune(timedelta(days=30), shop_delayq) == 3
    assert _left() == ["again:scheduled", "new:succeeded", "old:dead", "old:scheduled",
                       "old:started"]
    assert DelayedTaskEvent.objects.count() == 5
    assert prune(timedelta(days=30), shop_delayq) == 0


def test_prune_keeps_rows_a_lagging_sync_has_not_passed_on_every_shard(shop_delayq):
    _cursors(shop_delayq, NOW)
    lagging = JournalCursor.objects.first()
    lagging.last_id = f"{int((NOW - timedelta(days=45)).timestamp() * 1000)}-0"
    lagging.save()
    _row("ended:50", State.SUCCEEDED, 50)
    _row("ended:40", State.SUCCEEDED, 40)
    assert prune(timedelta(days=30), shop_delayq) == 1
    assert _left() == ["ended:40"]


def test_prune_deletes_nothing_before_the_sync_has_run(shop_delayq):
    _row("ended", State.CANCELLED, 40)
    assert prune(timedelta(days=1), shop_delayq) == 0


def test_prune_goes_chunk_by_chunk_and_says_its_progress(shop_delayq):
    _cursors(shop_delayq, NOW)
    for n in range(5):
        _row(f"ended:{n}", State.SUCCEEDED, 40)
    seen: list[int] = []
    assert prune(timedelta(days=30), shop_delayq, chunk=2, progress=seen.append) == 5
    assert seen == [2, 4]


def test_the_command_says_how_many_it_deleted_and_refuses_a_bad_retention(
        shop_delayq, mirror, capsys):
    call_command("delayq_prune", "--days", "30")
    assert capsys.readouterr().out.strip() == (
        "deleted 3 delayed tasks finished more than 30 days ago, with their events")
    for days in ("0", "-1", "nan", "1e9"):
        with pytest.raises(CommandError, match="--days must be a number of days above 0"):
            call_command("delayq_prune", "--days", days)


def test_prune_reads_naive_times_of_a_project_without_use_tz(settings, shop_delayq):
    settings.USE_TZ, settings.TIME_ZONE = False, "Asia/Kolkata"
    _cursors(shop_delayq, NOW)
    local = NOW.astimezone(timezone(timedelta(hours=5, minutes=30))).replace(tzinfo=None)
    for job_id, days in (("ended:31", 31), ("ended:29", 29)):
        DelayedTask.objects.create(job_id=job_id, task="t", state=State.SUCCEEDED,
                                   finished_at=local - timedelta(days=days))
    assert prune(timedelta(days=30), shop_delayq) == 1
    assert _left() == ["ended:29"]


def test_a_shard_whose_journal_never_had_an_entry_does_not_hold_back_pruning(
        shop_delayq, sync):
    keys = shop_delayq.store.keys
    job_ids = [job_id for job_id in (f"order:{n}:close" for n in range(40))
               if keys.shard_for(job_id).shard != 3]
    for job_id in job_ids:
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                             job_id=job_id)
    sync.run_once()
    assert JournalCursor.objects.get(shard=3).last_id == "0-0"
    DelayedTask.objects.update(state=State.SUCCEEDED, finished_at=NOW - timedelta(days=40))

    assert prune(timedelta(days=30), shop_delayq) == len(job_ids)


def test_a_shard_the_sync_read_to_its_end_long_ago_still_holds_back_pruning(shop_delayq):
    _cursors(shop_delayq, NOW)
    JournalCursor.objects.filter(shard=0).update(last_id="0-0",
                                                 caught_up_at=NOW - timedelta(days=45))
    _row("ended:50", State.SUCCEEDED, 50)
    _row("ended:40", State.SUCCEEDED, 40)

    assert prune(timedelta(days=30), shop_delayq) == 1
    assert _left() == ["ended:40"]
