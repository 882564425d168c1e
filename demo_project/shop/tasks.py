"""The shop's delayed tasks."""

from celery import shared_task
from django.db import OperationalError, transaction
from django.utils import timezone

from celery_delayq import DelayedTask

from . import provider
from .models import Order, Refund


@shared_task(base=DelayedTask)
def close_unpaid_order(order_id: int) -> str:
    """Close the order if it is still unpaid."""
    closed = Order.objects.filter(pk=order_id, status=Order.Status.UNPAID).update(
        status=Order.Status.CLOSED, closed_at=timezone.now())
    return "closed" if closed else "not unpaid any more"


# Django before 5.1 begins SQLite transactions DEFERRED: two workers' read-then-write can meet
# "database is locked" at once. Such a check is retried a moment later (through the store).
@shared_task(base=DelayedTask, autoretry_for=(OperationalError,), max_retries=5,
             retry_backoff=1, retry_jitter=False)
def check_refund_status(refund_id: int, attempt: int = 0) -> str:
    """Ask the provider about a refund; until it decides, check again after a longer gap."""
    from .services import schedule_check

    with transaction.atomic():
        refund = Refund.objects.select_for_update().get(pk=refund_id)
        if refund.status != Refund.Status.REQUESTED:
            return refund.status
        refund.checks += 1
        answer = provider.refund_status(refund)
        if answer != "pending":
            refund.status, refund.decided_at = answer, timezone.now()
        refund.save()
        if answer == "pending":
            schedule_check(refund, attempt + 1)  # written to Redis when this commits
    return answer
