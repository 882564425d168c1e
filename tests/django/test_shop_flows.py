"""The demo shop end to end: real Redis, real worker, real carrier, real database."""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _order(pk):
    from shop.models import Order

    return Order.objects.get(pk=pk)


def test_unpaid_order_closes_itself_when_its_timeout_runs(
        fast_shop, shop_delayq, shop_worker, shop_carrier, sync):
    from shop import services
    from shop.models import Order

    order = services.place_order("Ada", "19.90")
    job = shop_delayq.get(f"order:{order.pk}:close")
    assert job is not None and job.task == "shop.tasks.close_unpaid_order"
    assert job.key == f"order:{order.pk}"

    wait_for(lambda: _order(order.pk).status == Order.Status.CLOSED, what="order closed")
    wait_for(lambda: sync.run_once() >= 0 and _mirror(order).state == "succeeded",
             what="mirror shows the timeout succeeded")
    events = list(_mirror(order).events.values_list("event", flat=True))
    assert {"scheduled", "promoted", "started", "succeeded"} <= set(events)


def test_paid_order_is_never_closed_and_its_timeout_never_runs(
        fast_shop, shop_delayq, shop_worker, shop_carrier, sync):
    from shop import services
    from shop.models import Order

    order = services.place_order("Grace", "249.00")
    assert services.pay(order) is True
    assert shop_delayq.get(f"order:{order.pk}:close") is None
    time.sleep(fast_shop.SHOP_ORDER_TIMEOUT + 0.7)  # well past the due time
    assert _order(order.pk).status == Order.Status.PAID
    sync.run_once()
    row = _mirror(order)
    assert row.state == "cancelled" and row.cancelled_by == "shop: order paid"
    assert not row.events.filter(event__in=["promoted", "started"]).exists()


def test_refund_is_polled_with_growing_gaps_until_the_provider_decides(
        fast_shop, shop_delayq, shop_worker, shop_carrier, sync):
    from shop import services
    from shop.models import Refund

    order = services.place_order("Ken", "120.00")
    services.pay(order)
    refund = services.request_refund(order, "120.00", answers_after=3)

    wait_for(lambda: Refund.objects.get(pk=refund.pk).status != Refund.Status.REQUESTED,
             what="refund decided")
    refund.refresh_from_db()
    assert (refund.status, refund.checks) == ("approved", 3)
    time.sleep(0.5)
    assert shop_delayq.pending(key=refund.key) == [], "polling went on after the answer"

    from celery_delayq.contrib.django.models import DelayedTask

    wait_for(lambda: sync.run_once() >= 0 and DelayedTask.objects.filter(
        key=refund.key, state="succeeded").count() == 3, what="three checks mirrored")
    checks = DelayedTask.objects.filter(key=refund.key).order_by("scheduled_at")
    assert [row.args for row in checks] == [[refund.pk, 0], [refund.pk, 1], [refund.pk, 2]]
    gaps = [(row.due - row.scheduled_at).total_seconds() for row in checks]
    assert gaps == pytest.approx(fast_shop.SHOP_REFUND_GAPS, abs=0.05)
    assert gaps == sorted(gaps)


def _mirror(order):
    from celery_delayq.contrib.django.models import DelayedTask

    return DelayedTask.objects.get(job_id=f"order:{order.pk}:close")


def test_order_added_in_the_admin_gets_a_timeout_that_paying_cancels(admin_client, shop_delayq):
    from django.urls import reverse
    from shop.models import Order

    response = admin_client.post(reverse("admin:shop_order_add"),
                                 {"customer": "Barbara", "total": "799.00",
                                  "refunds-TOTAL_FORMS": 0, "refunds-INITIAL_FORMS": 0})
    assert response.status_code == 302, response.content[:2000]
    order = Order.objects.get(customer="Barbara")
    assert shop_delayq.get(f"order:{order.pk}:close") is not None  # written on commit

    admin_client.post(reverse("admin:shop_order_changelist"),
                      {"action": "mark_paid", "_selected_action": [order.pk]})
    assert _order(order.pk).status == Order.Status.PAID
    assert shop_delayq.get(f"order:{order.pk}:close") is None


def test_shop_admin_actions_say_order_and_orders(admin_client, shop_delayq):
    from django.urls import reverse
    from shop import services

    orders = [services.place_order(name, "10.00") for name in ("Ada", "Grace", "Linus")]
    url = reverse("admin:shop_order_changelist")

    def act(action, *picked):
        response = admin_client.post(url, {"action": action, "_selected_action": [
            o.pk for o in picked]}, follow=True)
        return [str(m) for m in response.context["messages"]]

    assert act("mark_paid", orders[0]) == ["1 order paid"]
    assert act("mark_paid", orders[1], orders[2]) == ["2 orders paid"]
    assert act("request_full_refund", orders[0]) == ["1 refund requested"]
    assert act("request_full_refund", orders[1], orders[2]) == ["2 refunds requested"]
