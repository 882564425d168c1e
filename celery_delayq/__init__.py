"""celery-delayq: a durable, inspectable, cancellable delay store for Celery on Redis."""

from .errors import (
    ConfigurationError,
    DamagedShard,
    DelayQError,
    InvalidDelay,
    InvalidJobId,
    InvalidOption,
    JobExists,
    PayloadError,
    StoreFull,
    StoreUnavailable,
    UnknownQueue,
)
from .extension import DelayQ
from .http import http_callback  # the current app's task; DelayQ(app) registers it
from .job import Job
from .result import DelayedResult
from .store import CancelOutcome
from .task import DelayedTask

__all__ = [
    "CancelOutcome",
    "ConfigurationError",
    "DamagedShard",
    "DelayQ",
    "DelayQError",
    "DelayedResult",
    "DelayedTask",
    "InvalidDelay",
    "InvalidJobId",
    "InvalidOption",
    "Job",
    "JobExists",
    "PayloadError",
    "StoreFull",
    "StoreUnavailable",
    "UnknownQueue",
    "http_callback",
]
__version__ = "0.1.0"
