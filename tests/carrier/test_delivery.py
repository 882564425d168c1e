"""End to end: apply_delayed -> store -> carrier -> broker -> a real worker."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import PROMOTIONS, wait_for, wait_for_events

pytestmark = pytest.mark.parametrize("carrier", PROMOTIONS, indirect=True)


def test_delayed_tasks_run_once_each_and_never_early(proj, worker, carrier):
    results = [proj.record.apply_delayed(args=(f"job-{i}",), delay=0.2 + (i % 10) * 0.05)
               for i in range(50)]

    runs = wait_for(lambda: len(proj.runs()) >= 50 and proj.runs(), what="50 runs")
    assert sorted(r["label"] for r in runs) == sorted(f"job-{i}" for i in range(50))
    assert {r["task_id"] for r in runs} == {r.id for r in results}
    for run in runs:
        assert run["started_ms"] >= run["due_ms"], f"{run['label']} started early"


def test_result_of_a_delayed_task_is_available_through_get(proj, worker, carrier):
    result = proj.record.apply_delayed(args=("answer",), delay=0.1)
    assert result.get(timeout=15) == "answer"


def test_eta_schedules_at_an_absolute_time(proj, worker, carrier):
    eta = datetime.now(timezone.utc) + timedelta(milliseconds=300)
    result = proj.record.apply_delayed(args=("at-eta",), eta=eta)
    assert abs((result.eta - eta).total_seconds()) < 0.002
    assert result.get(timeout=15) == "at-eta"


def test_cancelled_before_due_never_runs(proj, worker, carrier):
    doomed = proj.record.apply_delayed(args=("doomed",), delay=0.5, key="order:7")
    kept = proj.record.apply_delayed(args=("kept",), delay=0.6)
    assert doomed.cancel() is True
    assert kept.get(timeout=15) == "kept"
    assert [r["label"] for r in proj.runs()] == ["kept"]
    assert doomed.cancel() is False


def test_cancel_key_cancels_every_job_of_the_business_key(proj, delayq, worker, carrier):
    for name in ("close", "remind", "audit"):
        proj.record.apply_delayed(args=(name,), delay=0.5, key="order:42",
                                  job_id=f"order:42:{name}")
    other = proj.record.apply_delayed(args=("other",), delay=0.5, key="order:43")
    assert delayq.cancel_key("order:42") == 3
    assert other.get(timeout=15) == "other"
    assert [r["label"] for r in proj.runs()] == ["other"]


def test_countdown_on_apply_async_goes_through_the_store(proj, delayq, worker, carrier):
    result = proj.record.apply_async(("counted",), countdown=0.3)
    job = delayq.get(result.id)
    assert job is not None and job.task == proj.record.name
    assert result.get(timeout=15) == "counted"
    assert proj.runs()[0]["job"] == result.id


def test_retry_with_countdown_goes_through_the_store_and_keeps_the_task_id(
        proj, redis_client, worker, carrier):
    result = proj.flaky.apply_delayed(args=("flaky",), delay=0.1, key="refund:9")
    assert result.get(timeout=20) == "flaky"
    runs = proj.runs()
    assert [r["retries"] for r in runs] == [0, 1]
    assert {r["task_id"] for r in runs} == {result.id}
    # both runs came from the store: the retry was promoted by the carrier too
    assert all(r["job"] == result.job_id for r in runs)
    events = wait_for_events(proj.delayq, succeeded=1, promoted=2)
    assert events.count("promoted") == 2
    assert "retried" in events


def test_delayed_calls_that_carry_the_running_jobs_headers_on_are_jobs_of_their_own(
        proj, worker, carrier):
    """Only the task's own retry (its task id) goes on with its job: forwarded to other
    calls, the carrier's delayq headers put each on the running job, replacing the one
    before, and only the last child ran."""
    children = proj.forwards_headers.apply_delayed(args=("parent",), delay=0.1).get(timeout=20)
    ran = ["parent", "parent child 0", "parent child 1", "parent child 2"]
    wait_for(lambda: sorted(run["label"] for run in proj.runs()) == ran, timeout=20,
             what="every child run once")
    assert sorted(run["task_id"] for run in proj.runs()[1:]) == sorted(children)


def test_a_delayed_last_step_of_a_replacement_chain_goes_on_with_the_replaced_job(
        proj, delayq, worker, carrier):
    """The step that takes the replaced run's task id is sent by the worker of the step
    before it, with the job's headers (Task.replace handed them over): it is that job, so
    its business key still cancels it."""
    result = proj.replaced_by_a_chain.apply_delayed(args=("first",), delay=0,
                                                    job_id="order:42:close", key="order:42")
    [job] = wait_for(lambda: [job for job in delayq.pending(key="order:42")
                              if job.args == ["first step"]],
                     timeout=20, what="the chain's delayed last step, under the job's key")
    assert (job.job_id, job.task_id, job.args) == ("order:42:close", result.id,
                                                   ["first step"])
    assert delayq.cancel_key("order:42") == 1


def test_reschedule_and_run_now_move_the_due_time(proj, delayq, worker, carrier):
    later = proj.record.apply_delayed(args=("later",), delay=3600, job_id="later")
    assert delayq.reschedule("later", delay=7200) > later.eta
    assert delayq.run_now("later") is True
    assert later.get(timeout=15) == "later"
    assert delayq.run_now("later") is False


def test_worker_events_are_journaled_for_delayed_tasks(proj, redis_client, worker, carrier):
    proj.record.apply_delayed(args=("journaled",), delay=0.05).get(timeout=15)
    events = wait_for_events(proj.delayq, promoted=1, started=1, succeeded=1)
    # "promoted" is journaled by the ack after the whole batch is out: a fast worker may
    # have started the task by then.
    assert events[0] == "scheduled" and sorted(events[1:3]) == ["promoted", "started"]
    assert events[3:] == ["succeeded"]
