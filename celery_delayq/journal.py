"""Worker-side journal events: started, succeeded, failed, retried for delayed tasks.

The store's scripts journal scheduled / rescheduled / cancelled / promoted / dead
themselves; a worker adds what happens to a promoted task through Celery's signals,
recognising it by the ``delayq_job`` header the carrier sets. Events wait in a
per-process outbox that a thread writes in one pipeline, so they cost the task no Redis
round trip of its own: outcomes within 50 ms, ``started`` within 10 ms while the task runs,
so a worker killed mid-task leaves it in the journal (unless killed in those first
milliseconds). The thread writes whatever has gathered by then in one pipeline: under a
burst of short tasks, the events of several tasks in one round trip. Events a write failed
for (the store's Redis away) are kept for the next one, up to :data:`_HOLD_AT_MOST`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis
from celery import signals
from celery import states as celery_states

from .envelope import HEADER_DUE, HEADER_JOB, HEADER_KEY, HEADER_SHARD
from .errors import DelayQError
from .events import Event
from .reading import counted, printable

logger = logging.getLogger("celery_delayq.journal")

_OUTCOMES = {
    celery_states.SUCCESS: Event.SUCCEEDED,
    celery_states.FAILURE: Event.FAILED,
    celery_states.RETRY: Event.RETRIED,
}
_FLUSH_EVERY = 0.05  # longest an event waits in the outbox, seconds
_GATHER = 0.01  # how long a started event waits for others to share its round trip
_FLUSH_AT = 200  # events that make the outbox flush at once
_HOLD_AT_MOST = 10_000  # events kept while the store's Redis does not answer (oldest go)
_connected = threading.Event()
#: An app's DelayQ, or None when it has none (``DelayQ.lookup``, given to :func:`connect`).
_delayq_of: Callable[[Any], Any] | None = None


class _Outbox:
    """Worker events of this process waiting to be written, flushed by a daemon thread."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a child starts its own thread

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards the list of waiting events
        self._writing = threading.Lock()  # held through a flush: a flush returns only
        # once events another flush took are written too (a test's cleanup comes after)
        self._due = threading.Event()
        self._events: list[tuple[Any, tuple[int, str, dict[str, Any]]]] = []
        self._held = 0  # of them, kept after a write that failed (0: the last one worked)
        self._thread: threading.Thread | None = None

    def put(self, delayq, entry: tuple[int, str, dict[str, Any]], soon: bool = False) -> None:
        """Queue an event; ``soon`` has it written within ``_GATHER`` instead of at the
        flush thread's next tick (the caller never waits for Redis)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="delayq-journal",
                                                daemon=True)
                self._thread.start()
            self._events.append((delayq, entry))
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
        """Write every waiting event (also called when a worker process shuts down); the
        log says how many the store's Redis did not take."""
        with self._writing:
            self._write()
        if self._held:
            logger.error("%s not written: the store's Redis does not answer",
                         counted(self._held, "worker event"))

    def _write(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        by_delayq: dict[Any, list[tuple[int, str, dict[str, Any]]]] = defaultdict(list)
        for delayq, entry in events:
            by_delayq[delayq].append(entry)
        unwritten: list[tuple[Any, tuple[int, str, dict[str, Any]]]] = []
        failure: Exception | None = None
        for delayq, entries in by_delayq.items():
            try:
                refused = delayq.store.journal_many(entries)
            except Exception as exc:  # Redis away, or a client fault: none of them written
                unwritten += [(delayq, entry) for entry in entries]
                failure = exc
                continue
            if refused:  # e.g. a damaged journal key: writing them again would not help
                logger.warning("could not journal %s: %s",
                               counted(len(refused), "worker event"), refused[0])
        if failure is not None:
            self._hold(unwritten, failure)
        elif self._held:
            logger.info("wrote %s held while the store's Redis did not answer",
                        counted(self._held, "worker event"))
            self._held = 0

    def _hold(self, unwritten: list[tuple[Any, tuple[int, str, dict[str, Any]]]],
              failure: Exception) -> None:
        """Keep events a write failed for, ahead of newer ones, for the next write; past
        :data:`_HOLD_AT_MOST` the oldest go."""
        if not self._held:
            logger.warning("holding worker events until the store's Redis answers: %s",
                           failure, exc_info=not isinstance(failure, (DelayQError,
                                                                      redis.RedisError)))
        with self._lock:
            self._events[:0] = unwritten
            excess = len(self._events) - _HOLD_AT_MOST
            if excess > 0:
                del self._events[:excess]
                logger.error("dropped %s: more than %d waited for the store's Redis",
                             counted(excess, "worker event"), _HOLD_AT_MOST)
            self._held = len(self._events)


_outbox = _Outbox()


def connect(delayq_of: Callable[[Any], Any]) -> None:
    """Connect the signal handlers once per process (they serve every app); ``delayq_of``
    gives an app's DelayQ, or None for an app that has none."""
    global _delayq_of
    _delayq_of = delayq_of
    if not _connected.is_set():
        signals.task_prerun.connect(_on_prerun, weak=False)
        signals.task_postrun.connect(_on_postrun, weak=False)
        signals.worker_process_shutdown.connect(_outbox.flush, weak=False)
        signals.worker_shutdown.connect(_outbox.flush, weak=False)
        _connected.set()


def flush() -> None:
    """Write the waiting worker events now."""
    _outbox.flush()


def _on_prerun(sender=None, task_id=None, task=None, **_) -> None:
    _record(task, task_id, Event.STARTED)


def _on_postrun(sender=None, task_id=None, task=None, state=None, **_) -> None:
    event = _OUTCOMES.get(state)
    if event:
        _record(task, task_id, event)


def _record(task, task_id: str | None, event: Event) -> None:
    request = getattr(task, "request", None)
    job_id = request.get(HEADER_JOB) if request is not None else None
    if request is None or job_id is None:
        return
    delayq = _delayq_of(task.app) if _delayq_of is not None else None
    if delayq is None or not delayq.config.worker_events:
        return
    shard = _shard_number(request.get(HEADER_SHARD), delayq.store.keys.shards)
    if shard is None:  # (a message of another store, or made by hand)
        logger.warning("delayed job %s has no valid %s header; %s not journaled",
                       printable(job_id), HEADER_SHARD, event)
        return
    record_event(delayq, shard, event, {
        "job": job_id, "task": task.name, "key": request.get(HEADER_KEY) or "",
        "task_id": task_id or "", "retries": request.retries or 0,
        "due": request.get(HEADER_DUE) or "",
    })


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
