"""Django system checks of the delay store: ``delayq.W001`` warns when its Redis may evict
keys (a ``maxmemory-policy`` other than ``noeviction``), ``delayq.W002`` when that cannot
be read, ``delayq.W003`` when ``CELERY_DELAYQ_REDIS_URL`` holds a password, ``delayq.W004``
when its Redis keeps no append-only file (a stop loses the jobs since the last snapshot).

They are deployment checks (``manage.py check --deploy``): W001, W002 and W004 ask Redis, and
every other ``manage.py`` command, and Celery's worker start (which runs Django's checks),
stays free of a Redis round trip and of its timeouts during an outage.
"""

from __future__ import annotations

from django.core.checks import Warning, register

from celery_delayq import DelayQError
from celery_delayq.conf import password_shown
from celery_delayq.memory import eviction_problem
from celery_delayq.persistence import persistence_problem

from .runtime import celery_app, delayq


@register("delayq", deploy=True)
def check_store_redis(app_configs=None, **kwargs) -> list[Warning]:
    """Warn when the delay store's Redis may evict stored jobs, or would lose them if it
    stopped (one look, so an outage is waited out once)."""
    try:
        store = delayq().store
        policies, persistence = store.eviction_policies(), store.persistence()
    except DelayQError as exc:
        return [Warning(f"cannot read the delay store's Redis (maxmemory-policy, "
                        f"persistence): {exc}",
                        hint="Check that Redis runs; `celery -A proj delayq health` says more.",
                        id="delayq.W002")]
    evicting = [Warning(problem, hint="Run `CONFIG SET maxmemory-policy noeviction` on the "
                        "store's Redis and set it in redis.conf.", id="delayq.W001")
                for problem in sorted({p for p in map(eviction_problem, policies) if p})]
    return evicting + [
        Warning(problem, hint="Set `appendonly yes` in the store's redis.conf (and `CONFIG "
                "SET appendonly yes` to turn it on now).", id="delayq.W004")
        for problem in sorted({p for p in map(persistence_problem, persistence) if p})]


@register("delayq", deploy=True)
def check_password_shown(app_configs=None, **kwargs) -> list[Warning]:
    """Warn when the store's URL setting holds a password that error pages and reports show."""
    if not password_shown(celery_app()):
        return []
    return [Warning("CELERY_DELAYQ_REDIS_URL holds a password, which Django's error pages "
                    "(DEBUG), `celery report` and `celery inspect conf` show as it is.",
                    hint="Set CELERY_DELAYQ_REDIS_PASSWORD (they hide it) and leave the "
                    "password out of the URL.", id="delayq.W003")]
