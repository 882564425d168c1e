"""What the shop does: place and pay orders, request refunds; each schedules or cancels
its delayed tasks in the same database transaction."""

from __future__ import annotations

import random
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from demo_project.celery_app import delayq

from .models import Order, Refund
from .tasks import check_refund_status, close_unpaid_order


def schedule_timeout(order: Order, timeout: float | None = None) -> None:
    """Close ``order`` after ``timeout`` seconds (default ``SHOP_ORDER_TIMEOUT``) unless it
    is paid first."""
    close_unpaid_order.apply_delayed(
        args=(order.pk,), delay=settings.SHOP_ORDER_TIMEOUT if timeout is None else timeout,
        key=order.key, job_id=f"{order.key}:close")


def place_order(customer: str, total: Decimal | str, timeout: float | None = None) -> Order:
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=Decimal(total))
        schedule_timeout(order, timeout)
    return order


def pay(order: Order) -> bool:
    """Mark an unpaid order paid and cancel its timeout; False if it was not unpaid."""
    with transaction.atomic():
        paid = Order.objects.filter(pk=order.pk, status=Order.Status.UNPAID).update(
            status=Order.Status.PAID, paid_at=timezone.now())
        if paid:
            key = order.key
            transaction.on_commit(lambda: delayq.cancel_key(key, by="shop: order paid"))
    return bool(paid)


def refund_gap(attempt: int) -> float:
    """Seconds before check number ``attempt`` (0-based): growing, the last gap repeats."""
    gaps = settings.SHOP_REFUND_GAPS
    return gaps[min(attempt, len(gaps) - 1)]


def schedule_check(refund: Refund, attempt: int, queue: str | None = None) -> None:
    """Check ``refund`` after the gap of ``attempt``, on ``queue`` (default: the default
    queue)."""
    check_refund_status.apply_delayed(
        args=(refund.pk, attempt), delay=refund_gap(attempt), key=refund.key,
        job_id=f"{refund.key}:check:{attempt}", queue=queue)


def request_refund(order: Order, amount: Decimal | str, answers_after: int | None = None,
                   queue: str | None = None) -> Refund:
    """Request a refund; its first status check goes to ``queue`` (default: the default
    queue), later ones to the default queue."""
    with transaction.atomic():
        refund = Refund.objects.create(
            order=order, amount=Decimal(amount),
            provider_answers_after=answers_after or random.randint(2, 4))
        schedule_check(refund, 0, queue)
    return refund
