"""``manage.py delayq_sync``: mirror the delay store's journal into the database."""

import contextlib
import signal

from django.core.management.base import BaseCommand, CommandError

from celery_delayq import DelayQError
from celery_delayq.contrib.django.sync import JournalSync

from ._stops import Count, stops_said

_RERUN = ("each batch of events is applied with its shard's position in one transaction, "
          "so the next run goes on after the last one applied (and a backfill writes only "
          "rows that still differ from the store)")


class Command(BaseCommand):
    help = ("Apply the delay store's journal events to the DelayedTask rows, in batches, "
            "resuming where the last run stopped. Runs until SIGTERM/Ctrl-C unless --once.")

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true",
                            help="apply what is journaled now, then exit")
        parser.add_argument("--interval", type=float, default=0.5,
                            help="seconds between polls when idle (default 0.5)")
        parser.add_argument("--batch", type=int, default=500,
                            help="events per shard and database transaction (default 500)")
        parser.add_argument("--backfill", action="store_true",
                            help="first mirror the jobs pending in the store that have no "
                                 "row or an outdated one (events trimmed unread, or jobs "
                                 "older than the app)")

    def handle(self, *args, once=False, interval=0.5, batch=500, backfill=False, **options):
        _check(interval, batch)
        sync = JournalSync(batch=batch)
        backfilled = Count(self.stderr.write, "backfilled")
        try:
            with stops_said("delayq_sync", backfilled if backfill else "", _RERUN):
                if backfill:
                    written = sync.backfill(progress=backfilled)
                    self.stdout.write(f"backfilled {written} rows from the store")
                if once:
                    applied = sync.run_once()
                    self.stdout.write(f"applied {applied} journal events")
                    return
        except DelayQError as exc:  # a store down or refusing: said, not a traceback
            raise CommandError(str(exc)) from exc
        signal.signal(signal.SIGTERM, lambda *_: sync.stop())
        self.stdout.write(f"delayq_sync: following the journal every {interval:g}s; "
                          "Ctrl-C stops")
        with contextlib.suppress(KeyboardInterrupt):
            sync.run(interval=interval)
        self.stdout.write("delayq_sync: stopped")


#: The largest ``--batch`` (events per shard and database transaction) and ``--interval``.
MAX_BATCH, MAX_INTERVAL = 100_000, 3600.0


def _check(interval: float, batch: int) -> None:
    """Refuse a batch or a poll interval that is not positive (a batch of 0 is no read, an
    interval of 0 polls without pause) or is past its bound (Redis refuses a count past
    64 bits; an infinite interval stops polling)."""
    if batch < 1:
        raise CommandError(f"--batch must be at least 1 (events per shard and transaction), "
                           f"got {batch}; the default is 500")
    if batch > MAX_BATCH:
        raise CommandError(f"--batch must be at most {MAX_BATCH:,} (events per shard and "
                           f"transaction), got {batch:,}; the default is 500")
    if not 0 < interval <= MAX_INTERVAL:  # NaN too
        raise CommandError(f"--interval must be more than 0 seconds and at most "
                           f"{MAX_INTERVAL:,.0f}, got {interval:g}; the default is 0.5")
