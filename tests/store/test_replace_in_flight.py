"""Replacing a job while a carrier holds it: the old copy's ack, release or dead-letter
leaves the replacement alone, even once the replacement is claimed too.

Each claim leases its jobs under a token of its own (claim_due's lease: the deadline with
the call's microseconds as decimals), and ack / release / dead act only on their lease.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from celery_delayq.store import Promoted

PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)


def test_ack_of_the_old_copy_leaves_a_replacement_claimed_meanwhile(proj, delayq):
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j")
    (old,) = [job for claim in store.claim(shards, 10, 60_000) for job in claim.jobs]
    proj.record.apply_delayed(args=("new",), eta=PAST, job_id="j", if_exists="replace")
    (new,) = [(claim.shard, job) for claim in store.claim(shards, 10, 60_000)
              for job in claim.jobs]
    shard, _ = new
    store.ack({shard: [Promoted("j", proj.record.name, None, old.due_ms, old.stored_id,
                                old.lease)]})

    assert store.client.zscore(shard.inflight, "j") is not None, "replacement's lease gone"
    assert store.client.hget(shard.jobs, "j") is not None, "replacement's envelope gone"


@pytest.mark.parametrize("step", ["release", "dead_letter"])
def test_release_or_dead_letter_of_the_old_copy_leaves_the_replacement(proj, delayq, step):
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j")
    (claim,) = [claim for claim in store.claim(shards, 10, 60_000) if claim.jobs]
    proj.record.apply_delayed(args=("new",), eta=PAST, job_id="j", if_exists="replace")
    if step == "release":
        assert store.release([claim]) == 1  # due now again, as the replacement is
    else:
        assert store.dead_letter(claim.shard, claim.jobs[0], "cannot publish")
    assert store.dead() == []
    (job,) = delayq.pending()
    assert (job.job_id, job.args) == ("j", ["new"])
    (again,) = [job for claim in store.claim(shards, 10, 60_000) for job in claim.jobs]
    assert again.envelope is not None and '"new"' in again.envelope
