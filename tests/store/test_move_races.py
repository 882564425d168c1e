"""Cancel and reschedule racing a producer whose replace moves the job to another shard
(a business key of another shard), or replaces it under the same task id.

Each race is forced: the producer's call is made at the moment named, in a thread given
half a second (``meanwhile``): a producer that has to wait for the id's reservation, which
the cancel or reschedule holds, writes after it instead.
"""

from __future__ import annotations

import time

import pytest

from celery_delayq.keys import pack_id
from celery_delayq.scripts import Script
from celery_delayq.store import TASK_INDEX_GRACE_MS
from celery_delayq.store.producing import CancelOutcome, Producing
from tests.store.test_one_id_one_job import keys_on_two_shards, meanwhile, stored_copies

JOB = "close-42"
CANCELS = {"cancel": lambda store: store.cancel(JOB),
           "cancel_task": lambda store: store.cancel_task(JOB)}  # its task id is its job id


def replace_after_the_look(proj, monkeypatch, key: str) -> list:
    """Make the next look for the job's shards be followed by a producer replacing it under
    ``key``; the list gets that producer's (thread, outcome)."""
    look, producers = Producing._shards_holding, []

    def then_replace(self, *args, **kwargs):
        found = look(self, *args, **kwargs)
        if not producers:
            producers.append(meanwhile(lambda: proj.record.apply_delayed(
                args=("new",), delay=600, job_id=JOB, key=key, if_exists="replace")))
        return found

    monkeypatch.setattr(Producing, "_shards_holding", then_replace)
    return producers


def own_key(delayq) -> str:
    """A business key of the job id's own shard (where the job lives without a key)."""
    shard_for = delayq.store.keys.shard_for
    return next(f"o:{n}" for n in range(1000) if shard_for("", f"o:{n}") is shard_for(JOB))


@pytest.mark.parametrize("cancel", list(CANCELS))
def test_a_cancel_misses_no_job_a_replace_moves_to_the_ids_own_shard(
        proj, delayq, monkeypatch, cancel):
    """The cancel looked, then the producer moved the job to the id's own shard: the
    cancel answered "unknown" and left the job pending. Now the producer waits for it."""
    other, _ = keys_on_two_shards(delayq, JOB)
    proj.record.apply_delayed(args=("old",), delay=600, job_id=JOB, key=other)
    producers = replace_after_the_look(proj, monkeypatch, own_key(delayq))

    cancelled = CANCELS[cancel](delayq.store)
    [(thread, outcome)] = producers
    thread.join()

    assert cancelled.outcome is CancelOutcome.CANCELLED
    assert stored_copies(delayq, JOB) == 1  # the replace came after: the old job was gone
    assert [(j.args, j.task_id) for j in delayq.pending()] == [
        (["new"], outcome["returned"].id)]


@pytest.mark.parametrize("call", ["reschedule", "run_now"])
def test_a_reschedule_finds_a_job_a_replace_moves_meanwhile(proj, delayq, monkeypatch, call):
    """The reschedule looked (the job under a key of one shard), then the producer moved
    it under a key of another: the pending job was called not pending."""
    first, second = keys_on_two_shards(delayq, JOB)
    proj.record.apply_delayed(args=("old",), delay=600, job_id=JOB, key=first)
    producers = replace_after_the_look(proj, monkeypatch, second)

    if call == "reschedule":
        assert delayq.reschedule(JOB, delay=900) is not None
    else:
        assert delayq.run_now(JOB)
    [(thread, _)] = producers
    thread.join()

    assert [(j.args, j.key) for j in delayq.pending()] == [(["new"], second)]


def index_ttl_ms(delayq, task_id: str) -> int:
    store = delayq.store
    return store.client.pttl(store.keys.task_index(store.keys.shard_for(JOB),
                                                   pack_id(task_id)))


def test_a_reschedule_leaves_the_index_of_a_replace_made_meanwhile_its_due_time(
        proj, delayq, monkeypatch):
    """The app replaced the job (same task id, due in 3 days) just after the reschedule's
    script ran: the index expiry the store then set was the rescheduled job's, a day past
    a minute from now, so a revoke a day later missed the job due in 3 days."""
    proj.record.apply_delayed(args=("old",), delay=3600, job_id=JOB, task_id="task-T")
    call, replaced = Script.call, []

    def then_replace(self, client, keys, args):
        reply = call(self, client, keys, args)
        if self.name == "reschedule" and not replaced:
            replaced.append(proj.record.apply_delayed(
                args=("new",), delay=3 * 86_400, job_id=JOB, task_id="task-T",
                if_exists="replace"))
        return reply

    monkeypatch.setattr(Script, "call", then_replace)
    delayq.reschedule(JOB, delay=60)

    [job] = delayq.pending()
    due_in_ms = job.due.timestamp() * 1000 - time.time() * 1000
    assert index_ttl_ms(delayq, "task-T") > due_in_ms + TASK_INDEX_GRACE_MS - 5_000


def test_a_reschedule_leaves_alone_the_index_naming_another_job(proj, delayq):
    """The task id index names another job that has the task id now: its expiry is that
    job's, not the rescheduled one's."""
    proj.record.apply_delayed(args=("old",), delay=3600, job_id=JOB, task_id="task-T")
    shard_for = delayq.store.keys.shard_for
    other = next(f"other-{n}" for n in range(1000) if shard_for(f"other-{n}") is shard_for(JOB))
    proj.record.apply_delayed(args=("other",), delay=3 * 86_400, job_id=other,
                              task_id="task-T")

    assert delayq.reschedule(JOB, delay=60) is not None

    assert index_ttl_ms(delayq, "task-T") > 3 * 86_400_000 + TASK_INDEX_GRACE_MS - 5_000
