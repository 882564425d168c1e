"""``DelayQ``: the celery-delayq extension of one Celery app and its public API."""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from celery import Celery, signals
from celery.utils.time import maybe_make_aware

from . import journal, revoke, validation
from .conf import PASSWORD_SHOWN, DelayQConfig, password_shown
from .decoding import decode_arguments, split
from .envelope import (
    HEADER_DUE,
    HEADER_JOB,
    HEADER_SHARD,
    SEND_TASK_IGNORE_RESULT,
    Call,
    Template,
    Templates,
    routes_depend_on_arguments,
    template,
)
from .errors import (
    ConfigurationError,
    DelayQError,
    InvalidOption,
    JobExists,
    PayloadError,
    StoreUnavailable,
    UnsupportedMessage,
)
from .holding import Holding
from .job import Job
from .keys import Keyspace
from .publishing import Publishing, Sent
from .reading import datetime_of_ms, shown, utc_of_ms
from .result import DelayedResult, EagerDelayedResult
from .store import CancelOutcome, ScheduleCode, Scheduled, Store
from .validation import Due

_ATTR = "_delayq"
_create_lock = threading.Lock()
logger = logging.getLogger("celery_delayq")
#: True while a retry the store refused is sent natively: ``send_task`` skips the store.
_SENT_NATIVELY: ContextVar[bool] = ContextVar("delayq_sent_natively", default=False)


@contextlib.contextmanager
def sending_natively() -> Iterator[None]:
    """Within it, the app's ``send_task`` sends delayed calls as Celery does, not to the
    store (a call :meth:`DelayQ.native_fallback` lets through ``Task.apply_async``)."""
    token = _SENT_NATIVELY.set(True)
    try:
        yield
    finally:
        _SENT_NATIVELY.reset(token)


Interceptor = Callable[["DelayQ", Call, Due, str], "DelayedResult | None"]

#: The store's refusals of a call Celery's own path may still send: a store that is away or
#: full, and a call it cannot hold (not JSON: an app on pickle; too large; task_protocol=1).
#: Not a setting the store refuses (ConfigurationError: said at the worker's start), nor a
#: queue named like a store key (InvalidOption: its list would be the key).
NOT_STORED = (StoreUnavailable, PayloadError, UnsupportedMessage)


#: ``Celery.send_task``'s parameters after ``eta``, in its order (5.3 has all but the last).
_SEND_TASK_AFTER_ETA = (
    "task_id", "producer", "connection", "router", "result_cls", "expires", "publisher",
    "link", "link_error", "add_to_parent", "group_id", "group_index", "retries", "chord",
    "reply_to", "time_limit", "soft_time_limit", "root_id", "parent_id", "route_name",
    "shadow", "chain", "task_type", "replaced_task_nesting")
#: Whether ``Celery.send_task`` gives a call of a task registered in the process that
#: task's options (queue, priority, time limits, ...) under the call's own: Celery 5.7, whose
#: ``time_limit`` default is a marker of its own (a None given clears the task's).
_SEND_TASK_MERGES = inspect.signature(Celery.send_task).parameters["time_limit"].default \
    is not None


@dataclass(frozen=True)
class _OptedIn:
    """What ``DelayQ(app)`` changed on the app, for :meth:`DelayQ._opt_out` to put back."""

    send_task: Callable[..., Any] | None  # the app's own, set on it before it opted in
    routed: Callable[..., Any]  # the one opting in set (DelayQ._route_send_task)
    control: revoke.Installed
    http_task: bool  # opting in registers celery_delayq.http_callback (not there before)


