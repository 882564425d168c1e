"""``manage.py delayq_prune``: delete old finished rows of the mirror."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from celery_delayq.contrib.django.prune import prune

from ._stops import Count, stops_said

_LONGEST = 36_500


class Command(BaseCommand):
    help = ("Delete the delayed tasks that succeeded, failed or were cancelled more than "
            "--days days ago, with their events (pending, running and dead ones stay). "
            "Run it daily, e.g. from cron.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=30,
                            help="keep finished tasks this many days (default 30)")

    def handle(self, *args, days=30, **options):
        if not 0 < days <= _LONGEST:
            raise CommandError(f"--days must be a number of days above 0 and at most "
                               f"{_LONGEST} (100 years), got {days:g}")
        deleted = Count(self.stderr.write, "deleted")
        with stops_said("delayq_prune", deleted, "each chunk of rows is deleted in one "
                        "transaction, and the next run deletes what is left"):
            deleted.done = prune(timedelta(days=days), progress=deleted)
        self.stdout.write(f"deleted {deleted.done} delayed tasks finished more than "
                          f"{days:g} days ago, with their events")
