"""``manage.py seed_demo``: a few orders and refunds with pending delayed tasks, once.

``make demo`` runs it on every start; it seeds an empty shop only, so a second start adds
nothing. The seeded tasks fall due at staggered times, from a minute to two hours, so some
are still pending while a newcomer looks at the admin; the output says which fires when.
One refund's check waits on a queue the seed pauses, so the admin shows a pause and the
task it holds.
"""

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction
from shop import provider, services
from shop.models import Order, Refund

from celery_delayq.contrib.django.runtime import resume_command
from celery_delayq.reading import counted
from demo_project.celery_app import delayq

#: Unpaid orders: customer, total, seconds until the timeout closes it (None: the setting
#: ``SHOP_ORDER_TIMEOUT``, 60 s by default).
UNPAID = [("Ada", "19.90", None), ("Grace", "249.00", 30 * 60), ("Linus", "5.50", 2 * 3600)]
#: Paid orders, each refunded in full: customer, total, the check at which the simulated
#: provider answers (over 500 is rejected, else approved).
REFUNDED = [("Ken", "120.00", 2), ("Barbara", "799.00", 6)]
#: A paid order refunded in full, whose first status check goes to the queue ``PAUSED``,
#: which the seed pauses as an operator would while the provider's refund API is down: the
#: admin shows the pause and, once due, the check it holds. The provider answers that
#: check, so resuming the queue approves the refund.
HELD = ("Margaret", "42.00")
PAUSED = "refunds"


def span(seconds: float) -> str:
    """``40 s``, ``17 min 40 s``, ``2 h``."""
    if seconds < 120:
        return f"{round(seconds, 1):g} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 120:
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    return f"{minutes / 60:g} h"


class Command(BaseCommand):
    help = ("Seed an empty shop with orders (some paid) and refunds, each scheduling its "
            "delayed tasks; a shop that has orders already is left as it is.")

    def handle(self, *args, **options):
        with transaction.atomic():
            orders, refunds = Order.objects.count(), Refund.objects.count()
            if orders:
                self.stdout.write(f"the shop has {counted(orders, 'order')} and "
                                  f"{counted(refunds, 'refund')} already: seeding nothing "
                                  "(it seeds an empty shop only)")
                return
            due = self.seed()
        refunds = len(REFUNDED) + 1
        self.stdout.write(f"seeded {len(UNPAID) + refunds} orders ({refunds} paid) and "
                          f"{refunds} refunds; their delayed tasks (Delayed tasks in the admin) "
                          "fire:")
        for seconds, what in sorted(due):
            self.stdout.write(f"  in {span(seconds)}: {what}")

    def seed(self) -> list[tuple[float, str]]:
        """Create the orders and refunds; (seconds from now, what happens then) of each."""
        due = []
        for name, total, timeout in UNPAID:
            order = services.place_order(name, total, timeout)
            seconds = settings.SHOP_ORDER_TIMEOUT if timeout is None else timeout
            due.append((seconds, f"{order} is closed unpaid"))
        for name, total, answers_after in REFUNDED:
            order = services.place_order(name, total)
            services.pay(order)
            refund = services.request_refund(order, order.total, answers_after)
            seconds = sum(services.refund_gap(attempt) for attempt in range(answers_after))
            answer = provider.refund_status(Refund(amount=refund.amount, checks=answers_after,
                                                   provider_answers_after=answers_after))
            due.append((seconds, f"{refund} ({name}) is {answer} at check number "
                                 f"{answers_after}"))
        name, total = HELD
        delayq.pause(queue=PAUSED, by="seed_demo")  # before the check is written to Redis
        order = services.place_order(name, total)
        services.pay(order)
        refund = services.request_refund(order, order.total, answers_after=1, queue=PAUSED)
        due.append((services.refund_gap(0),
                    f"{refund} ({name}) falls due and is held: the seed paused the queue "
                    f"{PAUSED} (the admin's banner says so); `{resume_command('queue', PAUSED)}` "
                    "releases it, and it is approved"))
        return due
