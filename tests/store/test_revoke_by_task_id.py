"""Celery's revoke reaches a job scheduled with an id of its own (``job_id=``), whose task
id is not its job id: the store keeps a task id index beside such a job (keys.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import states
from celery.result import AsyncResult

from celery_delayq.carrier import Carrier
from celery_delayq.errors import InvalidJobId
from celery_delayq.keys import pack_id
from celery_delayq.store import TASK_INDEX_GRACE_MS
from celery_delayq.store.claims import Promoted
from tests.carrier.test_pause import serve_once
from tests.conftest import CLUSTER, store_keys


@pytest.mark.parametrize("key", [None, "order:1"], ids=["no-key", "business-key"])
def test_revoke_by_task_id_cancels_a_job_scheduled_with_its_own_id(proj, delayq, key):
    kept = proj.record.apply_delayed(args=("kept",), delay=3600, job_id="order:2:close")
    revoked = proj.record.apply_delayed(args=("own",), delay=3600, job_id="order:1:close",
                                        key=key)
    assert revoked.id != revoked.job_id

    AsyncResult(revoked.id, app=proj.app).revoke()

    assert [job.job_id for job in delayq.pending()] == [kept.job_id]
    assert AsyncResult(revoked.id, app=proj.app).state == states.REVOKED
    assert AsyncResult(kept.id, app=proj.app).state == states.PENDING


def test_revoke_by_the_task_id_of_a_replaced_call_leaves_its_replacement_pending(
        proj, delayq):
    first = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close")
    second = proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close",
                                       if_exists="replace")
    assert first.id != second.id

    assert delayq.revoke([first.id]) == 0
    assert [(job.task_id, job.args) for job in delayq.pending()] == [(second.id, [2])]
    assert AsyncResult(second.id, app=proj.app).state == states.PENDING

    assert delayq.revoke([second.id]) == 1
    assert delayq.pending() == []


def test_revoke_by_task_id_is_too_late_once_a_carrier_holds_the_job(proj, delayq):
    result = proj.record.apply_delayed(args=(1,), delay=0, job_id="order:1:close")
    assert delayq.store.claim(list(delayq.store.keys), batch=10, lease_ms=60_000)

    assert delayq.revoke([result.id]) == 0
    assert AsyncResult(result.id, app=proj.app).state == states.PENDING


def _index_ttl_ms(delayq, task_id: str, key: str) -> int:
    store = delayq.store
    shard = store.keys.shard_for("order:1:close", key)
    return store.client.pttl(store.keys.task_index(shard, pack_id(task_id)))


def test_the_task_id_index_lives_while_its_job_is_pending_and_a_day_more(proj, delayq):
    day = TASK_INDEX_GRACE_MS
    result = proj.record.apply_delayed(args=(1,), delay=600, job_id="order:1:close",
                                       key="order:1")
    assert 600_000 + day - 5_000 < _index_ttl_ms(delayq, result.id, "order:1") <= 600_000 + day

    delayq.reschedule("order:1:close", delay=3 * 86_400, key="order:1")
    ttl = _index_ttl_ms(delayq, result.id, "order:1")
    assert 3 * 86_400_000 + day - 5_000 < ttl <= 3 * 86_400_000 + day

    delayq.revoke([result.id])
    assert delayq.pending() == []


def _indexed(delayq, task_id: str, key: str | None) -> bool:
    store = delayq.store
    shard = store.keys.shard_for("order:1:close", key)
    return bool(store.client.exists(store.keys.task_index(shard, pack_id(task_id))))


#: the ways a job of an id of its own leaves the store
LEAVES = {
    "promoted": lambda proj, delayq, result: serve_once(proj.app),
    **({} if CLUSTER else {  # (direct promotion needs one server: the broker's)
        "promoted directly": lambda proj, delayq, result: serve_once(proj.app, direct=True)}),
    "cancelled by job id": lambda proj, delayq, result: delayq.cancel("order:1:close",
                                                                      key="order:1"),
    "cancelled by key": lambda proj, delayq, result: delayq.cancel_key("order:1"),
    "revoked": lambda proj, delayq, result: delayq.revoke([result.id]),
}


@pytest.mark.parametrize("leaves", LEAVES)
def test_the_task_id_index_goes_when_its_job_leaves_the_store(proj, delayq, leaves):
    """Kept a day past the job's due time, the index of every job that left stayed a day
    after it: ~180 bytes per job of an id of its own, 1.5 GB at 100 such jobs a second."""
    result = proj.record.apply_delayed(args=(1,), delay=0.01, job_id="order:1:close",
                                       key="order:1")
    assert _indexed(delayq, result.id, "order:1")
    time.sleep(0.02)
    LEAVES[leaves](proj, delayq, result)
    assert delayq.pending() == []
    assert not _indexed(delayq, result.id, "order:1")


def test_the_task_id_index_of_a_call_stored_again_while_its_job_is_in_flight_stays(
        proj, delayq):
    """A retry stores its task's call again, under the same task id, while the carrier
    that published it may not have acked it yet: that ack leaves the index to the copy
    pending again."""
    first = proj.record.apply_delayed(args=(1,), delay=0, job_id="order:1:close")
    [claim] = [c for c in delayq.store.claim(list(delayq.store.keys), batch=10,
                                             lease_ms=60_000) if c.jobs]
    [claimed] = claim.jobs
    again = proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close",
                                      task_id=first.id, if_exists="replace")
    assert again.id == first.id
    delayq.store.ack({claim.shard: [Promoted("order:1:close", proj.record.name, None,
                                             claimed.due_ms, claimed.stored_id,
                                             claimed.lease, first.id)]})
    assert [job.args for job in delayq.pending()] == [[2]]
    assert _indexed(delayq, first.id, None)
    assert delayq.revoke([first.id]) == 1


@pytest.mark.skipif(CLUSTER, reason="direct promotion needs one server: the broker's")
def test_the_task_id_index_of_a_call_stored_again_after_a_direct_push_stays(proj, delayq):
    """The claim script forgets a job it pushes itself; its task id index goes with the
    carrier's next call, unless a retry stored the call again meanwhile."""
    first = proj.record.apply_delayed(args=(1,), delay=0, job_id="order:1:close")
    carrier = Carrier(proj.app, direct=True)
    try:
        carrier.router.check_broker()
        [claim] = [c for c in delayq.store.claim(list(delayq.store.keys), batch=10,
                                                 lease_ms=60_000, direct=carrier.router.routes)
                   if c.promoted]
    finally:
        carrier.close()
    assert claim.jobs == [] and [job.task_id for job in claim.pushed] == [first.id]
    proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close", task_id=first.id)
    delayq.store.ack({claim.shard: claim.pushed})
    assert _indexed(delayq, first.id, None)
    assert delayq.revoke([first.id]) == 1


