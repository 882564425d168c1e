"""``manage.py delayq_reconcile``: write committed jobs that Redis does not hold."""

from django.core.management.base import BaseCommand, CommandError

from celery_delayq import DelayQError
from celery_delayq.contrib.django.reconcile import reconcile
from celery_delayq.contrib.django.transactional import CLAIM_LEASE

from ._stops import Count, stops_said

_SHOWN = 20  # rows left alone, or not pushed, printed
_LEASE = f"{CLAIM_LEASE.total_seconds() / 60:g} minutes"
_RERUN = ("it pushes only the rows still not in Redis; a row being written when it stopped "
          f"is marked written by delayq_sync if Redis got it, or pushed once {_LEASE} old")
_BUSY = ("each is being written to Redis (see its store error: an on-commit write, or "
         f"another delayq_reconcile); if that writer died, a run after {_LEASE} pushes it")


class Command(BaseCommand):
    help = ("Push pending DelayedTask rows whose Redis write failed (stored=False) to the "
            "store. With --missing, first mark pending rows that Redis lost (after a Redis "
            "data loss) so they are pushed too.")

    def add_arguments(self, parser):
        parser.add_argument("--missing", action="store_true",
                            help="also restore pending rows missing from Redis")
        parser.add_argument("--include-unknown", action="store_true",
                            help="with --missing: also rows not updated since their "
                                 "journal lost events (they may have run or been "
                                 "cancelled meanwhile)")

    def handle(self, *args, missing=False, include_unknown=False, **options):
        if include_unknown and not missing:
            raise CommandError("--include-unknown goes with --missing")
        pushed = Count(self.stderr.write, "pushed")
        try:
            with stops_said("delayq_reconcile", pushed, _RERUN):
                report = reconcile(missing=missing, include_unknown=include_unknown,
                                   progress=pushed)
        except DelayQError as exc:  # a store down or refusing: said, not a traceback
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"pushed {len(report.pushed)} delayed tasks to Redis")
        if report.busy:
            self.stderr.write(
                f"left {len(report.busy)} rows to another writer ({_shown(report.busy)}): "
                f"{_BUSY}")
        if report.unknown:
            self.stderr.write(
                f"left alone {len(report.unknown)} pending rows that Redis does not hold and "
                f"whose later journal events were lost (see delayq_sync's log): they may have "
                f"run or been cancelled meanwhile: {_shown(report.unknown)}. Check them; if "
                "Redis lost them, run again with --include-unknown")
        for job_id, error in list(report.failed.items())[:_SHOWN]:
            self.stderr.write(f"{job_id}: {error}")
        if len(report.failed) > _SHOWN:
            self.stderr.write(f"... and {len(report.failed) - _SHOWN} more")
        if report.failed:
            raise CommandError(f"{len(report.failed)} delayed tasks are still not in Redis")


def _shown(job_ids: list[str]) -> str:
    more = f" and {len(job_ids) - _SHOWN} more" if len(job_ids) > _SHOWN else ""
    return ", ".join(job_ids[:_SHOWN]) + more
