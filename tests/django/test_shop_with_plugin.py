"""The shop's flows tested the way a user of the package tests theirs: with the ``delayq``
pytest fixture (celery_delayq.testing.pytest_plugin), moving a test clock instead of waiting."""

from __future__ import annotations

import pytest
from shop import services
from shop.models import Order, Refund

from celery_delayq.testing.tester import DelayQTester

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit writes must really commit


@pytest.fixture
def delayq(shop_app, redis_server):
    """The plugin's ``delayq`` fixture for the shop (this suite's conftest already uses the
    name for the core tests' store, so the tester is built here as the plugin builds it)."""
    with DelayQTester(shop_app, f"{redis_server.url}/1") as tester:
        yield tester


def test_unpaid_order_closes_when_its_timeout_falls_due(delayq, settings):
    settings.SHOP_ORDER_TIMEOUT = 1800
    order = services.place_order("ada", "12.50")
    [job] = delayq.pending(task="shop.tasks.close_unpaid_order")
    assert job.key == order.key

    assert delayq.advance(minutes=29) == []
    [run] = delayq.advance(minutes=1)
    assert (run.state, run.result) == ("SUCCESS", "closed")
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED


def test_paying_cancels_the_timeout(delayq, settings):
    settings.SHOP_ORDER_TIMEOUT = 1800
    order = services.place_order("bob", "9.90")
    assert services.pay(order) is True
    assert delayq.pending() == []
    assert delayq.advance(hours=1) == []
    order.refresh_from_db()
    assert order.status == Order.Status.PAID


def test_refund_is_checked_with_growing_gaps_until_the_provider_decides(delayq, settings):
    settings.SHOP_REFUND_GAPS = [10, 30, 120]
    settings.SHOP_ORDER_TIMEOUT = 3600  # the order's own timeout stays out of the way
    order = services.place_order("cy", "20.00")
    refund = services.request_refund(order, "20.00", answers_after=3)
    answers = []
    for gap in (10, 30, 120):
        assert delayq.advance(seconds=gap - 1) == [], "checked before its gap passed"
        [run] = delayq.advance(seconds=1)
        answers.append(run.result)
    refund.refresh_from_db()
    assert answers[:2] == ["pending", "pending"] and answers[2] == refund.status
    assert refund.status in (Refund.Status.APPROVED, Refund.Status.REJECTED)
    assert refund.checks == 3
    assert delayq.pending(task="shop.tasks.check_refund_status") == []
