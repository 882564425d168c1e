"""``delayq check`` while a carrier and a producer write to the shard it scans: each test
runs the racing writes once, between two reads of the check's scan, on the real store."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from celery_delayq.check import _ShardCheck, check
from celery_delayq.held import split_score
from celery_delayq.keys import pack_id
from celery_delayq.store.claims import Promoted

KEY = "order:1"
PAST = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("repair", [False, True])
def test_a_stranded_job_is_found_while_a_carrier_claims_held_jobs_before_it(
        proj, delayq, monkeypatch, repair):
    """Between two pages of held jobs a carrier claims 100 from the front: a stranded job
    further on must still be looked at (read by offset, it moved to an offset already read)."""
    store, queue = delayq.store, delayq.store.config.default_queue
    shard = store.keys.shard_for("", KEY)
    delayq.set_rate_limit(queue, "1/h")
    proj.record.apply_delayed_many([
        {"args": (n,), "eta": PAST + timedelta(milliseconds=n), "key": KEY,
         "job_id": f"held-{n}"} for n in range(700)])
    store.claim([shard], 1000, 30_000)  # one job goes, 699 are held for the limit
    stranded = pack_id("held-551")
    [member] = [m for m in store.client.zrange(shard.waiting, 0, -1)
                if m.endswith("\x00" + stranded)]
    store.client.zrem(shard.waiting, member)  # its place in line is lost
    delayq.set_rate_limit(queue, "1000000/s")  # room for the carrier's next claim
    claimed = []
    look = _ShardCheck._stranded

    def look_then_claim(self, *args):
        found = look(self, *args)
        if self.shard == shard and not claimed:  # the carrier, between two pages
            claimed.extend(store.claim([shard], 100, 30_000)[0].jobs)
        return found

    monkeypatch.setattr(_ShardCheck, "_stranded", look_then_claim)

    [report] = [r for r in check(store, repair=repair) if r.shard == shard.shard]

    assert len(claimed) == 100
    assert report.found["stranded"] == 1 and report.examples["stranded"] == ["held-551"]
    due_ms = PAST.timestamp() * 1000 + 551
    assert split_score(store.client.zscore(shard.due, stranded)) == (
        due_ms, "" if repair else "rate limit")  # repaired: its due time back


def test_counts_are_not_repaired_from_a_scan_a_producer_and_a_carrier_wrote_under(
        proj, delayq, monkeypatch):
    """Between two HSCAN pages a producer adds a job of A (to come) and one of B (passed),
    and a carrier acks a job of A (seen) and one of B (to come): the length of ``jobs``,
    the fields scanned and ``counts`` all agree, yet the scan counted A once too many and
    B once too few. The counts are left unchecked, not set to that."""
    store, a, b = delayq.store, proj.record, proj.anything
    shard = store.keys.shard_for("", KEY)
    for task, prefix in ((a, "a"), (b, "b")):
        task.apply_delayed_many([{"args": (n,), "eta": PAST, "key": KEY,
                                  "job_id": f"{prefix}-{n}"} for n in range(450)])
    leased = {job.job_id: job for job in store.claim([shard], 2000, 600_000)[0].jobs}
    client = store.client
    scan = client.hscan

    def comes_later(cursor: int, field: str) -> bool:
        """Whether an HSCAN going on from ``cursor`` would return ``field`` if it were
        there: it is written for the look, and taken away again."""
        client.hset(shard.jobs, field, "")
        try:
            while cursor:
                cursor, page = scan(shard.jobs, cursor, count=500)
                if field in page:
                    return True
            return False
        finally:
            client.hdel(shard.jobs, field)

    def ack(job_id: str, task) -> None:
        job = leased[job_id]
        store.ack({shard: [Promoted(job_id, task.name, KEY, job.due_ms or 0, job.stored_id,
                                    job.lease)]})

    raced = []

    def page_then_race(name, cursor=0, **options):
        cursor_after, page = scan(name, cursor, **options)
        if name == shard.jobs and not raced:
            raced.append(cursor_after)
            a.apply_delayed(args=("new",), delay=600, key=KEY, job_id=next(
                f"a-new-{n}" for n in range(500) if comes_later(cursor_after, f"a-new-{n}")))
            b.apply_delayed(args=("new",), delay=600, key=KEY, job_id=next(
                f"b-new-{n}" for n in range(500) if not comes_later(cursor_after, f"b-new-{n}")))
            ack(next(f for f in page if f.startswith("a-")), a)
            ack(next(f"b-{n}" for n in range(450) if f"b-{n}" not in page), b)
        return cursor_after, page

    monkeypatch.setattr(client, "hscan", page_then_race)

    [report] = [r for r in check(store, repair=True) if r.shard == shard.shard]

    assert raced and raced[0] != 0  # the race ran between two pages
    assert not report.counts_checked and report.found["counts"] == 0
    assert store.counts()[0] == {a.name: 450, b.name: 450}


def test_counts_are_unchecked_without_a_journal(proj, delayq, monkeypatch):
    """With ``delayq_journal_maxlen = 0`` no write leaves a trace a check could compare,
    so it cannot tell a quiet scan: a wrong count is reported unchecked, not repaired."""
    store = delayq.store
    proj.record.apply_delayed(args=(1,), delay=600, key=KEY)
    shard = store.keys.shard_for("", KEY)
    store.client.hincrby(shard.counts, proj.record.name, 5)
    monkeypatch.setattr(store, "config", dataclasses.replace(store.config, journal_maxlen=0))

    reports = check(store, repair=True)

    assert not any(r.counts_checked for r in reports)
    assert sum(r.found["counts"] for r in reports) == 0
    assert store.counts()[0] == {proj.record.name: 6}
