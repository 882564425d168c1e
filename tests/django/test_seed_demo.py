"""``manage.py seed_demo``, which ``make demo`` runs on every start: it seeds the shop once,
what it seeds is still pending while a newcomer looks, at the times the README gives, and
one refund check is held by the pause of its queue until someone resumes it."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from shop.models import Order, Refund

from celery_delayq.testing.tester import DelayQTester

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit writes must really commit
REFUND_CHECK = "shop.tasks.check_refund_status"


@pytest.fixture
def shop_clock(shop_app, redis_server, settings):
    """The shop's store on a test clock, with the demo's default timings."""
    settings.SHOP_ORDER_TIMEOUT = 60
    settings.SHOP_REFUND_GAPS = [10, 30, 120, 300]
    with DelayQTester(shop_app, f"{redis_server.url}/1") as tester:
        yield tester


def seed() -> str:
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def held_check(tester: DelayQTester) -> list[tuple[str, bool]]:
    """(job id, paused) of the pending refund checks on the queue the seed pauses."""
    return [(job.job_id, job.paused) for job in tester.pending(task=REFUND_CHECK)
            if job.queue == "refunds"]


def shop() -> tuple[dict[str, str], dict[str, str]]:
    """Each seeded customer's order status, and refund status where they have one."""
    orders = {order.customer: order.status for order in Order.objects.all()}
    refunds = {refund.order.customer: refund.status
               for refund in Refund.objects.select_related("order")}
    return orders, refunds


def test_seeding_a_second_time_adds_nothing_and_says_so(shop_clock):
    first = seed()
    pending = sorted(job.job_id for job in shop_clock.pending())
    assert (Order.objects.count(), Refund.objects.count()) == (6, 3)
    assert "seeded 6 orders (3 paid) and 3 refunds" in first

    second = seed()
    assert (Order.objects.count(), Refund.objects.count()) == (6, 3)
    assert sorted(job.job_id for job in shop_clock.pending()) == pending
    assert "the shop has 6 orders and 3 refunds already: seeding nothing" in second


def test_seeding_pauses_the_refunds_queue_once_and_a_second_seed_does_not_pause_it_again(
        shop_clock):
    out = seed()
    assert shop_clock.delayq.paused() == {"tasks": [], "queues": ["refunds"]}
    assert ("falls due and is held: the seed paused the queue refunds (the admin's banner "
            "says so); `celery -A demo_project.celery_app:app delayq resume --queue refunds` "
            "releases it, and it is approved") in out
    shop_clock.delayq.resume(queue="refunds", by="a newcomer")
    seed()
    assert shop_clock.delayq.paused() == {"tasks": [], "queues": []}


def test_the_refund_check_on_the_paused_queue_is_held_when_due_until_resumed(shop_clock):
    seed()
    [refund] = Refund.objects.filter(order__customer="Margaret")
    assert held_check(shop_clock) == [(f"refund:{refund.pk}:check:0", False)]
    shop_clock.advance(seconds=11)  # due after 10 s: held, not run
    assert held_check(shop_clock) == [(f"refund:{refund.pk}:check:0", True)]
    shop_clock.advance(hours=2)
    assert shop()[1]["Margaret"] == Refund.Status.REQUESTED

    assert shop_clock.delayq.resume(queue="refunds", by="a newcomer") == 1
    shop_clock.run_due()
    assert shop()[1]["Margaret"] == Refund.Status.APPROVED, "the provider answers check 1"
    assert held_check(shop_clock) == []


def test_seeded_timeouts_stay_pending_while_a_newcomer_looks(shop_clock):
    seed()
    unpaid, paid, requested = Order.Status.UNPAID, Order.Status.PAID, Refund.Status.REQUESTED
    closed, approved, rejected = (Order.Status.CLOSED, Refund.Status.APPROVED,
                                  Refund.Status.REJECTED)
    keys = {name: Order.objects.get(customer=name).key for name in ("Grace", "Linus")}

    shop_clock.advance(seconds=59)
    assert shop() == ({"Ada": unpaid, "Grace": unpaid, "Linus": unpaid, "Ken": paid,
                       "Barbara": paid, "Margaret": paid},
                      {"Ken": approved, "Barbara": requested, "Margaret": requested})
    shop_clock.advance(seconds=1)
    assert shop()[0]["Ada"] == closed

    shop_clock.advance(minutes=16)  # 17 minutes in: still there to look at in the admin
    assert shop() == ({"Ada": closed, "Grace": unpaid, "Linus": unpaid, "Ken": paid,
                       "Barbara": paid, "Margaret": paid},
                      {"Ken": approved, "Barbara": requested, "Margaret": requested})
    assert {job.key for job in shop_clock.pending(task="shop.tasks.close_unpaid_order")} == {
        keys["Grace"], keys["Linus"]}
    assert len(shop_clock.pending(task=REFUND_CHECK)) == 2  # Barbara's; Margaret's, held

    shop_clock.advance(minutes=1)  # Barbara's refund: rejected at its 6th check, 1060 s in
    assert shop()[1] == {"Ken": approved, "Barbara": rejected, "Margaret": requested}
    shop_clock.advance(minutes=12)
    assert shop()[0]["Grace"] == closed  # 30 minutes in
    shop_clock.advance(minutes=89)
    assert shop()[0]["Linus"] == unpaid
    shop_clock.advance(minutes=1)  # 2 hours in
    assert shop()[0]["Linus"] == closed
    assert [(job.task, job.paused) for job in shop_clock.pending()] == [(REFUND_CHECK, True)]
