"""Orders that close themselves when unpaid, refunds whose status is polled."""

from django.db import models
from django.utils import timezone


class Order(models.Model):
    class Status(models.TextChoices):
        UNPAID = "unpaid", "unpaid"
        PAID = "paid", "paid"
        CLOSED = "closed", "closed (unpaid too long)"

    customer = models.CharField("customer", max_length=100, help_text="Who ordered.")
    total = models.DecimalField("total", max_digits=10, decimal_places=2,
                                help_text="Amount to pay.")
    status = models.CharField("status", max_length=10, choices=Status.choices,
                              default=Status.UNPAID, help_text="Payment state.")
    created_at = models.DateTimeField("created at", default=timezone.now,
                                      help_text="When the order was placed.")
    paid_at = models.DateTimeField("paid at", null=True, blank=True,
                                   help_text="When the order was paid.")
    closed_at = models.DateTimeField("closed at", null=True, blank=True,
                                     help_text="When the order was closed unpaid.")

    def __str__(self):
        return f"order {self.pk} ({self.customer})"

    @property
    def key(self) -> str:
        """The business key of the order's delayed tasks."""
        return f"order:{self.pk}"


class Refund(models.Model):
    class Status(models.TextChoices):
        REQUESTED = "requested", "requested"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="refunds",
                              verbose_name="order", help_text="The refunded order.")
    amount = models.DecimalField("amount", max_digits=10, decimal_places=2,
                                 help_text="Amount to refund.")
    status = models.CharField("status", max_length=10, choices=Status.choices,
                              default=Status.REQUESTED,
                              help_text="What the payment provider answered.")
    checks = models.PositiveIntegerField("checks", default=0,
                                         help_text="How often the provider was asked.")
    provider_answers_after = models.PositiveIntegerField(
        "provider answers after", default=3,
        help_text="Simulation: the provider gives a final answer at this check.")
    requested_at = models.DateTimeField("requested at", default=timezone.now,
                                        help_text="When the refund was requested.")
    decided_at = models.DateTimeField("decided at", null=True, blank=True,
                                      help_text="When the provider gave its final answer.")

    def __str__(self):
        return f"refund {self.pk} of order {self.order_id}"

    @property
    def key(self) -> str:
        return f"refund:{self.pk}"
