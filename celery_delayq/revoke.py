"""Celery's revoke reaches the store: a revoked task still in the store is cancelled there.

Celery revokes by broadcasting a control message that each worker keeps in memory, so a
stored task would run once every worker had restarted. Two hooks, installed when an app
opts in (``DelayQ(app)``) and acting only for such apps, cancel it in the store instead:

- in the producer, ``app.control.revoke`` (which ``AsyncResult.revoke`` calls) cancels
  before it broadcasts, so a revoke works with no worker running;
- in a worker, the ``revoke`` control command cancels too, for a revoke sent by a process
  that did not opt in (``celery control revoke``, Flower).

Both still broadcast / keep Celery's in-memory revoke, which stops a task already promoted.
A task id is looked up as a job id (the job id of a call is its task id), then in the task
id index the store keeps beside a job scheduled with ``job_id=`` of its own
(``Store.cancel_task``); that index lives until a day past the job's due time. A cancelled
job's result is REVOKED, so ``AsyncResult.get()`` raises ``TaskRevokedError`` at once.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

from celery.app.control import Control as CeleryControl
from kombu.utils.imports import symbol_by_name

from .errors import DelayQError

if TYPE_CHECKING:
    from .extension import DelayQ

logger = logging.getLogger("celery_delayq.revoke")

REASON = "cancelled in the delay store"
_command_lock = threading.Lock()
_command_wrapped = False


def mark_revoked(app, task_id: str, task: str | None, backend: Any = None) -> None:
    """Store the REVOKED state of a cancelled task, as a worker does for a revoked one, in
    ``backend`` (the one its result reads), else the backend of the task registered here
    as ``task`` (a task may have its own), else the app's."""
    if backend is None:  # (the registry as it is: looking must not finalize the app)
        backend = getattr(app._tasks.get(task or ""), "backend", None) or app.backend
    backend.mark_as_revoked(task_id, REASON)


def install(delayq: DelayQ) -> None:
    """Hook revoke for this app (producer side) and in workers (once per process)."""
    app = delayq.app
    if "control" in vars(app):  # already created: give it the revoking class
        app.control.__class__ = _revoking(app.control.__class__)
    elif symbol_by_name(app.control_cls) is CeleryControl:
        app.control_cls = f"{__name__}:Control"  # by name: the app still pickles
    else:
        app.control_cls = _revoking(symbol_by_name(app.control_cls))
    _wrap_worker_command()


class _RevokingControl:
    """``app.control`` whose ``revoke`` cancels stored jobs before broadcasting."""

    def revoke(self, task_id, *args: Any, **kwargs: Any):
        from .extension import DelayQ

        delayq = DelayQ.lookup(self.app)  # type: ignore[attr-defined]
        try:
            if delayq is not None:
                delayq.revoke(task_id)
        finally:  # workers hear it even when the store could not be reached (that raises)
            reply = super().revoke(task_id, *args, **kwargs)  # type: ignore[misc]
        return reply


class Control(_RevokingControl, CeleryControl):
    """Celery's ``app.control`` of an app that opted in."""


@functools.cache
def _revoking(control_cls: type) -> type:
    """A subclass of an app's own control class that revokes in the store."""
    if issubclass(control_cls, _RevokingControl):
        return control_cls
    if control_cls is CeleryControl:
        return Control
    return type(control_cls.__name__, (_RevokingControl, control_cls), {})


def _wrap_worker_command() -> None:
    """Make a worker's ``revoke`` control command cancel stored jobs of opted-in apps."""
    global _command_wrapped
    with _command_lock:
        if _command_wrapped:
            return
        from celery.worker.control import Panel

        original = Panel.data["revoke"]

        @functools.wraps(original)
        def revoke(state, task_id, *args: Any, **kwargs: Any):
            reply = original(state, task_id, *args, **kwargs)
            from .extension import DelayQ

            delayq = DelayQ.lookup(state.app)
            if delayq is not None:
                try:
                    delayq.revoke(task_id)
                except DelayQError as exc:  # the worker's own revoke stands
                    logger.warning("could not cancel revoked tasks in the store: %s", exc)
            return reply

        Panel.data["revoke"] = revoke
        _command_wrapped = True