class DelayQ(Holding):
    """The delay store of a Celery app: schedule, inspect, cancel and re-time jobs.

    Create one per app (``DelayQ(app)``); later code reaches it as ``DelayQ.of(app)``.
    Pausing and rate limits are :class:`~celery_delayq.holding.Holding`'s methods.
    """

    app: Celery
    _interceptors: list[Interceptor]
    _clock: Callable[[Due], Due] | None
    _opted_in: _OptedIn
    #: ``DelayQ(app)`` calls so far (``of`` makes one only when there is none yet)
    _calls: int = 0

    def __new__(cls, app: Celery) -> DelayQ:
        with _create_lock:
            existing = getattr(app, _ATTR, None)
            if existing is not None:
                existing._calls += 1
            else:
                existing = super().__new__(cls)
                existing.app = app
                existing._interceptors = []
                existing._clock = None
                setattr(app, _ATTR, existing)
                own = vars(app).get("send_task")
                routed = existing._route_send_task(own)
                journal.connect(cls.lookup)
                signals.worker_ready.connect(_check_at_worker_start, weak=False,
                                             dispatch_uid=_check_at_worker_start.__qualname__)
                control = revoke.install(existing)
                from . import http  # imports this module: here, not at the top

                existing._opted_in = _OptedIn(own, routed, control,
                                              http_task=http.TASK_NAME not in app._tasks)
                existing._calls = 1
                http.register(app)  # opted in: the app gets the HTTP callback task
            return existing

    def __init__(self, app: Celery) -> None:
        """One DelayQ per app: calling ``DelayQ(app)`` again returns the same object."""

    def __reduce__(self) -> tuple:  # unpickled as the DelayQ of the unpickled app
        return DelayQ, (self.app,)

    @classmethod
    def of(cls, app: Celery) -> DelayQ:
        """The app's DelayQ, created on first use."""
        return getattr(app, _ATTR, None) or cls(app)  # no lock once it exists (hot path)

    @classmethod
    def lookup(cls, app: Celery) -> DelayQ | None:
        """The app's DelayQ if one was created, without creating it."""
        return getattr(app, _ATTR, None)

    @classmethod
    def _opt_out(cls, app: Celery) -> None:
        """Undo ``DelayQ(app)``: the app's DelayQ is dropped and what opting in changed on
        the app is put back, for a test that opted an app in only while it ran
        (``DelayQTester``). The ``send_task`` set on the app before is back (none: the
        class's again, unless another wrapper was set over ours since), so is its control
        class (:func:`revoke.uninstall`), and the HTTP callback task goes if opting in
        registered it. The process-wide hooks stay: journal's signal handlers, the worker's
        revoke command wrapper and the ``worker_ready`` check serve every app and act only
        for apps that opted in. The dropped DelayQ's store is left open to its caller."""
        with _create_lock:
            delayq = getattr(app, _ATTR, None)
            if delayq is None:
                return
            done = delayq._opted_in
            if vars(app).get("send_task") is done.routed:
                if done.send_task is None:
                    del app.send_task
                else:
                    app.send_task = done.send_task
            revoke.uninstall(app, done.control)
            if done.http_task:
                from . import http

                http.unregister(app)
            delattr(app, _ATTR)

    @cached_property
    def config(self) -> DelayQConfig:
        """Settings, read from ``app.conf`` on first use (after the app is configured)."""
        return DelayQConfig.from_app(self.app)

    @cached_property
    def store(self) -> Store:
        return Store(self.config)

    @cached_property
    def _templates(self) -> Templates:
        # (the store's names, without the store: eager calls open none, see revoke.py)
        return Templates(self.app, Keyspace(self.config.prefix, self.config.shards))

    @cached_property
    def _publishing(self) -> Publishing:
        return Publishing(self)

    # -- scheduling --------------------------------------------------------------------

    def schedule(self, name: str, args=None, kwargs=None, *,
                 delay: float | timedelta | None = None, eta: datetime | None = None,
                 key: str | None = None, job_id: str | None = None, if_exists: str = "keep",
                 task_type=None, **options: Any) -> DelayedResult:
        """Park a call of task ``name`` until it is due; see ``DelayedTask.apply_delayed``."""
        validation.if_exists(if_exists)
        call, due = self._prepare(name, args, kwargs, delay, eta, key, job_id, task_type,
                                  options)
        eager = self._eager_task(call, task_type)
        if eager is not None:
            return self._run_eagerly(eager, call, due, options)
        if (options.get("headers") or {}).get(HEADER_JOB) == call.job_id:  # a retry of
            journal.settle(call.job_id)  # the running job: its started event first
        sent: Sent | None = None
        if self._publishing.wanted():
            call, sent = self._publishing.before(call, due)
        retry = self._running(call.task_id) is not None  # the running task's own call
        superseded = False
        for interceptor in self._interceptors:
            result = interceptor(self, call, due, if_exists)
            if result is not None:
                break
        else:  # a retry replaces its own stored call, not a newer one of its job id
            mode = "retry" if retry and if_exists == "replace" else if_exists
            [scheduled] = self.store.schedule([(call, due)], mode)
            result = self._result_of(call, scheduled)
            superseded = mode == "retry" and scheduled.code is ScheduleCode.KEPT
        if superseded:
            revoke.retry_superseded(call, result.id)
        elif retry:
            revoke.drop_retry_if_revoked(self, call)
        if sent is not None:
            self._publishing.after(call, sent)
        return self._as_sent(result, call, task_type)

    def schedule_many(self, name: str, items: Iterable[Mapping[str, Any]], *,
                      if_exists: str = "keep", task_type=None,
                      **options: Any) -> list[DelayedResult]:
        """Park many calls of task ``name`` in one round trip per shard batch.

        Each item is a mapping with ``args``, ``kwargs``, ``delay`` or ``eta``, ``key``,
        ``job_id`` and ``shadow`` (the name worker logs show for that call; all optional but
        the due time); ``options`` apply to every call. Every
        item is validated before anything is written. Publish signals and ``task-sent``
        events fire for each call once all are validated, before the batch is written.
        """
        validation.if_exists(if_exists)
        if if_exists == "error":
            raise InvalidOption("schedule_many takes if_exists='keep' or 'replace', not 'error'")
        shared = None if routes_depend_on_arguments(self.app) else template(
            self.app, name, options, self._templates.keys, task_type=task_type)  # once a batch
        prepared = []
        for n, item in enumerate(validation.batch(items)):
            item = validation.batch_item(n, item)
            shadow = item.get("shadow")  # a template of its own (cached per name)
            prepared.append(self._prepare(
                name, item.get("args"), item.get("kwargs"), item.get("delay"), item.get("eta"),
                item.get("key"), item.get("job_id"), task_type,
                options if shadow is None else {**options, "shadow": shadow},
                shared if shadow is None else None))
        eager = self._eager_task(prepared[0][0], task_type) if prepared else None
        if eager is not None:
            return [self._run_eagerly(eager, call, due, options) for call, due in prepared]
        if self._publishing.wanted():  # paired per call, as apply_async calls fire them
            for n, (call, due) in enumerate(prepared):
                announced, sent = self._publishing.before(call, due)
                self._publishing.after(announced, sent)
                prepared[n] = announced, due
        results: list[DelayedResult | None] = [None] * len(prepared)
        direct = []
        for n, (call, due) in enumerate(prepared):
            for interceptor in self._interceptors:
                results[n] = interceptor(self, call, due, if_exists)
                if results[n] is not None:
                    break
            else:
                direct.append(n)
        submitted = self.submit([prepared[n] for n in direct], if_exists)
        for n, result in zip(direct, submitted, strict=True):
            results[n] = result
        return [self._as_sent(result, call, task_type)  # type: ignore[arg-type]
                for result, (call, _) in zip(results, prepared, strict=True)]

    def _as_sent(self, result: DelayedResult, call: Call, task_type) -> DelayedResult:
        """``result`` as ``send_task`` leaves the result it returns: ``ignored`` when the
        call's result is not stored, reading the task's own backend (``Task.AsyncResult``),
        one of the running task's children when called from one (``add_to_parent``)."""
        result.ignored = call.ignored
        if task_type is not None:
            result.backend = task_type.backend
        if call.parent is not None:
            call.parent.add_trail(result)
        return result

    def _prepare(self, name, args, kwargs, delay, eta, key, job_id, task_type, options,
                 shared: Template | None = None) -> tuple[Call, Due]:
        config = self.config
        validation.no_countdown(options)
        due = validation.due(delay, eta, config.max_delay)
        if self._clock is not None:
            due = self._clock(due)
            options = self._expiry_on(self._clock, options)
        if job_id is not None:
            validation.identifier(job_id, "job_id", config.max_id_length)
        if key is not None:
            validation.identifier(key, "key", config.max_id_length)
        if options.get("task_id") is not None:
            validation.identifier(options["task_id"], "task_id", config.max_id_length)
        if shared is None:
            shared = self._templates.get(name, options, task_type, args, kwargs)
        for carried, given, what in ((shared.job_id, job_id, "job_id"), (shared.key, key, "key")):
            if carried is not None and not given:  # from a retried task's headers
                validation.identifier(carried, what, config.max_id_length)
        call = shared.call(args, kwargs, job_id=job_id, key=key,
                           max_payload_bytes=config.max_payload_bytes,
                           max_nesting=config.max_nesting)
        validation.arguments(task_type, args, kwargs)  # once they are known to be JSON
        return call, due

    def _expiry_on(self, clock: Callable[[Due], Due], options: dict[str, Any]
                   ) -> dict[str, Any]:
        """``options`` with a relative ``expires`` counted from ``clock``, as a delay is
        (one past ``delayq_max_delay`` is left for the envelope's check)."""
        seconds = options.get("expires")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not abs(seconds) <= self.config.max_delay:
            return options
        moved = clock(Due(at_ms=None, delay_ms=round(seconds * 1000)))
        if moved.at_ms is None:  # the clock was not moved
            return options
        return {**options, "expires": utc_of_ms(moved.at_ms)}

    def _eager_task(self, call: Call, task_type):
        """With ``task_always_eager``, the task to run ``call`` now, as ``apply_async``
        would; None otherwise, or when the task is not registered here (Celery's
        ``send_task`` ignores eager mode too)."""
        if not self.app.conf.task_always_eager:
            return None
        return task_type if task_type is not None else self.app.tasks.get(call.task)

    def _run_eagerly(self, task, call: Call, due: Due, options: dict[str, Any]
                     ) -> EagerDelayedResult:
        """Run a validated call now, with the arguments a worker would decode; no Redis."""
        args, kwargs = decode_arguments(*split(call.envelope)[1:])
        ran = task.apply(args, kwargs, task_id=call.task_id,
                         **{k: v for k, v in options.items() if k != "task_id"})
        return EagerDelayedResult(*ran.__reduce_args__(), job_id=call.job_id,
                                  eta=utc_of_ms(due.absolute_ms(time.time() * 1000)),
                                  key=call.key)

    def set_clock(self, clock: Callable[[Due], Due] | None) -> None:
        """Let ``clock`` adjust every call's due time before anything else sees it.

        The pytest plugin's test clock uses it to count relative delays from a moved clock;
        ``None`` removes it.
        """
        self._clock = clock

    def add_interceptor(self, interceptor: Interceptor) -> None:
        """Let ``interceptor(delayq, call, due, if_exists)`` take over validated calls.

        It returns a :class:`DelayedResult` when it took the call (and will ``submit``
        it later, e.g. on transaction commit), or None to let the store write it now.
        The Django app uses this for transactional scheduling.
        """
        self._interceptors.append(interceptor)

    def submit(self, items: list[tuple[Call, Due]], if_exists: str) -> list[DelayedResult]:
        """Write validated calls to the store now; raises JobExists on a conflict."""
        return [self._result_of(call, scheduled) for (call, _), scheduled
                in zip(items, self.store.schedule(items, if_exists), strict=True)]

    def _result_of(self, call: Call, scheduled: Scheduled) -> DelayedResult:
        """The result of a call the store answered ``scheduled`` (the kept job's call when
        it kept one); JobExists on a conflict."""
        if scheduled.code is ScheduleCode.CONFLICT:
            raise JobExists(call.job_id)
        task_id = call.task_id
        if scheduled.code is ScheduleCode.KEPT:
            task_id = Job.read(call.job_id, scheduled.existing, None, "", 0).task_id
        due_at = None if scheduled.due_ms is None else utc_of_ms(scheduled.due_ms)
        return DelayedResult(task_id, call.job_id, due_at, self, key=call.key)

    def store_delay(self, countdown: float | None,
                    eta: datetime | str | None) -> dict[str, Any] | None:
        """``{"delay": s}`` or ``{"eta": dt}`` when a Celery-style countdown/eta should go
        through the store (longer than ``delayq_countdown_threshold``, and not in eager
        mode: Celery's own path runs the task at once), else None."""
        if (countdown is None and eta is None) or self.app.conf.task_always_eager:
            return None
        threshold = self.config.countdown_threshold
        if countdown:  # Celery's order: a countdown becomes the eta, replacing one given
            return {"delay": countdown} if countdown > threshold else None
        if eta is not None:
            # a naive eta by Celery's rules
            at: datetime = maybe_make_aware(validation.celery_eta(eta), self.app.timezone)
            seconds = at.timestamp() - self.app.now().timestamp()  # not wall clocks
            return {"eta": at} if seconds > threshold else None
        return None

    def _route_send_task(self, own: Callable[..., Any] | None) -> Callable[..., Any]:
        """Send ``app.send_task(..., countdown=|eta=)`` through the store too.

        This covers plain tasks, tasks not registered in this process and signatures,
        which never reach ``DelayedTask.apply_async`` (``delayq_route_send_task``). Other
        calls go on unchanged to a ``send_task`` set on the app before it opted in, else to
        its class's as it is at the call (``sentry_sdk.init`` may patch ``Celery``'s later).
        ``own``: the app's own ``send_task``, None when it has none; returns the wrapper.
        """
        app = self.app
        named = _SEND_TASK_AFTER_ETA

        def native(name, args, kwargs, countdown, eta, *more, **options):
            if own is not None:
                return own(name, args, kwargs, countdown, eta, *more, **options)
            return type(app).send_task(app, name, args, kwargs, countdown, eta, *more,
                                       **options)

        def send_task_via_store(name, args=None, kwargs=None, countdown=None, eta=None,
                                *more, **options):
            delay = None
            if (countdown is not None or eta is not None) and self.config.route_send_task \
                    and not _SENT_NATIVELY.get():
                delay = self.store_delay(countdown, eta)  # settings read only for a delay
            if delay is None:
                return native(name, args, kwargs, countdown, eta, *more, **options)
            if len(more) > len(named):
                raise TypeError(f"send_task() takes {5 + len(named)} positional arguments "
                                f"but {5 + len(more)} were given")
            options = {**dict(zip(named, more, strict=False)), **options}
            if options.get("task_type") is None:
                options = {**self._registered_options(name), **options}
            options.setdefault("ignore_result", SEND_TASK_IGNORE_RESULT)
            try:
                return self.schedule(name, args, kwargs, if_exists="replace", **delay,
                                     **options)
            except NOT_STORED as exc:
                fallback = self.native_fallback(name, options.get("task_id"), exc, options)
                if fallback is None:
                    raise
            return native(name, args, kwargs, countdown, eta, **fallback)

        app.send_task = send_task_via_store
        return send_task_via_store

    def native_fallback(self, name: str, task_id: str | None, exc: DelayQError,
                        options: dict[str, Any]) -> dict[str, Any] | None:
        """The ``options`` to send a countdown call of task ``name`` that the store refused
        with ``exc`` (one of :data:`NOT_STORED`) as Celery sends it natively, when a task a
        worker runs makes it (said in a WARNING); else None: a producer outside a worker
        gets the error.

        A running task's own retry: Celery turns the refusal into ``Reject(requeue=False)``,
        which acknowledges the running message, ``acks_late`` too: the task would be lost,
        where natively a broker that refuses the retry refuses that acknowledgement too.
        Another call (a chain's next step, a ``link`` callback, a call in the task's body):
        the worker sends chain steps and callbacks once the body has returned, and their
        error marked the task FAILURE and lost the rest of the chain. Sent natively, the
        call waits in a worker's memory, neither listed nor cancellable in the store (a
        refusal that came after the store wrote it, its reply lost, leaves both: the task
        runs twice); a retry keeps the job's id and key headers, so its run is journaled."""
        current = self.app.current_worker_task
        if current is None or current.request.is_eager:  # (``apply()``: not a worker)
            return None
        call = "retry" if self._running(task_id) is not None else "delayed call"
        logger.warning("the %s of %s[%s] made by %s[%s] is sent as Celery sends it natively "
                       "(it waits in a worker's memory, not in the store): %s", call, name,
                       task_id or "a new task id", current.name, shown(str(current.request.id)),
                       exc)
        headers = options.get("headers")
        if headers:  # the stored call's due time and shard are not this message's
            options = {**options, "headers": {header: value for header, value in headers.items()
                                              if header not in (HEADER_DUE, HEADER_SHARD)}}
        return options

    def _running(self, task_id: str | None) -> Any:
        """The task this worker process is running when its id is ``task_id`` (a call of
        it is its own retry), else None."""
        current = self.app.current_worker_task
        if current is None or task_id is None or task_id != current.request.id:
            return None
        return current

    def _registered_options(self, name: str) -> dict[str, Any]:
        """The options of the task registered here as ``name`` that Celery's ``send_task``
        gives a call of it by name (none before Celery 5.7)."""
        task = self.app._tasks.get(name) if _SEND_TASK_MERGES else None
        if task is None or not hasattr(task, "_get_exec_options"):
            return {}
        return {k: v for k, v in task._get_exec_options().items() if v is not None}

    # -- managing ----------------------------------------------------------------------

    def cancel(self, job_id: str, key: str | None = None) -> bool:
        """True if the job was pending and is now cancelled; False if promoted or unknown.

        It cancels the job of that id whichever call it holds (a call that replaced an
        earlier one too). A cancelled job's result is REVOKED, as a revoked task's.
        """
        return self.cancel_outcome(job_id, key) is CancelOutcome.CANCELLED

    def cancel_outcome(self, job_id: str, key: str | None = None, by: str = "",
                       task_id: str | None = None, backend: Any = None) -> CancelOutcome:
        """Like :meth:`cancel`, telling "too late" apart from "unknown"; ``by`` is journaled.
        ``key``, when given, is checked as a key (the job is looked for on every shard).

        The task id of the call the cancelled job held is marked REVOKED in ``backend``,
        else its task's; so is ``task_id`` (the caller's call, e.g. a result's) when it is
        another: a call replaced under the same job id. A backend that cannot take it
        (away) does not undo the cancel: the outcome stands, and a WARNING says the job is
        cancelled but its result not marked.
        """
        validation.looked_up(job_id, key)
        outcome, cancelled_task, task = self.store.cancel(job_id, by)
        if outcome is CancelOutcome.CANCELLED:
            marking = revoke.Marking(self.app)
            marking.mark_calls((cancelled_task, task_id), task, backend)
            marking.report()
        return outcome

    def revoke(self, task_ids: str | Iterable[str]) -> int:
        """Cancel the stored jobs of this Celery task id or these, as ``app.control.revoke``
        does (see :mod:`celery_delayq.revoke`); returns how many were cancelled.

        Every id is cancelled first, then the results of those cancelled are marked
        REVOKED (also that of the call a job held when it is another: one that replaced
        the revoked call under its job id): a result backend that cannot take that stops
        no cancel (a WARNING names the jobs cancelled but not marked)."""
        ids = validation.task_ids(task_ids)
        revoke.remember(self, ids)
        cancelled = []
        for task_id in ids:
            outcome, held, task = self.store.cancel_task(task_id, by="revoke")
            if outcome is CancelOutcome.CANCELLED:
                cancelled.append(((held, task_id), task))
        marking = revoke.Marking(self.app)
        try:
            for calls, task in cancelled:
                marking.mark_calls(calls, task)
        finally:
            marking.report()
        return len(cancelled)

    def cancel_key(self, key: str, by: str = "",
                   progress: Callable[[int], object] | None = None) -> int:
        """Cancel every pending job with this business key (their results REVOKED);
        returns how many. It goes chunk by chunk, each chunk's results marked as it is
        cancelled, ``progress`` told the running count after each: stopped part way, what
        it cancelled is REVOKED and a second call cancels the rest. A result backend that
        cannot take the marks stops no cancel (a WARNING names the jobs not marked)."""
        validation.looked_up_key(key)
        done = 0
        marking = revoke.Marking(self.app)
        try:
            for chunk in self.store.cancel_key_chunks(key, by):
                try:
                    for task_id, task in chunk:
                        marking.mark(task_id, task)
                finally:  # told when Ctrl-C stops it too: the count stays exact
                    done += len(chunk)
                    if progress is not None:
                        progress(done)
        finally:
            marking.report()
        return done

    def get(self, job_id: str, key: str | None = None) -> Job | None:
        validation.looked_up(job_id, key)
        return self.store.get(job_id, key)

    def pending(self, task: str | None = None, key: str | None = None,
                args_contains: Any = None, limit: int = 100) -> list[Job]:
        """Pending jobs in due order: of one task, one business key, and/or called with
        ``args_contains`` as one of their argument values (``42`` finds ``close(42)`` and
        ``close(order=42)``; a value is compared whole, as JSON: ``1`` is not ``true``).
        Searching by arguments reads the store from its earliest job until ``limit`` match.
        """
        validation.listing(task, key, limit)
        contains = (None if args_contains is None
                    else validation.json_value(args_contains, "args_contains"))
        return self.store.pending(task=task, key=key, limit=limit, args_contains=contains)

    def reschedule(self, job_id: str, *, delay: float | timedelta | None = None,
                   eta: datetime | None = None, key: str | None = None) -> datetime | None:
        """Give a pending job a new due time; None if it is no longer pending."""
        due = validation.due(delay, eta, self.config.max_delay)
        validation.looked_up(job_id, key)
        due_ms = self.store.reschedule(job_id, due, key)
        return datetime_of_ms(due_ms)

    def run_now(self, job_id: str, key: str | None = None) -> bool:
        """Make a pending job due now; False if it is no longer pending."""
        return self.reschedule(job_id, delay=0, key=key) is not None


