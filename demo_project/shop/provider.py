"""A simulated payment provider: undecided until the refund's n-th check, then final."""

from decimal import Decimal


def refund_status(refund) -> str:
    """``"pending"``, or the final ``"approved"`` / ``"rejected"`` (over 500 is rejected)."""
    if refund.checks < refund.provider_answers_after:
        return "pending"
    return "rejected" if refund.amount > Decimal("500") else "approved"
