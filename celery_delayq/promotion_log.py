"""The carrier's log of what it promoted: a line per batch while batches are rare, at most
one line per :data:`EVERY` seconds while they are not (a line per batch came to ~80 MB a
day at 300 jobs/s), each batch at DEBUG too."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .reading import counted, elapsed

#: Seconds between two INFO lines of promotions.
EVERY = 10.0


class PromotionLog:
    """Sums the batches promoted since its last INFO line, and logs them."""

    def __init__(self, logger: logging.Logger, every: float = EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self._every, self._clock = logger, every, clock
        self._next = 0.0  # clock() from which the next INFO line may be written
        self._since = 0.0  # clock() at the first batch not logged yet
        self._jobs = self._batches = 0
        self._total_ms = self._max_ms = 0.0
        self._p50_ms = 0.0  # of the one batch not logged yet

    def batch(self, lateness: list[float]) -> None:
        """Note one batch, by the lateness (ms) of each of its jobs."""
        lateness = sorted(lateness)
        p50, most = lateness[len(lateness) // 2], lateness[-1]
        self._logger.debug("promoted a batch of %s; lateness p50 %s, max %s",
                           counted(len(lateness), "job"), elapsed(p50), elapsed(most))
        if not self._batches:
            self._since = self._clock()
        self._jobs += len(lateness)
        self._batches += 1
        self._total_ms += sum(lateness)
        self._max_ms = max(self._max_ms, most)
        self._p50_ms = p50
        self.flush_due()

    def flush_due(self) -> None:
        """Log the batches not logged yet once :data:`EVERY` seconds passed since the last
        line (at once after a quiet spell)."""
        if self._batches and self._clock() >= self._next:
            self.flush()

    def flush(self) -> None:
        """Log the batches not logged yet (a carrier stopping)."""
        if not self._batches:
            return
        now = self._clock()
        if self._batches == 1:
            self._logger.info("promoted %s; lateness p50 %s, max %s",
                              counted(self._jobs, "job"), elapsed(self._p50_ms),
                              elapsed(self._max_ms))
        else:
            self._logger.info("promoted %s in %s (%d batches); lateness mean %s, max %s",
                              counted(self._jobs, "job"), elapsed((now - self._since) * 1000),
                              self._batches, elapsed(self._total_ms / self._jobs),
                              elapsed(self._max_ms))
        self._next = now + self._every
        self._jobs = self._batches = 0
        self._total_ms = self._max_ms = 0.0
