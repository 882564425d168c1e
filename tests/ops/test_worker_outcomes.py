"""Every run of a delayed task ends in the journal, also when Celery reports its end outside
``task_postrun``: a hard time limit, a lost worker process and ``Reject(requeue=False)``
are ``failed`` (Celery's ``task_failure``, sent by the worker's main process), ``Ignore``
is ``ignored``, and a ``replace`` hands the job to its replacement, whose outcome ends it.
A run the worker discards or stops (revoked, expired, terminated: Celery's
``task_revoked``) is ``revoked``, with the reason, and nothing else."""

from __future__ import annotations

import contextlib
import socket
import time
from datetime import datetime, timedelta, timezone

import celery
import pytest
from celery import states

from tests.conftest import answers, wait_for
from tests.ops.test_worker_events import journal_of

FINAL = "succeeded failed ignored"
#: Celery 5.3 sends no ``task_failure`` for a ``Reject`` or a hard time limit, nor any
#: other signal (5.7 does; versions between are taken either way): such a run's journal
#: may end at ``started`` there.
UNSIGNALLED = frozenset({"rejected", "rejected_as_its_journal_stalls", "over_time_limit"}
                        if celery.VERSION < (5, 7) else ())

#: task → the events of its job after ``promoted`` (the carrier's ack may come any time)
ON_EVERY_POOL = {
    "fails": ["started", "failed"],
    "rejected": ["started", "failed"],
    "ignored": ["started", "ignored"],
    "replaced": ["started", "started", "succeeded"],
}
#: what only a pool of child processes does: kill the task at its hard time limit, or lose
#: the process that ran it
IN_CHILD_PROCESSES = {
    "over_time_limit": ["started", "failed"],
    "kills_its_process": ["started", "failed"],
}


def schedule(proj, outcomes: dict[str, list[str]], queue: str) -> dict[str, str]:
    """One job of each task on ``queue``, due at once: task name by job id."""
    jobs = {}
    for name in outcomes:
        kwargs = {"queue": queue} if name == "replaced" else {}
        result = getattr(proj, name).apply_delayed((f"{queue} {name}",), kwargs, delay=0.05,
                                                   queue=queue)
        jobs[result.job_id] = name
    return jobs


def assert_journaled(delayq, jobs: dict[str, str], outcomes: dict[str, list[str]]) -> None:
    unsignalled = [job_id for job_id, name in jobs.items() if name in UNSIGNALLED]
    journaled = journal_of(delayq, [job_id for job_id in jobs if job_id not in unsignalled],
                           FINAL)
    journaled.update(journal_of(delayq, unsignalled, "started"))
    ended = {name: [e["event"] for e in journaled[job_id]
                    if e["event"] not in ("scheduled", "promoted")]
             for job_id, name in jobs.items()}
    for name in UNSIGNALLED & ended.keys():  # whatever that Celery reported
        assert ended.pop(name) in (["started"], outcomes[name]), name
    assert ended == {name: events for name, events in outcomes.items()
                     if name not in UNSIGNALLED}
    replaced = next((job_id for job_id, name in jobs.items() if name == "replaced"), None)
    if replaced is not None:
        assert [(e["task"], e["task_id"]) for e in journaled[replaced][-2:]] == [
            ("tests.proj.record", journaled[replaced][-3]["task_id"])] * 2


@contextlib.contextmanager
def log_shown_on_failure(worker):
    """Print the end of ``worker``'s log if the block fails."""
    try:
        yield
    except BaseException:
        print(worker.log.read_text()[-4000:])
        raise


