"""Celery's revoke reaches the store: a revoked task still in the store is cancelled there.

Celery revokes by broadcasting a control message that each worker keeps in memory, so a
stored task would run once every worker had restarted. Two hooks, installed when an app
opts in (``DelayQ(app)``) and acting only for such apps, cancel it in the store instead:

- in the producer, ``app.control.revoke`` (which ``AsyncResult.revoke`` calls) cancels
  before it broadcasts, so a revoke works with no worker running;
- in a worker, the ``revoke`` control command cancels too, for a revoke sent by a process
  that did not opt in (``celery control revoke``, Flower).

Both still broadcast / keep Celery's in-memory revoke, which stops a task already promoted:
the producer broadcasts even when the store cancel failed (that error is raised after), and
the worker answers at once, its store cancel made by a thread of its own
(:class:`_Canceller`), as a worker's event loop must never wait for the store's Redis.
A task id is looked up as a job id (the job id of a call is its task id), then in the task
id index the store keeps beside a job scheduled with ``job_id=`` of its own
(``Store.cancel_task``); that index lives until a day past the job's due time. A cancelled
job's result is REVOKED, so ``AsyncResult.get()`` raises ``TaskRevokedError`` at once;
when the result backend cannot take that, the job stays cancelled (:class:`Marking` says so
in a WARNING). A revoke is also recorded in the store for as long as a worker keeps one in
memory: a task revoked while it runs may retry, and the retry it stores then is cancelled
(a worker started since would not know the revoke). In eager mode (``task_always_eager``)
a revoke leaves the store alone when this process never opened it: its delayed calls ran
at once, none was stored.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from celery import signals
from celery.app.control import Control as CeleryControl
from kombu.utils.imports import symbol_by_name

from .errors import DelayQError, StoreFull
from .reading import counted

if TYPE_CHECKING:
    from .envelope import Call
    from .extension import DelayQ

logger = logging.getLogger("celery_delayq.revoke")

REASON = "cancelled in the delay store"
_command_lock = threading.Lock()
_command_wrapped = False


def remember(delayq: DelayQ, task_ids: list[str]) -> None:
    """Record the revoke of ``task_ids`` in the store for as long as a worker keeps one
    in memory (``CELERY_WORKER_REVOKE_EXPIRES``), so a retry that a run of one of them
    stores later is cancelled (:func:`drop_retry_if_revoked`). A full Redis refusing it
    stops no cancel."""
    from celery.worker.state import REVOKE_EXPIRES, REVOKES_MAX

    try:  # the newest, as many as a worker keeps
        delayq.store.remember_revoked(task_ids[-REVOKES_MAX:], REVOKE_EXPIRES)
    except StoreFull as exc:
        logger.warning("could not record the revoke of %s in the store: %s; a retry their "
                       "runs store meanwhile is kept", counted(len(task_ids), "task"), exc)


def drop_retry_if_revoked(delayq: DelayQ, call: Call) -> None:
    """Cancel the retry the running task just stored when its task id was revoked (as a
    worker's in-memory revoke discards a native retry's message); its result is REVOKED
    once Celery has recorded the retry (:func:`_retried`). When the store cannot say, the
    retry stays (a WARNING says so)."""
    try:
        if not delayq.store.revoked(call.task_id):
            return
        delayq.cancel_outcome(call.job_id, call.key, by="revoke", task_id=call.task_id)
    except DelayQError as exc:
        logger.warning("could not tell whether task %s[%s] was revoked: its retry is kept "
                       "(%s)", call.task, call.task_id, exc)
        return
    _retries_dropped.add(call.task_id)
    logger.warning("task %s[%s] was revoked while it ran: its retry is cancelled", call.task,
                   call.task_id)


def retry_superseded(call: Call, newer: str) -> None:
    """The running task's retry found a newer call (task id ``newer``) under its job id,
    scheduled while it ran, which stays: the retry is not stored, and its result is
    REVOKED once Celery has recorded the retry (:func:`_retried`)."""
    _retries_dropped.add(call.task_id)
    logger.warning("the retry of %s[%s] is not stored: its job id %s holds a newer call "
                   "(%s), scheduled while it ran", call.task, call.task_id, call.job_id, newer)


#: Task ids whose retry this process cancelled (:func:`drop_retry_if_revoked`) or did not
#: store (:func:`retry_superseded`), until
#: Celery has recorded the retry or the run ended otherwise (a call of the running task's
#: id that is no retry: ``Task.replace``, ``apply_async(task_id=...)``).
_retries_dropped: set[str] = set()


def _retried(sender: Any = None, request: Any = None, **_: Any) -> None:
    """After Celery recorded a retry (state RETRY), a cancelled one's result is REVOKED."""
    if request is not None and request.id in _retries_dropped:
        _retries_dropped.discard(request.id)
        mark_revoked(sender.app, request.id, sender.name)


