"""Worker-side journal events: started, succeeded, failed, retried, ignored, revoked for
delayed tasks.

The store's scripts journal scheduled / rescheduled / cancelled / promoted / dead
themselves; a worker adds what happens to a promoted task through Celery's signals,
recognising it by the ``delayq_job`` header the carrier sets. Events wait in a
per-process outbox that a thread writes in one pipeline, so they cost the task no Redis
round trip of its own: outcomes within 50 ms, ``started`` within 10 ms while the task runs,
so a worker killed mid-task leaves it in the journal (unless killed in those first
milliseconds). The thread writes whatever has gathered by then in one pipeline: under a
burst of short tasks, the events of several tasks in one round trip. A task that writes its
own job to the store (a retry) first writes that job's waiting events (:func:`settle`), so
the journal keeps their order. Events a write failed for (the store's Redis away) or Redis
refused while a condition lasts (full; a read-only replica, a failed RDB save: what
``Store.unavailable`` calls ``StoreUnavailable``) are kept for the next one, up to
:data:`_HOLD_AT_MOST`; one Redis refuses for good (a damaged journal key, the ACL) or that
no command can carry goes, said in the log, and the others of its flush are written. A
batch written again whose first write Redis ran (its reply lost: redis-py's resend after a
timeout, or the next write of the events it held) is written once: a store's events of one
write are a batch with a token of its own, which its held events keep, and the store writes
a shard's part of a batch at most once within a resend window
(:meth:`~celery_delayq.store.streams.Streams.journal_many`). Headers come from a message
anyone may publish: an event is journaled without a key, due time or retry count of the
wrong type, and not at all for a job id that is not text. A stopping worker process has
the thread write what waits and waits for it once, at most one resend window of the
store's Redis (:meth:`_Outbox.stop`); a WARNING counts the events that go with the process.

Outcomes come from ``task_postrun``, but for those Celery reports with ``task_failure``
only, from the worker's main process after the run (a hard time limit, a lost worker
process, ``Reject(requeue=False)``): those are ``failed``, the job's headers read from the
``Request`` the worker received (``task_received``). A run that ends so in ``task_postrun``
(a ``Reject``) first writes its own waiting events, so its ``started`` precedes that
``failed``. ``Ignore`` is ``ignored``; a
``DelayedTask`` that calls ``replace`` hands its job to the replacement instead
(:func:`hand_over`), whose outcome ends it. A run the worker's main process discards or
stops (revoked while it waited, expired, terminated: Celery's ``task_revoked``) is
``revoked``, with the ``reason``; a ``task_failure`` Celery may send after it for the same
run (a process lost to the terminating signal) journals nothing more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import reprlib
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any, cast

import redis
from celery import signals
from celery import states as celery_states

from .connection import resend_window_ms
from .envelope import (
    DELAYQ_HEADERS,
    HEADER_DUE,
    HEADER_HANDED,
    HEADER_JOB,
    HEADER_KEY,
    HEADER_SHARD,
)
from .errors import DelayQError, StoreFull, StoreUnavailable
from .events import Event
from .reading import counted, shown
from .store.streams import JournalEntry, batch_token

logger = logging.getLogger("celery_delayq.journal")

_OUTCOMES = {
    celery_states.SUCCESS: Event.SUCCEEDED,
    celery_states.FAILURE: Event.FAILED,
    celery_states.RETRY: Event.RETRIED,
    celery_states.IGNORED: Event.IGNORED,
}
_FLUSH_EVERY = 0.05  # longest an event waits in the outbox, seconds
_GATHER = 0.01  # how long a started event waits for others to share its round trip
_FLUSH_AT = 200  # events that make the outbox flush at once
_HOLD_AT_MOST = 10_000  # events kept while the store's Redis does not take them (oldest go)
_connected = threading.Event()
#: An app's DelayQ, or None when it has none (``DelayQ.lookup``, given to :func:`connect`).
_delayq_of: Callable[[Any], Any] | None = None
#: The worker's requests of delayed jobs by task id, while the worker holds them: a
#: ``task_failure`` sent by the main process finds the job's headers there.
_received: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: Marks on a run's request (its ``Context``): postrun journals its outcome; its job went
#: to a replacement.
_RUNNING, _HANDED_OVER = "_delayq_running", "_delayq_handed_over"
#: Mark on a run's request: its job id header is no text, which was said once.
_UNREADABLE = "_delayq_unreadable_job"
#: An event waiting in the outbox: its store (a DelayQ), the event, and the token of the
#: batch a write that failed sent it in (None before it is sent): sent again with that
#: token, a batch Redis ran meanwhile is not written again (``Streams.journal_many``).
_Waiting = tuple[Any, JournalEntry, str | None]
#: Why events are held, now and once written.
_AWAY = ("does not answer", "did not answer")
_FULL = ("is full", "was full")
_REFUSING = ("refuses writes", "refused writes")  # (a read-only replica, a failed save...)


class _Outbox:
    """Worker events of this process waiting to be written, flushed by a daemon thread."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a child starts its own thread

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards the list of waiting events
        self._wrote = threading.Condition(self._lock)  # notified as each write ends
        self._begun = 0  # writes begun so far
        self._last_held = 0  # the latest write (numbered as begun) that ended holding events
        self._failing: set[Any] = set()  # the stores (DelayQ) the last write held events of
        self._writing = threading.Lock()  # held through a flush: a flush returns only
        # once events another flush took are written too (a test's cleanup comes after)
        self._due = threading.Event()
        self._events: list[_Waiting] = []
        self._taken: list[_Waiting] = []  # those a write is writing
        self._held = 0  # of them, kept after a write that failed (0: the last one worked)
        self._dropped = 0  # the oldest that went meanwhile, past _HOLD_AT_MOST
        self._why = _AWAY  # why they are held
        self._thread: threading.Thread | None = None

    def put(self, delayq, entry: JournalEntry, soon: bool = False) -> None:
        """Queue an event; ``soon`` has it written within ``_GATHER`` instead of at the
        flush thread's next tick (the caller never waits for Redis)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="delayq-journal",
                                                daemon=True)
                self._thread.start()
            self._events.append((delayq, entry, None))
            if soon or len(self._events) >= _FLUSH_AT:
                self._due.set()

    def _run(self) -> None:
        while True:  # nothing may end this thread: later events would never be written
            if self._due.wait(_FLUSH_EVERY):
                time.sleep(_GATHER)  # the events of the next tasks share the round trip
            self._due.clear()
            try:
                with self._writing:
                    self._write()
            except Exception:
                logger.exception("worker events were dropped; the next ones are written "
                                 "as usual")

    def flush(self, **_: Any) -> None:
        """Write every waiting event; the log says how many the store's Redis did not
        take."""
        with self._writing:
            self._write()
        if self._held:
            logger.error("%s not written: the store's Redis %s",
                         counted(self._held, "worker event"), self._why[0])

    def stop(self, **_: Any) -> None:
        """As a worker process stops: have the thread write every waiting event, and wait
        for it once, at most one resend window of the store's Redis (the longest one write
        may take), a write in flight included. The events a write ending meanwhile could
        not write (the store's Redis away, full...), or not written by then, go with the
        process: a WARNING says how many, and why. A write begun after the stop tries every
        waiting event, the stores that failed last (a healthy store's events are not held up
        by another's). (A flush of its own, after the thread's write in flight, waited two
        windows for a Redis that did not answer.)"""
        with self._lock:
            waiting = [delayq for delayq, _, _ in (*self._taken, *self._events)]
            if not waiting:
                return
            wait = max(resend_window_ms(delayq.config) for delayq in set(waiting)) / 1000
            deadline = time.monotonic() + wait
            begun = self._begun  # a write begun after this one tries every waiting event
            self._due.set()  # the thread writes them now
            while (self._taken or self._events) and self._last_held <= begun:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wrote.wait(left)
            left_over = len(self._taken) + len(self._events)
            why = (self._why[0] if self._last_held > begun
                   else f"did not answer within {wait:g}s")
        if left_over:
            logger.warning("%s not written as this worker stops (the store's Redis %s): "
                           "they go with the process, and the journal lacks them",
                           counted(left_over, "worker event"), why)

    def settle(self, job_id: str) -> None:
        """Write now, with the rest, the events of ``job_id`` not written yet (none: return
        at once)."""
        with self._lock:
            waiting = any(entry[2].get("job") == job_id
                          for _, entry, _ in (*self._taken, *self._events))
        if waiting:
            with self._writing:
                self._write()

    def _write(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._taken = events
            self._begun += 1
            this_write = self._begun
        try:
            self._write_taken(events)
        finally:
            with self._lock:
                self._taken = []
                if self._held:
                    self._last_held = this_write
                self._wrote.notify_all()

    def _write_taken(self, events: list[_Waiting]) -> None:
        # A store's new events make one batch; those held keep the batch they were sent in.
        batches: dict[tuple[Any, str | None], list[JournalEntry]] = defaultdict(list)
        for delayq, entry, token in events:
            batches[delayq, token].append(entry)
        unwritten: list[_Waiting] = []
        failure: Exception | None = None
        why = _AWAY
        for (delayq, token), entries in sorted(batches.items(),
                                               key=lambda item: item[0][0] in self._failing):
            token = token or batch_token()
            try:
                refused = [(entry, error, token)
                           for entry, error in delayq.store.journal_many(entries, token)]
            except StoreUnavailable as exc:  # Redis away: written or not, the reply lost
                unwritten += [(delayq, entry, token) for entry in entries]
                failure, why = exc, _why(exc)
                continue
            except DelayQError as exc:  # a refusal for good (the store's record...): they go
                logger.warning("could not journal %s: %s",
                               counted(len(entries), "worker event"), exc)
                continue
            except Exception:  # not Redis's doing (a fault of the client, or of one entry)
                refused, held = _one_by_one(delayq, entries)
                if held:
                    unwritten += held[1]
                    failure, why = held[0], _why(held[0])
            damaged = []
            for entry, error, sent_in in refused:
                if isinstance(error, StoreUnavailable):  # passes: full, read-only for now...
                    unwritten.append((delayq, entry, sent_in))
                    failure, why = error, _why(error)
                elif isinstance(error, (DelayQError, redis.ResponseError)):
                    damaged.append(error)  # e.g. a damaged journal key: writing them again
                    # would not help
                else:  # this one event cannot be written: it goes, said once
                    _, event, fields = entry
                    logger.warning("could not journal the %s event of task %s (job %s): %s",
                                   event, _plain(fields.get("task_id")),
                                   reprlib.repr(fields.get("job")), error)
            if damaged:
                logger.warning("could not journal %s: %s",
                               counted(len(damaged), "worker event"), damaged[0])
        self._failing = {delayq for delayq, _, _ in unwritten}
        if failure is not None:
            self._hold(unwritten, failure, why)
        elif self._held:
            logger.info("wrote %s held while the store's Redis %s",
                        counted(self._held, "worker event"), self._why[1])
            if self._dropped:
                logger.error("dropped %s while the store's Redis %s (more than %d "
                             "waited)", counted(self._dropped, "worker event"),
                             self._why[1], _HOLD_AT_MOST)
            self._held = self._dropped = 0

    def _hold(self, unwritten: list[_Waiting], failure: Exception,
              why: tuple[str, str]) -> None:
        """Keep events a write failed for, ahead of newer ones, for the next write; past
        :data:`_HOLD_AT_MOST` the oldest go."""
        self._why = why
        if not self._held:
            logger.warning("holding worker events until the store's Redis takes them: %s",
                           failure, exc_info=not isinstance(failure, (DelayQError,
                                                                      redis.RedisError)))
        with self._lock:
            self._events[:0] = unwritten
            self._taken = []  # (with them back: a stop counts each event once)
            excess = len(self._events) - _HOLD_AT_MOST
            if excess > 0:
                del self._events[:excess]
                if not self._dropped:  # once an outage: counted when Redis takes events
                    logger.error("dropping the oldest worker events: more than %d wait "
                                 "for the store's Redis", _HOLD_AT_MOST)
                self._dropped += excess
            self._held = len(self._events)


def _why(error: Exception) -> tuple[str, str]:
    """Why events a write failed for with ``error`` (a ``StoreUnavailable``) are held."""
    if isinstance(error, StoreFull):
        return _FULL
    if isinstance(error.__cause__, redis.ResponseError):  # Redis answered: "no, for now"
        return _REFUSING
    return _AWAY


def _one_by_one(delayq, entries: list[JournalEntry]
                ) -> tuple[list[tuple[JournalEntry, Exception, str]],
                           tuple[Exception, list[_Waiting]] | None]:
    """Write ``entries`` one at a time, each a batch of its own, after a write of them all
    failed for a reason not Redis's: those not written, each with why and its batch's
    token, and (the error, the entries from the first one on, to hold) when Redis stopped
    answering meanwhile."""
    refused: list[tuple[JournalEntry, Exception, str]] = []
    for n, entry in enumerate(entries):
        token = batch_token()
        try:
            refused += [(sent, error, token)
                        for sent, error in delayq.store.journal_many([entry], token)]
        except StoreUnavailable as exc:
            return refused, (exc, [(delayq, entry, token),
                                   *((delayq, later, None) for later in entries[n + 1:])])
        except Exception as exc:
            refused.append((entry, exc, token))
    return refused, None


_outbox = _Outbox()


def connect(delayq_of: Callable[[Any], Any]) -> None:
    """Connect the signal handlers once per process (they serve every app); ``delayq_of``
    gives an app's DelayQ, or None for an app that has none."""
    global _delayq_of
    _delayq_of = delayq_of
    if not _connected.is_set():
        signals.task_received.connect(_on_received, weak=False)
        signals.task_prerun.connect(_on_prerun, weak=False)
        signals.task_postrun.connect(_on_postrun, weak=False)
        signals.task_failure.connect(_on_failure, weak=False)
        signals.task_revoked.connect(_on_revoked, weak=False)
        signals.worker_process_shutdown.connect(_outbox.stop, weak=False)
        signals.worker_shutdown.connect(_outbox.stop, weak=False)
        _connected.set()


def flush() -> None:
    """Write the waiting worker events now."""
    _outbox.flush()


def settle(job_id: str) -> None:
    """Write now the events of ``job_id`` that wait in this process's outbox, before the
    caller writes that job to the store: a task retrying itself, so its ``started``
    precedes the retry's ``scheduled``."""
    _outbox.settle(job_id)


def hand_over(request, replacement) -> None:
    """Give the running job of ``request`` to ``replacement``, a signature ``Task.replace``
    froze with its task id: the part that takes that id carries the job's headers, so its
    outcome ends the job, and the replaced run journals none (a group, which takes no
    task id of its own, gets nothing: the run is ``ignored``)."""
    if request.get(HEADER_JOB) is None or request.is_eager:
        return
    successor = _taking(replacement, request.id)
    if successor is None:
        return
    headers = {name: request.get(name) for name in DELAYQ_HEADERS
               if request.get(name) is not None}
    headers[HEADER_HANDED] = request.id  # the task id the job goes on under
    successor.set(headers={**(successor.options.get("headers") or {}), **headers})
    setattr(request, _HANDED_OVER, True)


def _taking(signature, task_id: str):
    """The part of ``signature`` that runs under ``task_id``: the signature itself, or the
    last task of a chain or the body of a chord that does; None if none does."""
    if signature.subtask_type == "chain":
        parts = reversed(signature.tasks)
    elif signature.subtask_type == "chord":
        parts = iter([signature.body])
    elif signature.subtask_type is None:
        return signature if signature.id == task_id else None
    else:
        return None
    return next((found for part in parts if (found := _taking(part, task_id)) is not None),
                None)


def _on_received(sender=None, request=None, **_) -> None:
    if request.request_dict.get(HEADER_JOB) is not None:
        _received[request.id] = request


def _on_prerun(sender=None, task_id=None, task=None, **_) -> None:
    if _record(task, task_id, Event.STARTED, task.request):
        setattr(task.request, _RUNNING, True)


def _on_postrun(sender=None, task_id=None, task=None, state=None, **_) -> None:
    if state == celery_states.IGNORED and task.request.get(_HANDED_OVER):
        return  # replaced: the replacement's outcome ends the job
    event = _OUTCOMES.get(state)
    if event:
        _record(task, task_id, event, task.request)
    elif (job_id := task.request.get(HEADER_JOB)) is not None:
        # Its outcome comes from the worker's main process (a Reject): the run's events
        # must be in the journal before this process hands the run back.
        _outbox.settle(job_id)


def _on_failure(sender=None, task_id=None, **_) -> None:
    """A failure the worker's main process reports (time limit, lost process, Reject),
    once (a time limit reports two); one sent during the run is journaled by postrun."""
    if sender.request.get(_RUNNING):
        return
    request = _received.pop(task_id, None)
    if request is not None:
        _record(sender, task_id, Event.FAILED, request.request_dict)


def _on_revoked(sender=None, request=None, terminated=False, expired=False, **_) -> None:
    """A run the worker's main process discarded (revoked or expired before it ran) or
    stopped (terminated): ``request`` is its ``Context``. Its request is forgotten, so a
    ``task_failure`` of the same run (the terminated process reported lost) adds none."""
    task_id = request.get("id") if request is not None else None
    if isinstance(task_id, str):  # (a message's header: anyone may publish one)
        _received.pop(task_id, None)
    reason = "terminated" if terminated else "expired" if expired else "revoked"
    _record(sender, task_id, Event.REVOKED, request, reason=reason)


def _record(task, task_id: str | None, event: Event, request, **more: str) -> bool:
    """Queue ``event`` for the job whose headers ``request`` holds (a task's request or a
    worker request's dict, read with ``get``); whether it was queued. Headers come from a
    message anyone may publish: a job id that is not text skips the event (said once a
    run), a key, due time or retry count of the wrong type is left out. ``more``: fields
    of this event (a revoke's ``reason``)."""
    job_id = request.get(HEADER_JOB) if request is not None else None
    if job_id is None:
        return False
    delayq = _delayq_of(task.app) if _delayq_of is not None else None
    if delayq is None or not delayq.config.worker_events:
        return False
    if not _text(job_id):
        if not request.get(_UNREADABLE):  # once a run: its outcome would say it again
            logger.warning("task %s has a %s header that is no job id (of type %s); %s not "
                           "journaled", _plain(task_id), HEADER_JOB, type(job_id).__name__,
                           event)
            with contextlib.suppress(AttributeError):  # (a worker request's dict: once)
                setattr(request, _UNREADABLE, True)
        return False
    shard = _shard_number(request.get(HEADER_SHARD), delayq.store.keys.shards)
    if shard is None:  # (a message of another store, or made by hand)
        logger.warning("delayed job %s has no valid %s header; %s not journaled",
                       shown(job_id), HEADER_SHARD, event)
        return False
    retries = request.get("retries")
    record_event(delayq, shard, event, {
        "job": job_id, "task": task.name, "key": _plain(request.get(HEADER_KEY)),
        "task_id": _plain(task_id),
        "retries": retries if type(retries) is int else 0,  # (not a bool)
        "due": _plain(request.get(HEADER_DUE)), **more,
    })
    return True


def _text(value: Any) -> bool:
    """Whether ``value`` is text Redis takes (a str that is UTF-8: no lone surrogate)."""
    if not isinstance(value, str):
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _plain(value: Any) -> str | int | float:
    """A header's value as a journal field: text or a number as it is, else ""."""
    if type(value) in (int, float) or _text(value):
        return cast("str | int | float", value)
    return ""


def _shard_number(header: Any, shards: int) -> int | None:
    """The shard a message's header names, or None when it names none of the store's:
    one such event must not fail the write of the others in its flush."""
    try:
        shard = int(header)
    except (TypeError, ValueError):
        return None
    return shard if 0 <= shard < shards else None


def record_event(delayq, shard: int, event: str, fields: dict[str, Any]) -> None:
    """Queue a worker event for the journal of ``shard``; the caller never waits for Redis.
    ``started`` is written within 10 ms, while the task runs, so a killed worker leaves it."""
    _outbox.put(delayq, (shard, event, fields), soon=event == Event.STARTED)
