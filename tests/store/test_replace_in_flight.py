"""Replacing a job while a carrier holds it: the old copy's ack, release or dead-letter
leaves the replacement alone, even once the replacement is claimed too, or when it moved
to a business key of another shard.

Each claim leases its jobs under a token of its own (claim_due's lease: the deadline with
the call's microseconds as decimals), and ack / release / dead act only on their lease.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from celery_delayq.check import check
from celery_delayq.keys import KEPT
from celery_delayq.store import CancelOutcome, Promoted
from tests.store.test_one_id_one_job import keys_on_two_shards, stored_copies

PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)


def kept_fields(store) -> list[str]:
    """The envelopes kept for copies in flight (keys.py, invariant 8), on every shard."""
    return [name for shard in store.keys for name in store.client.hkeys(shard.jobs)
            if name.startswith(KEPT)]


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
    _, claimed = new
    store.ack({shard: [Promoted("j", proj.record.name, None, claimed.due_ms, claimed.stored_id,
                                claimed.lease)]})
    assert kept_fields(store) == []  # the old copy's, kept until the id was leased again
    assert [report.found for report in check(store) if report.found] == []


@pytest.mark.parametrize("step", ["ack", "release", "dead_letter"])
def test_ack_release_or_dead_letter_of_the_old_copy_leaves_the_replacement(proj, delayq, step):
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j")
    (claim,) = [claim for claim in store.claim(shards, 10, 60_000) if claim.jobs]
    proj.record.apply_delayed(args=("new",), eta=PAST, job_id="j", if_exists="replace")
    (old,) = claim.jobs
    if step == "ack":
        store.ack({claim.shard: [Promoted("j", proj.record.name, None, old.due_ms,
                                          old.stored_id, old.lease)]})
    elif step == "release":
        assert store.release([claim]) == 1  # due now again, as the replacement is
    else:
        assert store.dead_letter(claim.shard, old, "cannot publish")
    assert store.dead() == []
    assert kept_fields(store) == []  # the old copy's envelope went with its lease
    (job,) = delayq.pending()
    assert (job.job_id, job.args) == ("j", ["new"])
    (again,) = [job for claim in store.claim(shards, 10, 60_000) for job in claim.jobs]
    assert again.envelope is not None and '"new"' in again.envelope


def after_zero_leases() -> None:
    """Wait until a lease of 0 has ended: its deadline is the claim's millisecond with the
    claim's microseconds as decimals, and recover takes deadlines up to Redis's whole ms."""
    time.sleep(0.002)


@pytest.mark.parametrize("step", ["ack", "release", "dead_letter", "recover"])
def test_the_old_copy_of_a_job_moved_to_another_key_in_flight_never_comes_back(
        proj, delayq, step):
    store, shards = delayq.store, list(delayq.store.keys)
    old_key, new_key = keys_on_two_shards(delayq, "j")
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j", key=old_key)
    lease_ms = 0 if step == "recover" else 60_000  # a lease of 0 ends at once
    (claim,) = [claim for claim in store.claim(shards, 10, lease_ms) if claim.jobs]
    proj.record.apply_delayed(args=("new",), delay=60, job_id="j", key=new_key,
                              if_exists="replace")
    (old,) = claim.jobs
    if step == "ack":
        store.ack({claim.shard: [Promoted("j", proj.record.name, old_key, old.due_ms,
                                          old.stored_id, old.lease)]})
    elif step == "release":
        store.release([claim])
    elif step == "dead_letter":
        store.dead_letter(claim.shard, old, "cannot publish")
    else:
        after_zero_leases()
        store.recover(shards, 100)

    assert [(job.job_id, job.args, job.key) for job in delayq.pending()] == [
        ("j", ["new"], new_key)]
    assert stored_copies(delayq, "j") == 1
    assert store.dead() == []
    assert [report.found for report in check(store)] == [Counter()] * len(shards)


def test_cancel_is_too_late_while_the_old_copy_of_a_moved_job_is_in_flight(proj, delayq):
    store, shards = delayq.store, list(delayq.store.keys)
    old_key, new_key = keys_on_two_shards(delayq, "j")
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j", key=old_key)
    store.claim(shards, 10, 60_000)
    proj.record.apply_delayed(args=("new",), delay=60, job_id="j", key=new_key,
                              if_exists="replace")

    assert delayq.cancel_outcome("j") is CancelOutcome.TOO_LATE
    assert delayq.pending() == []
    assert [report.found for report in check(store)] == [Counter()] * len(shards)


def test_a_copy_recovered_after_its_pending_twin_was_cancelled_is_found_by_its_key(
        proj, delayq):
    """Cancelling the pending copy of a job scheduled again while in flight removes its key
    index entry; the copy in flight is still owed a delivery. When its carrier dies, recover
    makes that copy pending again: it is listed and cancelled by its key like any other."""
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("a",), eta=PAST, job_id="j", key="order:7")
    assert [job for claim in store.claim(shards, 10, 0) for job in claim.jobs]  # lease 0: lost
    proj.record.apply_delayed(args=("a",), eta=PAST, job_id="j", key="order:7",
                              if_exists="replace")
    assert delayq.cancel_outcome("j") is CancelOutcome.TOO_LATE

    after_zero_leases()
    assert store.recover(shards, 10) == (1, {})
    assert [job.job_id for job in delayq.pending(key="order:7")] == ["j"]
    assert sum(sum(report.found.values()) for report in check(store)) == 0
    assert delayq.cancel_key("order:7") == 1
    assert delayq.pending() == []


def test_counts_follow_the_envelope_a_cancel_gives_back_to_the_copy_in_flight(proj, delayq):
    """Replaced in flight by a call of another task, then that replacement cancelled: the
    old copy's envelope is back, counted under its task, and its ack counts it down (a
    Hypothesis run of test_store_model once found these counts drifting)."""
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("stays",), delay=3600, job_id="other")
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j")
    (claim,) = [claim for claim in store.claim(shards, 10, 60_000) if claim.jobs]
    (old,) = claim.jobs
    proj.flaky.apply_delayed(args=("new",), delay=3600, job_id="j", if_exists="replace")
    assert store.counts()[0] == {proj.record.name: 1, proj.flaky.name: 1}
    assert delayq.cancel_outcome("j") is CancelOutcome.TOO_LATE
    assert store.counts()[0] == {proj.record.name: 2}
    store.ack({claim.shard: [Promoted("j", proj.record.name, None, old.due_ms,
                                      old.stored_id, old.lease)]})
    assert store.counts()[0] == {proj.record.name: 1}
    assert [report.found for report in check(store) if report.found] == []
    assert kept_fields(store) == []

def lost_claim_then_cancelled_replacement(proj, delayq, key: str | None = None):
    """``record("old")`` claimed under a lease of 0 (its carrier dies), replaced in flight
    by ``flaky("new")``, and that replacement cancelled: "too late", the old call is owed."""
    store, shards = delayq.store, list(delayq.store.keys)
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j", key=key)
    (claim,) = [claim for claim in store.claim(shards, 10, 0) if claim.jobs]
    proj.flaky.apply_delayed(args=("new",), delay=3600, job_id="j", key=key,
                             if_exists="replace")
    assert delayq.cancel_outcome("j") is CancelOutcome.TOO_LATE
    return claim


@pytest.mark.parametrize("key", [None, "order:7"])
def test_a_cancelled_replacement_never_runs_when_the_carrier_of_the_old_call_dies(
        proj, delayq, key):
    """The cancel said "too late": the call in flight runs. If its carrier dies before
    publishing it, recover makes that call pending again, not the cancelled one."""
    store, shards = delayq.store, list(delayq.store.keys)
    lost_claim_then_cancelled_replacement(proj, delayq, key)
    after_zero_leases()
    assert store.recover(shards, 10) == (1, {})

    assert [(job.task, job.args, job.key) for job in delayq.pending()] == [
        (proj.record.name, ["old"], key)]
    assert store.counts()[0] == {proj.record.name: 1}
    assert [report.found for report in check(store) if report.found] == []


def test_a_cancelled_replacement_is_not_what_the_old_calls_carrier_dead_letters(proj, delayq):
    store = delayq.store
    claim = lost_claim_then_cancelled_replacement(proj, delayq)
    assert store.dead_letter(claim.shard, claim.jobs[0], "cannot publish")

    (letter,) = store.dead()
    assert '"old"' in letter["envelope"] and proj.record.name in letter["envelope"]
    assert store.counts()[0] == {}


def test_the_envelope_kept_for_a_copy_in_flight_is_no_job_of_its_own(proj, delayq):
    """Its field in ``jobs`` is the job id behind a control character: asked for by that
    name (ids with control characters are refused when scheduling, not when looking up),
    nothing is found."""
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j")
    delayq.store.claim(list(delayq.store.keys), 10, 60_000)
    proj.record.apply_delayed(args=("new",), delay=3600, job_id="j", if_exists="replace")

    assert delayq.get(KEPT + "j") is None
    assert delayq.cancel_outcome(KEPT + "j") is CancelOutcome.UNKNOWN
    assert [job.args for job in delayq.pending()] == [["new"]]


def test_a_job_moved_away_in_flight_and_back_then_cancelled_gives_back_the_held_call(
        proj, delayq):
    """The held copy's envelope is kept when the job moves to another shard, for the case
    it comes back and that call is cancelled: then the carrier's call is what stays."""
    store, shards = delayq.store, list(delayq.store.keys)
    old_key, new_key = keys_on_two_shards(delayq, "j")
    proj.record.apply_delayed(args=("old",), eta=PAST, job_id="j", key=old_key)
    assert [job for claim in store.claim(shards, 10, 0) for job in claim.jobs]
    for key, args in ((new_key, ("moved",)), (old_key, ("back",))):
        proj.flaky.apply_delayed(args=args, delay=3600, job_id="j", key=key,
                                 if_exists="replace")
    assert delayq.cancel_outcome("j") is CancelOutcome.TOO_LATE
    after_zero_leases()
    assert store.recover(shards, 10) == (1, {})

    assert [(job.task, job.args, job.key) for job in delayq.pending()] == [
        (proj.record.name, ["old"], old_key)]
    assert stored_copies(delayq, "j") == 1
    assert [report.found for report in check(store) if report.found] == []
