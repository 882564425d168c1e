"""A claim sent ahead: written to Redis at once, its reply read after other work."""

from __future__ import annotations

import pytest

from celery_delayq.errors import StoreUnavailable
from celery_delayq.store import Promoted
from tests.conftest import CLUSTER, journal_events

LEASE_MS = 30_000


def schedule_due(proj, n: int) -> list[str]:
    results = proj.record.apply_delayed_many([{"args": (i,), "delay": 0} for i in range(n)])
    return [r.job_id for r in results]


def promoted(proj, claims) -> dict:
    """The acks of every claimed job, as a carrier makes them once they are published."""
    return {c.shard: [Promoted(j.job_id, proj.record.name, None, j.due_ms, j.stored_id)
                      for j in c.jobs] for c in claims if c.jobs}


def test_a_claim_sent_ahead_acks_the_batch_before_and_claims_the_next(proj, delayq):
    jobs = schedule_due(proj, 40)
    store, shards = delayq.store, list(delayq.store.keys)
    first = store.claim(shards, 2, LEASE_MS)
    ahead = store.claim_ahead(shards, 2, LEASE_MS, acks=promoted(proj, first))
    second = ahead.result()

    first_ids = {j.job_id for c in first for j in c.jobs}
    second_ids = {j.job_id for c in second for j in c.jobs}
    assert first_ids and second_ids and not first_ids & second_ids
    assert first_ids | second_ids <= set(jobs)
    assert {delayq.get(job_id) for job_id in first_ids} == {None}  # acked: forgotten
    assert {delayq.get(job_id).state for job_id in second_ids} == {"claimed"}
    assert journal_events(delayq).count("promoted") == len(first_ids)


def test_a_claim_sent_ahead_loads_the_scripts_redis_forgot(proj, delayq):
    jobs = schedule_due(proj, 5)
    delayq.store.client.script_flush()
    claims = delayq.store.claim_ahead(list(delayq.store.keys), 10, LEASE_MS).result()
    assert sorted(j.job_id for c in claims for j in c.jobs) == sorted(jobs)


@pytest.mark.skipif(CLUSTER, reason="pauses and kills clients of the single test Redis")
def test_a_claim_ahead_whose_connection_is_killed_fails_cleanly(proj, delayq, redis_client):
    jobs = schedule_due(proj, 5)
    store, shards = delayq.store, list(delayq.store.keys)
    redis_client.client_pause(5000, all=False)  # writes wait: the claim sent cannot run
    ahead = store.claim_ahead(shards, 10, LEASE_MS)
    redis_client.client_kill_filter(_type="normal", skipme=True)
    redis_client.client_unpause()
    with pytest.raises(StoreUnavailable, match="is unavailable"):
        ahead.result()
    assert {delayq.get(job_id).state for job_id in jobs} == {"scheduled"}
    assert all(c.now_ms > 0 for c in store.claim(shards, 10, LEASE_MS))  # connections work
