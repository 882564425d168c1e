"""``manage.py seed_demo``: a few orders and refunds with pending delayed tasks."""

from django.core.management.base import BaseCommand
from shop import services


class Command(BaseCommand):
    help = "Create demo orders (some paid) and refunds; each schedules its delayed tasks."

    def handle(self, *args, **options):
        unpaid = [services.place_order(name, total) for name, total in
                  [("Ada", "19.90"), ("Grace", "249.00"), ("Linus", "5.50")]]
        paid = [services.place_order(name, total) for name, total in
                [("Ken", "120.00"), ("Barbara", "799.00")]]
        for order in paid:
            services.pay(order)
        refunds = [services.request_refund(order, order.total) for order in paid]
        self.stdout.write(f"seeded {len(unpaid) + len(paid)} orders ({len(paid)} paid) and "
                          f"{len(refunds)} refunds")
