"""The part of ``DelayQ``'s API that holds due jobs back: pausing a task or a queue, and
the promotion rate limits of queues (stored as :mod:`pausing` and :mod:`ratelimit` say;
how a held job is kept is :mod:`held`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import pausing, ratelimit
from .reading import counted, shown

if TYPE_CHECKING:
    from .conf import DelayQConfig
    from .store import Store
    from .store.releasing import Resumed

logger = logging.getLogger("celery_delayq")


class Holding:
    """Pauses and rate limits: the methods of :class:`~celery_delayq.DelayQ` that hold due
    jobs back (DelayQ gives them its ``config`` and ``store``)."""

    if TYPE_CHECKING:  # DelayQ's
        @property
        def config(self) -> DelayQConfig: ...

        @property
        def store(self) -> Store: ...

    # -- pausing -----------------------------------------------------------------------

    def pause(self, *, task: str | None = None, queue: str | None = None,
              by: str = "api") -> None:
        """Hold the due jobs of a task or a queue (pass one) until :meth:`resume`; they
        stay pending, listed, cancellable and reschedulable. Every carrier obeys it from
        its next claim round; ``by`` (who did it) is journaled."""
        field = pausing.field(task, queue)
        self.store.pause(field, by)
        logger.info("paused %s (by %s): its due jobs are held until resumed",
                    field.replace(":", " ", 1), shown(by))

    def resume(self, *, task: str | None = None, queue: str | None = None,
               by: str = "api") -> int:
        """End a pause; its held jobs fall due again (the carrier promotes them oldest
        first). Returns how many held jobs were given back."""
        return self.resumed(task=task, queue=queue, by=by).released

    def resumed(self, *, task: str | None = None, queue: str | None = None, by: str = "api",
                progress: Callable[[int], object] | None = None) -> Resumed:
        """:meth:`resume`, ``progress`` told how many were given back after each round; it
        says too whether the task or queue was paused (else it only went on giving back
        what a resume stopped part way left held)."""
        field = pausing.field(task, queue)
        done = self.store.resumed(field, by, progress)
        logger.info("resumed %s (by %s): %s given back%s", field.replace(":", " ", 1), shown(by),
                    counted(done.released, "held job"),
                    "" if done.was_paused else " (it was not paused)")
        return done

    def paused(self) -> dict[str, list[str]]:
        """What is paused: ``{"tasks": [...], "queues": [...]}``."""
        return pausing.listing(self.store.paused())

    # -- rate limits -------------------------------------------------------------------

    def set_rate_limit(self, queue: str, rate: str | float | None, *, by: str = "api") -> int:
        """Promote at most ``rate`` jobs of ``queue`` (Celery's rate string: ``"200/s"``,
        ``"30/m"``, ``"1000/h"``) across every carrier, oldest due first; None removes the
        limit (and the ``delayq_rate_limits`` default of it). Returns how many held jobs a
        removal gave back (due again)."""
        pausing.field(None, queue)  # a queue name, as a pause takes it
        limit = (ratelimit.OFF if rate is None
                 else ratelimit.bucket(rate, self.config.shards))
        released = self.store.set_rate_limit(queue, limit, by)
        logger.info("rate limit of queue %s: %s (by %s)", queue,
                    "none" if rate is None else ratelimit.text(rate), shown(by))
        return released

    def rate_limits(self) -> dict[str, str]:
        """The live rate limits: ``{"refunds": "200/s"}``."""
        return {queue: value.rsplit(" ", 1)[-1]
                for queue, value in sorted(self.store.rate_limits().items())
                if value != ratelimit.OFF}

    def apply_default_rate_limits(self) -> None:
        """Set each ``delayq_rate_limits`` entry that Redis has no live value of (a carrier
        does this as it starts; a limit removed since stays removed)."""
        live = self.store.rate_limits()
        for queue, rate in self.config.rate_limits.items():
            if queue not in live:
                self.set_rate_limit(queue, rate, by="delayq_rate_limits")
