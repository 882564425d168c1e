"""Redis persistence: whether the store's Redis keeps stored jobs when it stops.

Without an append-only file (``appendonly no``) a Redis that stops loses every write since
its last RDB snapshot: jobs scheduled, cancelled or promoted in that window. The carrier
logs it (WARNING, at start and whenever it changes), ``delayq health`` prints it (and stays
healthy: restarting would not help), and Django's deployment check warns (``delayq.W004``).
A Redis loading its append-only file after a restart says ``aof_enabled:0`` until it has
loaded: its persistence is unknown until then, and not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .reading import counted

logger = logging.getLogger("celery_delayq.carrier")


@dataclass(frozen=True)
class Persistence:
    """What INFO persistence says of one Redis server."""

    aof: bool | None  # aof_enabled; None where the server does not say, or while loading
    unsaved: int  # rdb_changes_since_last_save
    loading: bool = False  # loading its data (after a restart)

    @classmethod
    def from_info(cls, info: dict) -> Persistence:
        aof = str(info.get("aof_enabled", ""))
        unsaved = str(info.get("rdb_changes_since_last_save", "0"))
        loading = str(info.get("loading", "0")) != "0"
        return cls(aof == "1" if aof in ("0", "1") and not loading else None,
                   int(unsaved) if unsaved.isdigit() else 0, loading)


def persistence_problem(persistence: Persistence) -> str | None:
    """What a stop of this Redis would lose, or None when it keeps an append-only file."""
    if persistence.aof is not False:
        return None
    return (f"Redis keeps no append-only file (appendonly no): if it stops, it loses the "
            f"{counted(persistence.unsaved, 'write')} since its last RDB snapshot, stored jobs "
            "among them. Turn AOF on: `CONFIG SET appendonly yes`, and `appendonly yes` in "
            "redis.conf")


class PersistenceWatch:
    """A carrier's look at its store's persistence, logged when first seen and on change."""

    def __init__(self, read: Callable[[], list[Persistence]]) -> None:
        self._read = read
        self._durable: bool | None = None

    def check(self) -> None:
        readings = self._read()
        if any(reading.loading for reading in readings):
            return  # unknown until it has loaded: the last verdict stands
        problems = sorted({p for p in map(persistence_problem, readings) if p})
        if problems and self._durable is not False:
            for problem in problems:
                logger.warning("NOT DURABLE: %s", problem)
        elif not problems and self._durable is False:
            logger.info("the store's Redis append-only file is on")
        self._durable = not problems