def _task_indexes(delayq) -> list[str]:
    return [name for name in store_keys(delayq) if ":task:" in name]


@pytest.mark.parametrize("keys", [["order:1"] * 4, ["order:1", "order:2", "order:3", None]],
                         ids=["same key", "keys of other shards"])
def test_a_replace_takes_the_task_id_index_of_the_call_it_replaces(proj, delayq, keys):
    """A debounce (each call replaces the job of an id of its own, under a new task id)
    left the index of every task id it replaced a day past due: ~180 bytes per call."""
    calls = [proj.record.apply_delayed(args=(n,), delay=3600, job_id="order:1:close", key=key,
                                       if_exists="replace") for n, key in enumerate(keys)]
    assert len({call.id for call in calls}) == len(keys)
    assert _task_indexes(delayq) == [
        delayq.store.keys.task_index(delayq.store.keys.shard_for("order:1:close", keys[-1]),
                                     pack_id(calls[-1].id))]
    assert delayq.revoke([calls[0].id]) == 0
    assert delayq.revoke([calls[-1].id]) == 1
    assert _task_indexes(delayq) == []


def test_a_replace_under_the_same_task_id_keeps_its_index(proj, delayq):
    first = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close")
    proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close", task_id=first.id,
                              if_exists="replace")
    assert len(_task_indexes(delayq)) == 1
    assert delayq.revoke([first.id]) == 1


@pytest.mark.parametrize("cancel", ["by job id", "by key"])
def test_a_call_stored_again_between_a_cancel_and_its_index_clean_up_keeps_its_index(
        proj, delayq, monkeypatch, cancel):
    """A cancel forgets the task id index after its script has run. A producer storing the
    call again meanwhile, under that task id, kept its job but lost the index: a revoke of
    the task id then missed the job, which ran."""
    first = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close",
                                      key="order:1")
    store_type, interleaved = type(delayq.store), []
    forget = store_type._forget_task_indexes  # after the cancel script and its release

    def store_again_then_forget(self, *args):
        if not interleaved:
            interleaved.append(proj.record.apply_delayed(
                args=(2,), delay=3600, job_id="order:1:close", key="order:1",
                task_id=first.id))
        return forget(self, *args)

    monkeypatch.setattr(store_type, "_forget_task_indexes", store_again_then_forget)
    if cancel == "by job id":
        delayq.cancel("order:1:close", key="order:1")
    else:
        delayq.cancel_key("order:1")
    monkeypatch.undo()

    assert interleaved and [job.args for job in delayq.pending()] == [[2]]
    assert _indexed(delayq, first.id, "order:1")
    assert delayq.revoke([first.id]) == 1


