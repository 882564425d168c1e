"""``manage.py delayq_reconcile``: write committed jobs that Redis does not hold."""

from django.core.management.base import BaseCommand, CommandError

from celery_delayq.contrib.django.reconcile import reconcile


class Command(BaseCommand):
    help = ("Push pending DelayedTask rows whose Redis write failed (stored=False) to the "
            "store. With --missing, first mark pending rows that Redis lost (after a Redis "
            "data loss) so they are pushed too.")

    def add_arguments(self, parser):
        parser.add_argument("--missing", action="store_true",
                            help="also restore pending rows missing from Redis")

    def handle(self, *args, missing=False, **options):
        report = reconcile(missing=missing)
        self.stdout.write(f"pushed {len(report.pushed)} delayed tasks to Redis")
        for job_id, error in report.failed.items():
            self.stderr.write(f"{job_id}: {error}")
        if report.failed:
            raise CommandError(f"{len(report.failed)} delayed tasks are still not in Redis")
