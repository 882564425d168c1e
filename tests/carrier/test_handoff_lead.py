"""delayq_handoff_lead: a job is handed to its queue ahead of its time, eta = due time, and
the worker's timer starts it on time; jobs further away stay in the store."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.errors import ConfigurationError
from tests.conftest import wait_for


def lead_app(redis_server, **settings) -> Celery:
    """An app of the test project's store and broker, with its own settings."""
    app = Celery("lead", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url=os.environ.get("DELAYQ_TEST_STORE_URL"), delayq_shards=4,
                    task_default_queue="celery", **settings)
    return app


def test_a_job_due_within_the_lead_is_handed_over_early_and_starts_on_time(
        proj, redis_server, redis_client, spawn):
    # A worker of its own, in a process of its own, on a queue of its own. ci-local twice
    # found the job handed over and never run (cause not found): with the session's
    # in-process worker, seen "terminating", and then with this worker on the default queue,
    # which that worker also reads when an earlier test of this process started it. Now no
    # other worker reads the queue, and the worker's log is printed if the run never comes.
    worker = spawn("worker", "-Q", "lead.near", "-P", "solo", "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    app = lead_app(redis_server, delayq_handoff_lead=2.0)
    delayq = DelayQ(app)
    due = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    delayq.schedule(proj.record.name, ("near",), eta=due, job_id="near", queue="lead.near")
    delayq.schedule(proj.record.name, ("far",), delay=30, job_id="far")
    carrier = Carrier(app)
    try:
        carrier.run_once()
        handed_over = time.time()
    finally:
        carrier.close()
    assert handed_over < due.timestamp()
    assert delayq.get("near") is None and delayq.cancel("near") is False

    def ran() -> list[dict]:
        assert worker.poll() is None, f"the worker exited:\n{worker.log.read_text()[-3000:]}"
        return proj.runs()

    try:
        run = wait_for(ran, timeout=30, what="the near job's run")[0]
    except pytest.fail.Exception:
        print(worker.log.read_text()[-3000:])  # shown with the failure
        raise
    assert run["label"] == "near" and run["started_ms"] >= due.timestamp() * 1000
    assert delayq.get("far").state == "scheduled" and delayq.cancel("far") is True


@pytest.mark.parametrize(("settings", "match"), [
    ({"delayq_handoff_lead": -1}, "between 0 and 360"),
    ({"delayq_handoff_lead": 400}, "between 0 and 360"),
    ({"delayq_handoff_lead": 60, "broker_transport_options": {"visibility_timeout": 100}},
     "half the broker's visibility_timeout"),
])
def test_a_lead_a_worker_could_not_hold_safely_is_refused(redis_server, settings, match):
    with pytest.raises(ConfigurationError, match=match):
        DelayQ(lead_app(redis_server, **settings)).config  # noqa: B018 - reading validates


def test_a_carrier_given_a_lead_hands_over_early_and_refuses_an_unsafe_one(
        proj, app, delayq, redis_client):
    with pytest.raises(ConfigurationError, match="between 0 and 360"):
        Carrier(app, handoff_lead=1000)
    due = datetime.now(timezone.utc) + timedelta(seconds=5)
    proj.record.apply_delayed(args=("x",), eta=due, job_id="soon", queue="parked.lead")
    carrier = Carrier(app, handoff_lead=10)
    try:
        carrier.run_once()
    finally:
        carrier.close()
    assert delayq.get("soon") is None and redis_client.llen("parked.lead") == 1