def test_a_reschedule_of_a_job_whose_task_id_index_is_damaged_still_moves_it(proj, delayq):
    """The index key holds another type (planted, or damaged): the job is rescheduled all
    the same, its index left as it is, as a cancel leaves it."""
    result = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close")
    store = delayq.store
    shard = store.keys.shard_for("order:1:close")
    index = store.keys.task_index(shard, pack_id(result.id))
    store.client.delete(index)
    store.client.rpush(index, "damaged")
    assert delayq.run_now("order:1:close")
    assert delayq.get("order:1:close").due.timestamp() < time.time() + 5
    assert store.client.type(index) == "list"


def test_delayq_revoke_takes_one_task_id_as_app_control_revoke_does(proj, delayq):
    """A string is one id, not its characters (each was cancelled as a task id)."""
    for task_id in ("a", "b", "ab"):
        proj.record.apply_delayed(args=(task_id,), delay=3600, job_id=task_id)

    assert delayq.revoke("ab") == 1

    assert sorted(job.job_id for job in delayq.pending()) == ["a", "b"]


@pytest.mark.parametrize("task_ids", [[5], ["ok", None], [b"ab"], None, 5],
                         ids=["an int", "None among ids", "bytes", "None", "one int"])
def test_a_task_id_no_task_can_have_is_refused_before_anything_is_cancelled(
        proj, delayq, task_ids):
    proj.record.apply_delayed(args=("ok",), delay=3600, job_id="ok")
    with pytest.raises(InvalidJobId, match="task id must be a string"):
        delayq.revoke(task_ids)
    assert [job.job_id for job in delayq.pending()] == ["ok"]


def test_a_uuid_object_revokes_its_task_as_its_text_does(proj, delayq):
    result = proj.record.apply_delayed(args=("x",), delay=3600)

    proj.app.control.revoke(uuid.UUID(result.id))

    assert delayq.pending() == []


@pytest.mark.parametrize("how", ["cancel", "revoke"])
@pytest.mark.parametrize("own_id", [True, False], ids=["own job id", "drawn job id"])
def test_the_result_of_a_replaced_call_cancels_its_job_and_both_results_are_revoked(
        proj, delayq, how, own_id):
    """A handle cancels the job of its job id, as every revoke does (a worker's, one made
    inside a transaction whose call the store kept): the replacement's result was left
    PENDING for ever, only the handle's own marked."""
    first = proj.record.apply_delayed(args=(1,), delay=3600,
                                      **({"job_id": "order:1:close"} if own_id else {}))
    second = proj.record.apply_delayed(args=(2,), delay=3600, job_id=first.job_id,
                                       if_exists="replace")
    assert first.id != second.id and first.job_id == second.job_id

    if how == "cancel":
        assert first.cancel() is True
    else:
        first.revoke()

    assert delayq.pending() == []
    assert AsyncResult(first.id, app=proj.app).state == states.REVOKED
    assert AsyncResult(second.id, app=proj.app).state == states.REVOKED


def test_the_result_of_a_call_stored_again_under_its_task_id_still_cancels_it(proj, delayq):
    """A retry stores its call again under the same job id and task id: the same call."""
    first = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close")
    proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close",
                              task_id=first.id, if_exists="replace")
    assert first.cancel() is True
    assert delayq.pending() == []


def test_cancel_by_job_id_cancels_the_job_of_that_id_whichever_call_it_is(proj, delayq):
    first = proj.record.apply_delayed(args=(1,), delay=3600, job_id="order:1:close")
    second = proj.record.apply_delayed(args=(2,), delay=3600, job_id="order:1:close",
                                       if_exists="replace")
    assert delayq.cancel("order:1:close") is True
    assert delayq.pending() == []
    assert AsyncResult(second.id, app=proj.app).state == states.REVOKED
    assert AsyncResult(first.id, app=proj.app).state == states.PENDING



def test_a_revoke_by_the_task_id_that_is_a_replaced_jobs_id_marks_both_calls_revoked(
        proj, delayq):
    """The job id of a call without one of its own is its task id: a revoke of that id
    cancels the job, whichever call it holds, and its result is REVOKED too."""
    first = proj.record.apply_delayed(args=(1,), delay=3600)
    second = proj.record.apply_delayed(args=(2,), delay=3600, job_id=first.job_id,
                                       if_exists="replace")

    assert delayq.revoke(first.id) == 1

    assert delayq.pending() == []
    assert AsyncResult(second.id, app=proj.app).state == states.REVOKED
    assert AsyncResult(first.id, app=proj.app).state == states.REVOKED