def _ran(task_id: str | None = None, **_: Any) -> None:
    """A run ended: a call of its id cancelled for a revoke without a retry marks nothing
    later."""
    _retries_dropped.discard(task_id)


def mark_revoked(app, task_id: str, task: str | None, backend: Any = None) -> None:
    """Store the REVOKED state of a cancelled task, as a worker does for a revoked one, in
    ``backend`` (the one its result reads), else the backend of the task registered here
    as ``task`` (a task may have its own), else the app's."""
    _backend_of(app, task, backend).mark_as_revoked(task_id, REASON)


def _backend_of(app, task: str | None, backend: Any = None) -> Any:
    """``backend``, else that of the task registered here as ``task``, else the app's."""
    if backend is None:  # (the registry as it is: looking must not finalize the app)
        backend = getattr(app._tasks.get(task or ""), "backend", None) or app.backend
    return backend


class Marking:
    """Marks the results of cancelled jobs REVOKED, never failing the cancel: a backend that
    cannot take a mark (away) is not asked again for the others of the same cancel, and
    :meth:`report` logs one WARNING naming the jobs left unmarked, which ARE cancelled."""

    def __init__(self, app) -> None:
        self.app = app
        self.unmarked: list[str] = []
        self._failed: dict[int, BaseException] = {}  # id(backend) -> its error

    def mark_calls(self, task_ids: Iterable[str | None], task: str | None,
                   backend: Any = None) -> None:
        """Mark each of ``task_ids`` once (a cancel's: the call its job held, and the one
        the caller named, when it is another; None and "" left out)."""
        for task_id in dict.fromkeys(filter(None, task_ids)):
            self.mark(task_id, task, backend)

    def mark(self, task_id: str, task: str | None, backend: Any = None) -> None:
        backend = _backend_of(self.app, task, backend)
        if id(backend) not in self._failed:
            try:
                mark_revoked(self.app, task_id, task, backend)
                return
            except Exception as exc:  # each backend raises errors of its own
                self._failed[id(backend)] = exc
        self.unmarked.append(task_id)

    def report(self) -> None:
        """Log the jobs whose results could not be marked, if any (once per cancel)."""
        if not self.unmarked:
            return
        shown = ", ".join(self.unmarked[:20])
        if len(self.unmarked) > 20:
            shown += f", ... ({len(self.unmarked) - 20} more)"
        errors = "; ".join(sorted({f"{type(e).__name__}: {e}" for e in self._failed.values()}))
        many = len(self.unmarked) > 1
        logger.warning(
            "%d job%s %s cancelled in the delay store, but %s could not be marked "
            "REVOKED in the result backend (%s): AsyncResult.get() of %s waits instead of "
            "raising TaskRevokedError. Task ids: %s",
            len(self.unmarked), "s" if many else "", "ARE" if many else "IS",
            "their results" if many else "its result",
            errors, "them" if many else "it", shown)


class Installed(NamedTuple):
    """What :func:`install` changed on an app, for :func:`uninstall` to put back."""

    control_cls: Any  # app.control_cls before (a class or its name)
    control_class: type | None  # the class of app.control, when it was created already


def install(delayq: DelayQ) -> Installed:
    """Hook revoke for this app (producer side) and in workers (once per process)."""
    app = delayq.app
    control = vars(app).get("control")
    installed = Installed(app.control_cls, None if control is None else type(control))
    if control is not None:  # already created: give it the revoking class
        app.control.__class__ = _revoking(app.control.__class__)
    elif symbol_by_name(app.control_cls) is CeleryControl:
        app.control_cls = f"{__name__}:Control"  # by name: the app still pickles
    else:
        app.control_cls = _revoking(symbol_by_name(app.control_cls))
    _wrap_worker_command()
    return installed


def uninstall(app, installed: Installed) -> None:
    """Undo :func:`install` on ``app``: its control class is back, and so is the class of
    an ``app.control`` created since, unless another class was set over ours. The
    worker's command wrapper stays: it serves every app, and acts only for opted-in ones."""
    app.control_cls = installed.control_cls
    control = vars(app).get("control")
    if control is None:
        return
    own = installed.control_class or symbol_by_name(installed.control_cls)
    if type(control) is _revoking(own) is not own:
        control.__class__ = own