def _check_at_worker_start(sender: Any = None, **_: Any) -> None:
    """``worker_ready``: a worker of an app with a DelayQ says at its start what the carrier
    says at its own: a password in ``delayq_redis_url`` (the worker answers ``celery inspect
    conf`` to any broker client), settings the store refuses, which would fail its tasks'
    retries (Celery drops a retry it cannot send) and delayed calls, and a serializer or
    message protocol whose calls the store cannot keep. The store is read in a thread of
    its own: a Redis that is away does not hold the worker's start."""
    app = getattr(sender, "app", None)
    delayq = DelayQ.lookup(app) if app is not None else None
    if delayq is None:
        return
    if password_shown(app):
        logger.warning(PASSWORD_SHOWN)
    conf = delayq.app.conf
    if conf.task_serializer != "json" or conf.task_protocol != 2:
        logger.warning("this app sets task_serializer=%r, task_protocol=%r; the store keeps "
                       "JSON calls of protocol 2 only: the retries and delayed calls of its "
                       "tasks (unless serializer='json') are sent as Celery sends them "
                       "natively, into a worker's memory", conf.task_serializer,
                       conf.task_protocol)
    threading.Thread(target=_check_store, args=(delayq,), name="delayq-start-check",
                     daemon=True).start()


def _check_store(delayq: DelayQ) -> None:
    """Read the settings and the store's record as a first call would; log what fails."""
    try:
        delayq.store.client  # noqa: B018 (connects, and checks the store's shard count)
    except ConfigurationError as exc:
        logger.error("this worker cannot use the delay store: %s. Its tasks' retries and "
                     "delayed calls will fail (Celery drops a retry it cannot send): fix "
                     "the setting and restart the worker", exc)
    except StoreUnavailable as exc:
        logger.warning("the delay store cannot be reached at this worker's start (its "
                       "delayed calls and retries fail until it can): %s", exc)
