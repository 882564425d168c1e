"""What the carrier dead-letters: a job whose stored form is bad, and nothing else.

A dead letter says "this job cannot be published as stored" and waits for an operator to
replay it. An error that is not the stored job's fault (a setting, a bug of ours) must not
make one: the job stays stored, the error is logged with its traceback, and the job is
published once the cause is gone. Jobs go to the queue ``parked``, which no worker consumes.
"""

from __future__ import annotations

import logging
import time

from celery_delayq.carrier import Carrier
from tests.faults.test_carrier_faults import (
    PARKED,
    carry_until_quiet,
    parked_messages,
    schedule_due_now,
)

LEASE = 0.5  # seconds: the job lease of the carrier that meets the error
DAMAGED = f'{{"t":"tests.proj.record","q":"{PARKED}"\n[1]\n'  # first line cut short


def _plant_damaged(delayq) -> str:
    """A job whose envelope is not JSON, planted with raw commands (through the store's
    client: a cluster in the cluster pass); returns its id."""
    shard = delayq.store.keys.shard(0)
    raw = delayq.store.client
    raw.hset(shard.jobs, "damaged", DAMAGED)
    raw.zadd(shard.due, {"damaged": 0})
    return "damaged"


def _dead(delayq) -> dict[str, str]:
    return {d["job_id"]: d["reason"] for d in delayq.store.dead(limit=1000)}


def test_a_damaged_envelope_is_dead_lettered_with_its_reason(proj, delayq, redis_client):
    healthy = schedule_due_now(proj, 20, prefix="ok")
    damaged = _plant_damaged(delayq)

    carrier = carry_until_quiet(proj.app, direct=False)

    assert {h["delayq_job"] for h in parked_messages(redis_client)} == healthy
    assert list(_dead(delayq)) == [damaged] and carrier.stats.dead == 1
    assert _dead(delayq)[damaged].startswith("envelope is not valid JSON"), _dead(delayq)


def test_an_unexpected_error_of_ours_is_logged_and_dead_letters_nothing(
        proj, delayq, redis_client, monkeypatch, caplog):
    healthy = schedule_due_now(proj, 50, prefix="ok")
    damaged = _plant_damaged(delayq)
    carrier = Carrier(proj.app, lease=LEASE)
    build = carrier.publisher.messages.build

    def bug_on_one_job(job_id, *args, **kwargs):  # stands in for a bug in our own code
        if job_id == "ok-7":
            raise ZeroDivisionError("division by zero")
        return build(job_id, *args, **kwargs)

    monkeypatch.setattr(carrier.publisher.messages, "build", bug_on_one_job)
    with caplog.at_level(logging.ERROR, logger="celery_delayq.carrier"):
        carrier.run_once()
    carrier.close()

    assert {h["delayq_job"] for h in parked_messages(redis_client)} == healthy - {"ok-7"}
    (logged,) = [r for r in caplog.records if r.exc_info]
    assert "ok-7" in logged.getMessage() and logged.exc_info[0] is ZeroDivisionError
    assert list(_dead(delayq)) == [damaged], "our own bug dead-lettered a user's job"
    assert delayq.get("ok-7") is not None  # still stored, leased until the lease ends
    time.sleep(LEASE + 0.1)  # the bug is fixed (a new carrier); the lease ends
    carry_until_quiet(proj.app, direct=False)
    assert sorted(h["delayq_job"] for h in parked_messages(redis_client)) == sorted(healthy)
    assert list(_dead(delayq)) == [damaged]
