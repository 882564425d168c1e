"""``DelayQTester``: a Celery app's delay store on a test Redis, with a clock the test moves.

The ``delayq`` pytest fixture (:mod:`.pytest_plugin`) gives one per test; a test or fixture
of its own may also use it as a context manager. See ``docs/testing.md``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from celery import Celery, signals
from celery.app.task import Context
from celery.app.trace import build_tracer
from kombu.utils.json import loads

from .. import journal
from ..errors import DelayQError
from ..events import Event
from ..extension import DelayQ
from ..job import Job
from ..message import Message
from ..publisher import Publisher
from ..reading import iso_time, utc_of_ms
from ..store import Promoted
from ..validation import Due

#: Most tasks one ``advance`` runs before it decides a task keeps rescheduling itself.
MAX_RUNS = 10_000
_OVERRIDDEN = ("redis_url", "prefix")
_LEASE_MS = 60_000


@dataclass(frozen=True)
class Run:
    """One delayed task that ``advance``/``run_due`` ran."""

    job_id: str
    task: str
    args: list
    kwargs: dict
    key: str | None
    due: datetime
    state: str  # SUCCESS, FAILURE, RETRY, IGNORED, REJECTED, REVOKED (expired unrun)
    result: Any  # the return value, or the exception (None when REVOKED)


class DelayQTester:
    """A Celery app's DelayQ pointed at a test Redis, and a clock the test moves.

    Delays given while it is active (``apply_delayed(delay=...)``, ``countdown=``,
    ``self.retry(countdown=...)``) count from the test clock, :meth:`now`. Absolute
    ``eta=`` times and ``DelayQ.reschedule`` keep the real clock.

    An app that had not opted in (``DelayQ(app)``) is opted in only while it is active:
    on exit its DelayQ is dropped and the app is as it was (``DelayQ._opt_out``), unless
    the project's own ``DelayQ(app)`` ran meanwhile (a module imported during the test).
    """

    def __init__(self, app: Celery, redis_url: str) -> None:
        self.app = app
        self.redis_url = redis_url
        self.prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
        self.runs: list[Run] = []
        self._offset_ms = 0
        self._saved: dict[str, Any] = {}
        self._opts_in = False  # __enter__ opts the app in (it had not)

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> DelayQTester:
        conf = self.app.conf
        for name in _OVERRIDDEN:
            self._saved[name] = conf.get(f"delayq_{name}")
        conf.update(delayq_redis_url=self.redis_url, delayq_prefix=self.prefix)
        self._opts_in = DelayQ.lookup(self.app) is None  # then only while it is active
        self.delayq = DelayQ.of(self.app)
        _reload(self.delayq)
        self.delayq.set_clock(self._on_test_clock)
        return self

    def __exit__(self, *exc: object) -> None:
        self.delayq.set_clock(None)
        journal.flush()  # outcomes of tasks run here, written before their keys are deleted
        try:
            client = self.delayq.store.client
            stale = list(client.scan_iter(f"{self.prefix}:*"))
            if stale:
                client.delete(*stale)
        finally:
            self.app.conf.update({f"delayq_{n}": v for n, v in self._saved.items()})
            _reload(self.delayq)
            # the app is as it was: not opted in (DelayQ._opt_out), unless the project's
            # own DelayQ(app) ran meanwhile (a module imported during the test)
            if self._opts_in and self.delayq._calls == 1:
                DelayQ._opt_out(self.app)

    # -- looking -----------------------------------------------------------------------

    def now(self) -> datetime:
        """The test clock: Redis's time plus everything advanced so far."""
        return utc_of_ms(self._now_ms())

    def _on_test_clock(self, due: Due) -> Due:
        """A relative delay counts from the test clock (once it was moved)."""
        if self._offset_ms == 0 or due.delay_ms is None:
            return due  # the store's own clock is the test clock
        return Due(at_ms=self._now_ms() + due.delay_ms, delay_ms=None)

    def pending(self, task: str | None = None, key: str | None = None) -> list[Job]:
        """Pending jobs in due order, optionally of one task and/or business key."""
        return self.delayq.pending(task=task, key=key, limit=1_000_000)

    def get(self, job_id: str) -> Job | None:
        return self.delayq.get(job_id)

    def cancelled(self, task: str | None = None) -> list[str]:
        """Ids of the jobs cancelled during this test, oldest first (read from the journal);
        not dead letters dropped (their id may be a pending job's by then)."""
        if self.delayq.config.journal_maxlen <= 0:
            raise DelayQError("delayq.cancelled() reads the journal, which "
                              "delayq_journal_maxlen=0 turns off")
        entries = []
        store = self.delayq.store
        for shard in store.keys:
            entries.extend(store.read_journal(shard))
        entries.sort(key=lambda entry: tuple(int(p) for p in entry[0].split("-")))
        return [fields["job"] for _, fields in entries if fields.get("event") == Event.CANCELLED
                and fields.get("from") != "dead" and (task is None or fields.get("task") == task)]

    def dead(self) -> list[dict[str, Any]]:
        """Dead-lettered jobs with their reason, newest first."""
        return self.delayq.store.dead()

    # -- moving the clock --------------------------------------------------------------

    def advance(self, delta: timedelta | float | None = None, *, days: float = 0,
                hours: float = 0, minutes: float = 0, seconds: float = 0,
                propagate: bool = True) -> list[Run]:
        """Move the test clock forward and run every job due by then, in due order.

        Jobs run here, in this process, as a worker would run them (``self.request``
        carries the job id; a retry goes back to the store on the test clock). Jobs that
        a run schedules are run too if they fall due before the new time. With
        ``propagate`` the first task error is raised once its batch has run.
        """
        step = _duration(delta, days=days, hours=hours, minutes=minutes, seconds=seconds)
        target_ms = self._now_ms() + round(step.total_seconds() * 1000)
        ran: list[Run] = []
        while True:
            head = self.delayq.store.earliest()
            if head is None or head[0] > target_ms:
                break
            due_ms, job_id, _ = head
            redis_ms = self.delayq.store.now_ms()
            self._offset_ms = max(self._offset_ms, due_ms - redis_ms)
            batch = self._promote((job_id, due_ms) if due_ms > redis_ms else None)
            ran.extend(batch)
            self.runs.extend(batch)
            failed = [run for run in batch if run.state == "FAILURE"]
            if propagate and failed:
                raise failed[0].result
            if len(ran) > MAX_RUNS:
                raise DelayQError(f"advance ran more than {MAX_RUNS} tasks; does a task keep "
                                  "scheduling itself with a short delay?")
        self._offset_ms = max(self._offset_ms, target_ms - self.delayq.store.now_ms())
        return ran

    def run_due(self, propagate: bool = True) -> list[Run]:
        """Run every job due now on the test clock (``advance`` by nothing)."""
        return self.advance(0, propagate=propagate)

    # -- internals ---------------------------------------------------------------------

    @cached_property
    def _publisher(self) -> Publisher:
        """The carrier's publish step, built on first promotion, once the test has
        configured the app; its messages are run here instead of published."""
        return Publisher(self.app, self.delayq.store, batch=self.delayq.config.claim_batch)

    def _now_ms(self) -> int:
        return self.delayq.store.now_ms() + self._offset_ms

    def _promote(self, pulled: tuple[str, float] | None) -> list[Run]:
        """Make the job of ``pulled`` (its id and due time, if given) due on Redis's clock;
        claim, ack and run what is due.

        A job whose task is not registered here is not run: it and the jobs after it are
        given back to the store (due as they were) before anything is acked, the jobs
        before it run, and a DelayQError naming the task is raised."""
        store = self.delayq.store
        if pulled is not None:  # journaled as rescheduled: the test clock pulled it in
            store.reschedule(pulled[0], Due(at_ms=None, delay_ms=0))
        was_due = dict([pulled]) if pulled is not None else {}
        claims = store.claim(list(store.keys), store.config.claim_batch, _LEASE_MS)
        for claim in claims:
            if claim.error:
                raise claim.error
        taken = self._publisher.take(claims, send=lambda message: None)
        jobs = sorted(taken.sent, key=lambda item: item[0].due_ms)
        unknown = next((n for n, (_, message) in enumerate(jobs)
                        if message.task not in self.app.tasks), None)
        if unknown is not None:  # it and the jobs after it go back to the store, unrun
            given_back = {job.stored_id for job, _ in jobs[unknown:]}
            store.release([replace(claim, jobs=[job for job in claim.jobs
                                                 if job.stored_id in given_back])
                           for claim in claims])
            for job, _ in jobs[unknown:]:  # released as due now: due as they were again
                due_ms = round(was_due.get(job.job_id, job.due_ms))
                store.reschedule(job.job_id, Due(at_ms=due_ms, delay_ms=None), job.key)
            taken.acks = {shard: [job for job in promoted if job.stored_id not in given_back]
                          for shard, promoted in taken.acks.items()}
            stuck, stuck_message = jobs[unknown]
            jobs = jobs[:unknown]
        store.ack(taken.acks)  # promoted, as the carrier would before a worker runs them
        runs = [self._run(job, message) for job, message in jobs]
        if unknown is not None:
            self.runs.extend(runs)  # they ran; the error below stops advance
            raise DelayQError(f"delayed job {stuck.job_id} calls {stuck_message.task!r}, which "
                              f"is not registered on {self.app.main or 'the app'}; import the "
                              "module that defines it (the job, and those due after it in its "
                              "batch, stay pending)")
        return runs

    def _run(self, job: Promoted, message: Message) -> Run:
        """Run one promoted job in this process, as a worker runs the published message."""
        task = self.app.tasks[message.task]  # registered: _promote gave back any other
        args, kwargs, embed = loads(message.body)
        request = {
            **message.headers, **(embed or {}), "is_eager": False,
            "hostname": "delayq-pytest", "delivery_info": {
                "exchange": message.exchange, "routing_key": message.routing_key,
                "priority": message.properties.get("priority"), "redelivered": False},
        }
        expires = message.headers.get("expires")
        if expires and iso_time(expires) < self.now():  # a worker discards it, unrun
            context = Context(request)
            task.backend.mark_as_revoked(context.id, "expired", request=context)
            signals.task_revoked.send(sender=task, request=context, terminated=False,
                                      signum=None, expired=True)
            state, result = "REVOKED", None
        else:
            tracer = build_tracer(task.name, task, eager=True, propagate=False, app=self.app)
            retval, info, _, _ = tracer(message.headers["id"], args, kwargs, request)
            state, result = "SUCCESS", retval
            if info is not None:
                state, result = info.state, info.retval
        return Run(job.job_id, message.task, args, kwargs, message.key,
                   utc_of_ms(job.due_ms), state, result)


def _reload(delayq: DelayQ) -> None:
    """Forget the DelayQ's settings and store so the next use reads ``app.conf`` again."""
    store = delayq.__dict__.pop("store", None)
    if store is not None:
        store.close()
    delayq.__dict__.pop("config", None)


def _duration(delta: timedelta | float | None, **parts: float) -> timedelta:
    """``advance``'s step: ``delta`` (a timedelta or seconds) plus ``parts``."""
    if delta is None:
        delta = 0
    if isinstance(delta, bool) or not isinstance(delta, (timedelta, int, float)):
        raise TypeError(f"advance() takes a timedelta or seconds, got {delta!r}")
    try:
        step = (delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
                ) + timedelta(**parts)
    except (OverflowError, ValueError):  # (NaN, infinity, past 999,999,999 days)
        raise ValueError(f"advance() takes a finite time, at most {timedelta.max.days:,} "
                         f"days; got {delta!r} and {parts}") from None
    if step < timedelta():
        raise ValueError("the test clock only moves forward; advance() by a positive time")
    return step
