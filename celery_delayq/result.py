"""What a delayed call returns: :class:`DelayedResult` (Celery's ``AsyncResult`` of the
task, with its job id, due time and ``cancel()``), or :class:`EagerDelayedResult` when
``task_always_eager`` ran the task at once."""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult, EagerResult
from vine import promise

from .store import CancelOutcome

if TYPE_CHECKING:
    from .extension import DelayQ


class DelayedResult(AsyncResult):
    """The ``AsyncResult`` of a delayed task, plus its job id, due time and ``cancel()``."""

    def __init__(self, id: str, job_id: str, eta: datetime | None, delayq: DelayQ,
                 key: str | None = None, parent: AsyncResult | None = None,
                 backend: Any = None) -> None:
        # AsyncResult.__init__ but for on_ready (a promise holding a weak method, a large
        # share of apply_delayed_many's time), built when first used: most are never awaited.
        self.app = delayq.app
        self.id = id
        self.backend = backend or delayq.app.backend  # a task's own, as Task.AsyncResult
        self.parent = parent
        self._cache = None
        self._ignored = False
        self.job_id = job_id
        self.eta = eta
        self.key = key
        self._delayq = delayq

    @cached_property
    def on_ready(self) -> promise:
        return promise(self._on_fulfilled, weak=True)

    def __reduce_args__(self) -> tuple:  # what pickle rebuilds it from
        return self.id, self.job_id, self.eta, self._delayq, self.key, self.parent, self.backend

    def __copy__(self) -> DelayedResult:
        return DelayedResult(*self.__reduce_args__())

    def cancel(self) -> bool:
        """True if the job was still pending and is now cancelled; False if too late. The
        job is the one of this job id, also when a later call replaced this one under it:
        the results of both calls are REVOKED. A result backend that cannot take the
        REVOKED state does not make it raise (a WARNING says so)."""
        outcome = self._delayq.cancel_outcome(self.job_id, self.key, task_id=self.id,
                                              backend=self.backend)
        return outcome is CancelOutcome.CANCELLED

    def revoke(self, connection=None, terminate: bool = False, signal=None,
               wait: bool = False, timeout: float | None = None) -> None:
        """Cancel the job if it is still stored (as :meth:`cancel`), then revoke this
        call as Celery does (which stops it if it was promoted already). The revoke is
        broadcast even when the store cannot be reached; that error is raised after it."""
        from .revoke import broadcast_revoke, remember

        try:
            remember(self._delayq, [self.id])
            self._delayq.cancel_outcome(self.job_id, self.key, by="revoke", task_id=self.id,
                                        backend=self.backend)
        finally:  # the workers hear it whatever the store did
            broadcast_revoke(self.app, self.id, connection=connection, terminate=terminate,
                             signal=signal, reply=wait, timeout=timeout)


class EagerDelayedResult(EagerResult):
    """What a delayed call returns with ``task_always_eager``: the task has run already,
    so :meth:`cancel` is too late."""

    def __init__(self, *args: Any, job_id: str, eta: datetime, key: str | None) -> None:
        super().__init__(*args)
        self.job_id, self.eta, self.key = job_id, eta, key

    def cancel(self) -> bool:
        return False
