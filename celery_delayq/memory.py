"""Redis memory: the producers' headroom limit, the eviction-policy verdict, and what
Redis's refusal of a write for memory looks like (:func:`refused_for_memory`).

A Redis at ``maxmemory`` with ``noeviction`` refuses every write that needs memory, the
broker's ``LPUSH`` of a promoted job included, so producers stop short of it
(``delayq_max_memory_fraction``) and leave the rest to promotion, which frees memory.
A Redis with any other policy may evict stored jobs silently: it is reported as unsafe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from .errors import StoreFull

logger = logging.getLogger("celery_delayq.carrier")

SAFE_POLICY = "noeviction"
_READ_EVERY = 1.0  # longest time between two reads of INFO memory by one producer process
_SHARE = 8  # ... or once the process has written this share of the room left


@dataclass(frozen=True)
class Memory:
    """What INFO memory says of one Redis server."""

    used: int  # used_memory, bytes
    limit: int  # maxmemory, bytes; 0: no limit
    policy: str  # maxmemory_policy

    @classmethod
    def from_info(cls, info: dict) -> Memory:
        return cls(int(info["used_memory"]), int(info["maxmemory"]),
                   str(info.get("maxmemory_policy", "")))

    def room(self, fraction: float) -> int:
        """Bytes left below ``fraction`` of the limit (a petabyte without a limit)."""
        return max(0, int(fraction * self.limit) - self.used) if self.limit else 1 << 50

    def over(self, fraction: float) -> bool:
        """True when a limit is set and ``used`` has reached ``fraction`` of it."""
        return self.limit > 0 and self.used >= fraction * self.limit


class Headroom:
    """Whether Redis is past a fraction of its ``maxmemory``. It is read again after a
    second (``every_near_limit`` while Redis has a ``maxmemory``), or sooner once the caller
    has written an eighth of the room left (counted in envelope bytes; Redis holds a few
    times that per job), so a producer reads it about once a second and cannot run past the
    limit between two readings. Producers get :class:`StoreFull` past
    ``delayq_max_memory_fraction``; a carrier on the broker's Redis reads it on every pass
    while a ``maxmemory`` is set, and stops claiming past the midpoint between that fraction
    and ``maxmemory``."""

    def __init__(self, fraction: float, read: Callable[[], list[Memory]], where: str,
                 every_near_limit: float = _READ_EVERY) -> None:
        """``every_near_limit``: seconds between readings while Redis has a ``maxmemory``
        (without one, once a second: there is nothing to run into)."""
        self.fraction, self._read, self._where = fraction, read, where
        self._every_near_limit = every_near_limit
        self._lock = threading.Lock()
        self._next_read = 0.0
        self._budget = 0  # bytes the caller may write before the next reading
        self._full: Memory | None = None

    def full(self, size: int = 0) -> Memory | None:
        """The reading of a Redis past the fraction, or None; ``size``: bytes about to be
        written."""
        with self._lock:
            self._budget -= size
            now = time.monotonic()
            if now >= self._next_read or self._budget < 0:
                readings = self._read()
                self._full = next((m for m in readings if m.over(self.fraction)), None)
                limited = any(m.limit for m in readings)
                self._next_read = now + (self._every_near_limit if limited else _READ_EVERY)
                self._budget = min(m.room(self.fraction) for m in readings) // _SHARE
            return self._full

    def check(self, size: int = 0) -> None:
        """Raise :class:`StoreFull` when Redis is past the fraction."""
        full = self.full(size)
        if full is not None:
            raise StoreFull(
                f"Redis at {self._where} uses {full.used:,} of its {full.limit:,} bytes "
                f"(maxmemory), past delayq_max_memory_fraction={self.fraction:g}")

    def refused(self) -> None:
        """Redis refused a write for memory: read it again on the next check."""
        with self._lock:
            self._budget = -1


def eviction_problem(policy: str) -> str | None:
    """What is wrong with a ``maxmemory-policy``, or None when it never evicts keys."""
    if policy == SAFE_POLICY:
        return None
    if not policy:
        return ("the maxmemory-policy of Redis cannot be read (CONFIG GET and INFO memory "
                "are refused); make sure it is noeviction, or stored jobs may be evicted")
    return (f"Redis maxmemory-policy is {policy!r}: when memory runs out Redis deletes keys, "
            "and stored delayed jobs vanish silently. Set it to noeviction (`CONFIG SET "
            "maxmemory-policy noeviction` and `maxmemory-policy noeviction` in redis.conf), "
            "or give the delay store a Redis of its own that does not evict (delayq_redis_url)")


class CarrierGuard:
    """A carrier's watch on Redis memory: it logs an evicting ``maxmemory-policy`` (ERROR,
    at start and whenever it changes) and, when the store is on the broker's Redis, holds
    promotion while Redis is past the midpoint between ``delayq_max_memory_fraction`` and
    ``maxmemory``: a Celery worker whose own writes (kombu's unacked set, pidbox) Redis
    refuses stops, and then nothing drains the broker."""

    def __init__(self, fraction: float, read_memory: Callable[[], list[Memory]],
                 read_policies: Callable[[], list[str]], where: str,
                 shares_broker: Callable[[], bool]) -> None:
        self._brake = Headroom((1 + fraction) / 2, read_memory, where, every_near_limit=0)
        self._read_policies = read_policies
        self._shares_broker = shares_broker  # on a store of its own, promotion frees memory
        self._shared: bool | None = None
        self._policies: list[str] | None = None
        self._braking = False

    def check_policy(self) -> None:
        policies = self._read_policies()
        if policies == self._policies:
            return
        problems = sorted({p for p in map(eviction_problem, policies) if p})
        for problem in problems:
            logger.error("UNSAFE STORE: %s", problem)
        if not problems and self._policies is not None:
            logger.info("Redis maxmemory-policy is now %s", ", ".join(sorted(set(policies))))
        self._policies = policies

    def braking(self) -> bool:
        """True while promotion should wait for the workers to drain the broker (only when
        the store is on the broker's Redis)."""
        if self._shared is None:
            self._shared = self._shares_broker()
        full = self._brake.full() if self._shared else None
        if full is not None and not self._braking:
            logger.warning("Redis uses %s of its %s bytes: promotion waits until workers "
                           "drain the broker (raise maxmemory or add workers if this lasts)",
                           f"{full.used:,}", f"{full.limit:,}")
        elif full is None and self._braking:
            logger.info("Redis has room again: promotion resumes")
        self._braking = full is not None
        return self._braking


def refused_for_memory(exc: BaseException) -> bool:
    """True for Redis's OOM refusal: OutOfMemoryError, or inside a script on Redis 6.2
    ("Error running script ... -OOM command not allowed ...")."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or \
        "command not allowed when used memory > 'maxmemory'" in str(exc)