def journaled_by(spawn, proj, delayq, queue: str, outcomes: dict[str, list[str]],
                 *pool: str) -> None:
    """A worker of ``pool`` on ``queue`` runs one job of each task of ``outcomes``: assert
    its journal (printing the worker's log if it is not as said)."""
    worker = spawn("worker", "-Q", queue, "-P", *pool, "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    jobs = schedule(proj, outcomes, queue)
    with log_shown_on_failure(worker):
        assert_journaled(delayq, jobs, outcomes)


def test_a_prefork_worker_journals_how_every_run_ended(proj, delayq, carrier, spawn):
    journaled_by(spawn, proj, delayq, "outcomes", {**ON_EVERY_POOL, **IN_CHILD_PROCESSES},
                 "prefork", "-c", "2")


def test_a_reject_is_journaled_after_the_started_event_its_process_had_not_written(
        proj, delayq, carrier, spawn):
    journaled_by(spawn, proj, delayq, "outcomes-stalled",
                 {"rejected_as_its_journal_stalls": ON_EVERY_POOL["rejected"]},
                 "prefork", "-c", "1")


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_worker_without_child_processes_journals_how_every_run_ended(
        proj, delayq, carrier, spawn, pool):
    journaled_by(spawn, proj, delayq, f"outcomes-{pool}", ON_EVERY_POOL, pool)


def after_promotion(delayq, job_id: str, ended_by: str) -> list[dict[str, str]]:
    """The job's journal entries after ``scheduled`` / ``promoted`` once one is in
    ``ended_by``, read again a moment later: a second outcome (Celery's ``task_failure``
    for a run it also reported revoked) would be written within that moment."""
    journal_of(delayq, [job_id], ended_by)
    time.sleep(1.5)
    return [e for e in journal_of(delayq, [job_id], ended_by)[job_id]
            if e["event"] not in ("scheduled", "promoted")]


def revoking_worker(spawn, queue: str, *pool: str):
    """A worker named after ``queue`` consuming it, with the pool ``pool``."""
    return spawn("worker", "-Q", queue, "-n", f"{queue}@%h", "-P", *pool,
                 "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO")


def test_a_job_that_expires_before_it_is_due_is_journaled_revoked_as_expired(
        proj, delayq, carrier, spawn):
    queue = "outcomes-expired"
    worker = revoking_worker(spawn, queue, "threads")
    result = proj.record.apply_delayed(
        ("expired",), delay=1, queue=queue,
        expires=datetime.now(timezone.utc) + timedelta(seconds=0.3))
    with log_shown_on_failure(worker):
        ended = after_promotion(delayq, result.job_id, "revoked started")
        assert [(e["event"], e.get("reason")) for e in ended] == [("revoked", "expired")]
        assert (ended[0]["task"], ended[0]["task_id"]) == ("tests.proj.record", result.id)
    assert result.state == states.REVOKED


def test_a_promoted_job_revoked_while_it_waits_in_the_broker_is_journaled_revoked(
        proj, delayq, carrier, spawn):
    queue = "outcomes-revoked"
    worker = revoking_worker(spawn, "outcomes-idle", "threads")
    idle = f"outcomes-idle@{socket.gethostname()}"
    result = proj.record.apply_delayed(("revoked",), delay=0.05, queue=queue)
    with log_shown_on_failure(worker):
        journal_of(delayq, [result.job_id], "promoted")  # too late for the store's cancel
        wait_for(lambda: answers(proj.app, idle), timeout=30,
                 what=f"worker {idle} to answer")
        result.revoke()
        # The worker handles its control messages in order: it knows the job revoked when
        # it begins to consume the job's queue.
        assert proj.app.control.add_consumer(queue, destination=[idle], reply=True)
        ended = after_promotion(delayq, result.job_id, "revoked started")
        assert [(e["event"], e.get("reason")) for e in ended] == [("revoked", "revoked")]
    assert result.state == states.REVOKED


def test_a_prefork_run_terminated_by_revoke_is_journaled_revoked_once_not_failed(
        proj, delayq, carrier, spawn):
    queue = "outcomes-terminated"
    worker = revoking_worker(spawn, queue, "prefork", "-c", "1")
    result = proj.slow.apply_delayed(("terminated",), {"seconds": 30}, delay=0.05,
                                     queue=queue)
    with log_shown_on_failure(worker):
        journal_of(delayq, [result.job_id], "started", timeout=30)
        result.revoke(terminate=True)
        ended = after_promotion(delayq, result.job_id, "revoked failed succeeded")
        assert [(e["event"], e.get("reason")) for e in ended] == [
            ("started", None), ("revoked", "terminated")]
    assert result.state == states.REVOKED
