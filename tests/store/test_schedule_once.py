"""A run's rows (``RunRows``, what a Spark job schedules) are each written at most once in
the run: a call made again (a retried task, a recomputed partition) answers the first
outcome and writes nothing; another row with a job id the run already gave is a duplicate."""

from __future__ import annotations

import pytest

from celery_delayq import validation
from celery_delayq.store import Promoted, RunRows, ScheduleCode
from tests.unit.calls import build

WRITES = ("hset", "hsetnx", "hdel", "zadd", "zrem", "xadd", "hincrby")


def writes(client) -> int:
    """Job-writing commands Redis ran so far (a script's commands count)."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in WRITES)


def items(proj, delayq, ids: list[str], delay: float = 60):
    config = delayq.config
    return [(build(proj.app, proj.record.name, [job_id], job_id=job_id),
             validation.due(delay, None, config.max_delay))
            for job_id in ids]


def rows(run: str, ids: list[str], partition: int = 0) -> RunRows:
    return RunRows(run, [f"{partition}:{n}" for n in range(len(ids))])


@pytest.mark.parametrize("if_exists", ["keep", "replace", "error"])
def test_a_call_made_again_answers_its_first_outcome_and_writes_nothing(
        proj, delayq, if_exists):
    store, client = delayq.store, delayq.store.client
    ids = [f"row-{n}" for n in range(30)]
    store.schedule(items(proj, delayq, ids[:10]), "keep")  # ten stored before the run
    start = writes(client)
    first = store.schedule(items(proj, delayq, ids), if_exists, rows("run-1", ids))
    pending = delayq.pending(limit=100)
    before = writes(client)
    assert before > start  # the count sees a script's writes

    again = store.schedule(items(proj, delayq, ids), if_exists, rows("run-1", ids))

    assert writes(client) == before
    assert [r.code for r in again] == [r.code for r in first]
    assert delayq.pending(limit=100) == pending


def test_a_call_made_again_after_its_jobs_ran_does_not_store_them_again(proj, delayq):
    store = delayq.store
    ids = [f"row-{n}" for n in range(20)]
    first = store.schedule(items(proj, delayq, ids, delay=0), "keep", rows("run-2", ids))
    assert {r.code for r in first} == {ScheduleCode.CREATED}
    claims = store.claim(list(store.keys), 100, 60_000)
    store.ack({claim.shard: [Promoted(job.job_id, proj.record.name, None, job.due_ms,
                                      job.stored_id, job.lease) for job in claim.jobs]
               for claim in claims if claim.jobs})
    assert delayq.pending() == []

    again = store.schedule(items(proj, delayq, ids, delay=0), "keep", rows("run-2", ids))

    assert [r.code for r in again] == [ScheduleCode.CREATED] * 20
    assert delayq.pending() == []


def test_another_row_with_an_id_the_run_gave_is_a_duplicate(proj, delayq):
    store = delayq.store
    store.schedule(items(proj, delayq, ["a", "b"]), "replace", rows("run-3", ["a", "b"], 0))
    results = store.schedule(items(proj, delayq, ["b", "c"]), "replace",
                             rows("run-3", ["b", "c"], 1))
    assert [r.code for r in results] == [ScheduleCode.DUPLICATE, ScheduleCode.CREATED]
    assert sorted(job.job_id for job in delayq.pending()) == ["a", "b", "c"]


def test_a_forgotten_run_keeps_nothing_and_is_freed_without_blocking_redis(proj, delayq):
    """A large run's outcome (a hash per shard, a field per row) is unlinked: Redis frees
    it in the background instead of stalling every client, carriers included."""
    store = delayq.store
    store.schedule(items(proj, delayq, ["a"]), "keep", rows("run-4", ["a"]))
    store.client.config_resetstat()
    store.forget_run("run-4")
    assert [key for key in store.client.scan_iter("delayq:*outcome*")] == []
    assert "cmdstat_del" not in store.client.info("commandstats")
