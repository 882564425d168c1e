"""celery-delayq: a durable, inspectable, cancellable delay store for Celery on Redis.

The public names below are imported on first use: pytest loads the package's plugin
(``celery_delayq.testing.pytest_plugin``) in every project where it is installed, before
that project's ``conftest.py``, which may have to run before Celery, Redis or ``ssl`` are
imported (gevent's and eventlet's monkey-patching).

PYTEST_DONT_REWRITE: pytest marks the package of a plugin's distribution for assertion
rewriting, and warns when it was imported first (every ``celery`` command imports it, for
its ``delayq`` command), which ``-W error`` makes an error.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        UnsupportedMessage,
    )
    from .extension import DelayQ
    from .http import http_callback
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
    "UnsupportedMessage",
    "http_callback",
]
__version__ = "0.1.0"

#: The module of each public name that is not an error (those are in ``errors``).
_HOMES = {"CancelOutcome": ".store", "DelayQ": ".extension", "DelayedResult": ".result",
          "DelayedTask": ".task", "Job": ".job", "http_callback": ".http"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_HOMES.get(name, ".errors"), __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