class _RevokingControl:
    """``app.control`` whose ``revoke`` cancels stored jobs before broadcasting."""

    def revoke(self, task_id, *args: Any, **kwargs: Any):
        from .extension import DelayQ

        delayq = DelayQ.lookup(self.app)  # type: ignore[attr-defined]
        try:
            if delayq is not None and not skipped_when_eager(delayq):
                delayq.revoke(task_id)
        finally:  # workers hear it even when the store could not be reached (that raises)
            reply = self.broadcast_revoke(task_id, *args, **kwargs)
        return reply

    def broadcast_revoke(self, task_id, *args: Any, **kwargs: Any):
        """Celery's own revoke, without the store cancel (made already by the caller)."""
        return super().revoke(task_id, *args, **kwargs)  # type: ignore[misc]


def skipped_when_eager(delayq: DelayQ) -> bool:
    """Whether a revoke leaves the store alone: in eager mode (``task_always_eager``, as
    ``DelayQ._eager_task`` reads it), when this process never opened the store (each of its
    delayed calls ran at once), so a revoke needs no Redis, as eager calls need none."""
    return bool(delayq.app.conf.task_always_eager) and "store" not in vars(delayq)


def broadcast_revoke(app, task_id: str, **kwargs: Any) -> Any:
    """Celery's revoke broadcast of ``task_id``, without the store cancel of an app that
    opted in (its caller made that already)."""
    control = app.control
    if isinstance(control, _RevokingControl):
        return control.broadcast_revoke(task_id, **kwargs)
    return control.revoke(task_id, **kwargs)


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
            if delayq is not None and not skipped_when_eager(delayq):
                _canceller().put(delayq, task_id)  # the event loop never waits for Redis
            return reply

        Panel.data["revoke"] = revoke
        signals.worker_shutdown.connect(_drain, weak=False)
        signals.task_retry.connect(_retried, weak=False)
        signals.task_postrun.connect(_ran, weak=False)
        _command_wrapped = True


#: Revoke commands a worker process keeps for its canceller thread; past that, one is
#: dropped with a WARNING (the worker's own in-memory revoke of it stands).
CANCEL_QUEUE_SIZE = 10_000


class _Canceller:
    """The store cancels of a worker process's revoke commands, made one command at a time
    by a daemon thread of the process, in the order they came; errors are logged."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[DelayQ, Any]] = queue.Queue(CANCEL_QUEUE_SIZE)
        self.pid = os.getpid()
        threading.Thread(target=self._run, name="delayq-revoke", daemon=True).start()

    def put(self, delayq: DelayQ, task_ids: Any) -> None:
        try:
            self._queue.put_nowait((delayq, task_ids))
        except queue.Full:
            logger.warning("%d revoke commands wait for the delay store already: the store "
                           "keeps the jobs of this one (%s); this worker's own revoke of "
                           "them stands until it restarts", CANCEL_QUEUE_SIZE, task_ids)

    def _run(self) -> None:
        while True:
            delayq, task_ids = self._queue.get()
            try:
                delayq.revoke(task_ids)
            except DelayQError as exc:  # the worker's own revoke stands
                logger.warning("could not cancel revoked tasks in the store: %s", exc)
            except Exception:  # the thread goes on with the next command
                logger.exception("could not cancel revoked tasks in the store")
            finally:
                self._queue.task_done()

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the commands not applied yet; say how many
        are left (they go with the process: the store keeps their jobs)."""
        deadline = time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks and time.monotonic() < deadline:
                done.wait(deadline - time.monotonic())
            left = self._queue.unfinished_tasks
        if left:
            logger.warning("%s not applied to the delay store as this worker stops (its "
                           "Redis did not answer within %gs): the store keeps their jobs; "
                           "revoke them again once it answers",
                           counted(left, "revoke command"), timeout)


#: How long a stopping worker waits for the revoke commands its canceller has not applied.
DRAIN_SECONDS = 5.0


def _drain(**_: Any) -> None:
    """At a worker's shutdown: let this process's canceller finish, for a moment."""
    canceller = _the_canceller
    if canceller is not None and canceller.pid == os.getpid():
        canceller.drain(DRAIN_SECONDS)


_canceller_lock = threading.Lock()
_the_canceller: _Canceller | None = None


def _canceller() -> _Canceller:
    """This process's canceller (a forked child starts its own: threads do not fork)."""
    global _the_canceller
    with _canceller_lock:
        if _the_canceller is None or _the_canceller.pid != os.getpid():
            _the_canceller = _Canceller()
        return _the_canceller
