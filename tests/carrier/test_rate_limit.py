"""Promotion rate limits per queue: shared by every carrier, oldest first, never early."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_delayq import ratelimit
from celery_delayq.carrier import Carrier
from celery_delayq.check import check
from celery_delayq.errors import ConfigurationError, DamagedShard, InvalidOption
from celery_delayq.store import releasing
from tests.conftest import PROMOTIONS, command_calls, store_keys, wait_for
from tests.faults.test_carrier_faults import carry_until_quiet

LIMITED, FREE = "parked.limited", "parked.free"  # no worker consumes them


def promotions(delayq) -> dict[str, tuple[int, int, int]]:
    """job id -> (promoted at, due, shard), Redis ms, from the journal."""
    found = {}
    for shard in delayq.store.keys:
        for entry_id, fields in delayq.store.client.xrange(shard.journal):
            if fields["event"] == "promoted":
                found[fields["job"]] = (int(entry_id.split("-")[0]), int(float(fields["due"])),
                                        shard.shard)
    return found


def _at(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def busiest_second(times: list[int]) -> int:
    """The most promotions in any window of 1,000 ms."""
    times = sorted(times)
    start, most = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1000:
            start += 1
        most = max(most, end - start + 1)
    return most


def publish_slack(delayq, carrier: Carrier, rate: int) -> float:
    """How many more than ``rate`` a 1-second window of the journal may hold. The buckets
    bound the claims. Through kombu a job is journaled when its round is acked, after the
    publish, so a window may also hold the round claimed just before it: one full bucket
    per shard (docs/operations.md, rate limits). Direct promotion journals in the claim."""
    if carrier.direct:
        return 0
    capacity = float(ratelimit.bucket(f"{rate}/s", delayq.store.keys.shards).split()[0])
    return capacity * delayq.store.keys.shards


def wave(proj, delayq, carrier_fixture, jobs: int, rate: int, free: int) -> None:
    """``jobs`` due at once on a queue limited to ``rate``/s, ``free`` jobs of an unlimited
    queue due a second later: check the limit, the order, and that nothing is lost or
    early, and that the free jobs did not wait for the wave."""
    delayq.set_rate_limit(LIMITED, f"{rate}/s")
    due_at = delayq.store.now_ms() + 1000 + jobs * 0.25  # after the scheduling below
    proj.record.apply_delayed_many(
        [{"args": (n,), "eta": _at(due_at + 1000 + n * 10), "job_id": f"free-{n}"}
         for n in range(free)], queue=FREE)
    for start in range(0, jobs, 5000):
        proj.record.apply_delayed_many(
            [{"args": (n,), "eta": _at(due_at), "job_id": f"lim-{n:06d}"}
             for n in range(start, min(start + 5000, jobs))], queue=LIMITED)
    assert delayq.store.now_ms() < due_at, "scheduling took longer than the test allows"
    # The carrier's count first: reading every journal at each poll took the carrier's
    # thread so much of the GIL that a 20,000 wave went at a third of its rate.
    wait_for(lambda: carrier_fixture.stats.promoted >= jobs + free
             and len(promotions(delayq)) == jobs + free, timeout=jobs / rate * 3 + 30,
             what=f"{jobs + free} promotions")

    found = promotions(delayq)
    limited = {job: at for job, at in found.items() if job.startswith("lim-")}
    assert len(limited) == jobs and all(at >= due for at, due, _ in found.values())
    assert busiest_second([at for at, _, _ in limited.values()]) <= rate + publish_slack(
        delayq, carrier_fixture, rate)
    assert max(at for at, _, _ in limited.values()) - due_at >= (jobs / rate - 1) * 1000
    per_shard = defaultdict(list)  # each shard's limited jobs, in the order promoted
    for _, due, shard in sorted(found[job] for job in limited):
        per_shard[shard].append(due)
    assert all(dues == sorted(dues) for dues in per_shard.values())
    free_lateness = [at - due for job, (at, due, _) in found.items() if job.startswith("free")]
    # Waiting for the limited queue's backlog would make them up to the wave's length late
    # (20 s for 20,000 at 1,000/s); a carrier round's publish is all they may wait for:
    # under 110 ms on kombu 5.7, ~1 s on kombu 5.3 (no batch publish) in a 20,000 wave.
    assert max(free_lateness) < max(1000, jobs / rate * 100), \
        "an unlimited queue waited for the limited one"
    assert sum(row["rate_limited"] for row in delayq.store.stats()) == 0


@pytest.mark.parametrize("carrier", PROMOTIONS, indirect=True)
def test_a_wave_on_a_limited_queue_goes_at_the_rate_and_other_queues_on_time(
        proj, delayq, carrier):
    wave(proj, delayq, carrier, jobs=300, rate=100, free=20)


@pytest.mark.slow
@pytest.mark.parametrize("carrier", PROMOTIONS, indirect=True)
def test_20000_due_at_once_on_a_queue_limited_to_1000_a_second(proj, delayq, carrier):
    wave(proj, delayq, carrier, jobs=20_000, rate=1000, free=200)


def test_the_live_limits_are_listed_past_a_damaged_limits_key(delayq, redis_client):
    store = delayq.store.client
    delayq.set_rate_limit(LIMITED, "1/h", by="test")
    store.set(delayq.store.keys.shard(0).limits, "not a hash")
    assert delayq.rate_limits() == {LIMITED: "1/h"}  # as every other shard holds it
    for shard in delayq.store.keys:
        store.set(shard.limits, "not a hash")
    with pytest.raises(DamagedShard, match=r"delayq:\{0\}:limits holds"):
        delayq.rate_limits()


def test_held_jobs_stay_pending_cancellable_and_go_at_once_when_the_limit_is_removed(
        proj, app, delayq):
    delayq.set_rate_limit(LIMITED, "1/h", by="test")
    assert delayq.rate_limits() == {LIMITED: "1/h"}
    for n in range(6):
        proj.record.apply_delayed(args=(n,), delay=0, queue=LIMITED, job_id=f"lim-{n}")
    carrier = Carrier(app)
    carrier.run_once()
    held = [job for job in delayq.pending(limit=10) if job.held == "rate limit"]
    assert len(held) == 6 - len(promotions(delayq)) >= 2  # a bucket holds 1 job per shard
    assert sum(row["rate_limited"] for row in delayq.store.stats()) == len(held)
    assert delayq.cancel(held[0].job_id) is True
    assert delayq.reschedule(held[1].job_id, delay=3600) is not None

    assert delayq.set_rate_limit(LIMITED, None, by="test") == len(held) - 2
    assert delayq.rate_limits() == {}
    carrier.run_once()
    carrier.close()
    assert set(promotions(delayq)) == {f"lim-{n}" for n in range(6)} - {
        held[0].job_id, held[1].job_id}
    events = [fields for shard in delayq.store.keys
              for _, fields in delayq.store.client.xrange(shard.journal)
              if fields["event"] == "rate_limit"]
    assert [(e["queue"], e["rate"], e["by"]) for e in events] == [
        (LIMITED, "1/h", "test"), (LIMITED, "off", "test")]


def test_removing_a_limit_gives_back_its_held_jobs_call_by_call(proj, delayq, monkeypatch):
    """The removal looks at RELEASE_CHUNK of the queue's held jobs per script call (one
    call for 200,000 held jobs took 1.6 s); another queue's limit keeps holding its own."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 4)
    for queue in (LIMITED, FREE):
        delayq.set_rate_limit(queue, "1/h")
    for queue, jobs in ((LIMITED, 14), (FREE, 7)):
        proj.record.apply_delayed_many([{"args": (n,), "delay": 0, "key": "tenant:1"}
                                        for n in range(jobs)], queue=queue)
    delayq.store.claim(list(delayq.store.keys), 100, 60_000)
    held = {queue: {job.job_id for job in delayq.pending(limit=100)
                    if job.held == "rate limit" and job.queue == queue}
            for queue in (LIMITED, FREE)}
    assert len(held[LIMITED]) >= 12 and len(held[FREE]) >= 5

    delayq.set_rate_limit("parked.other", None)  # the scripts loaded (NOSCRIPT calls count)
    before = command_calls(delayq.store)
    assert delayq.set_rate_limit(LIMITED, None) == len(held[LIMITED])
    shards = delayq.config.shards
    # the removal on every shard, then calls of 4 of the queue's waiting jobs on theirs
    # (the last one short), one call on each other shard
    assert command_calls(delayq.store) - before == (
        shards + len(held[LIMITED]) // 4 + 1 + shards - 1)
    assert {job.job_id for job in delayq.pending(limit=100)
            if job.held == "rate limit"} == held[FREE]


@contextlib.contextmanager
def rate_limits_setting(app, delayq, value: dict) -> Iterator[None]:
    """``delayq_rate_limits`` set to ``value`` (read again) for the block."""
    app.conf.delayq_rate_limits = value
    delayq.__dict__.pop("config", None)
    try:
        yield
    finally:
        app.conf.delayq_rate_limits = None
        delayq.__dict__.pop("config", None)


def test_the_setting_sets_limits_redis_lacks_and_never_undoes_a_removal(proj, app, delayq):
    delayq.set_rate_limit(LIMITED, None)
    with rate_limits_setting(app, delayq, {"refunds": "200/s", LIMITED: "5/m"}):
        carrier = Carrier(app)
        carrier.run_once()
        carrier.close()
    assert delayq.rate_limits() == {"refunds": "200/s"}


@pytest.mark.parametrize("rate", ["fast", "0/s", "-5/s", "10/d", float("nan"), True])
def test_a_rate_that_is_not_one_is_refused_and_writes_nothing(delayq, rate):
    with pytest.raises(InvalidOption, match=r"e\.g\. '200/s'"):
        delayq.set_rate_limit("refunds", rate)
    with pytest.raises(InvalidOption, match="queue="):
        delayq.set_rate_limit("", "5/s")
    assert [key for key in store_keys(delayq) if not key.endswith(":meta")] == []


def test_a_bad_rate_limits_setting_is_a_configuration_error(app, delayq):
    with rate_limits_setting(app, delayq, {"refunds": "lots"}), \
            pytest.raises(ConfigurationError, match=r"delayq_rate_limits\['refunds'\]"):
        delayq.config  # noqa: B018 - reading it validates it


def test_jobs_of_a_limited_queue_never_go_early(proj, app, delayq):
    delayq.set_rate_limit(LIMITED, "1000/s")
    proj.record.apply_delayed(args=(1,), delay=30, queue=LIMITED, job_id="later")
    carrier = Carrier(app)
    carrier.run_once()
    carrier.close()
    time.sleep(0.05)
    assert promotions(delayq) == {} and not delayq.get("later").held


def test_jobs_a_resume_gives_back_go_within_the_rate_limit(proj, app, delayq):
    delayq.pause(queue=LIMITED)
    delayq.set_rate_limit(LIMITED, "1/h")
    for n in range(12):
        proj.record.apply_delayed(args=(n,), delay=0, queue=LIMITED, job_id=f"lim-{n}")
    carrier = Carrier(app)
    carrier.run_once()
    assert [job.held for job in delayq.pending(limit=20)] == ["paused"] * 12

    assert delayq.resume(queue=LIMITED) == 12
    carrier.run_once()
    carrier.close()
    promoted = len(promotions(delayq))
    assert 1 <= promoted <= delayq.store.keys.shards  # one token per shard's bucket
    assert [job.held for job in delayq.pending(limit=20)] == ["rate limit"] * (12 - promoted)


@pytest.mark.parametrize(("rate", "bucket"), [
    ("nan nan 5/s", None), ("inf 1 5/s", None), ("0 0 5/s", None), ("garbage", None),
    (None, "nan 0"), (None, "-inf 1"), (None, "1 nan"), (None, "1e308 -1e308"),
])
def test_a_damaged_limit_or_bucket_never_stops_a_queue_for_good(proj, app, delayq, rate,
                                                                bucket):
    delayq.set_rate_limit(LIMITED, "1000/s")
    for shard in delayq.store.keys:
        if rate is not None:
            delayq.store.client.hset(shard.limits, f"rate:{LIMITED}", rate)
        if bucket is not None:
            delayq.store.client.hset(shard.limits, f"bucket:{LIMITED}", bucket)
    for n in range(8):
        proj.record.apply_delayed(args=(n,), delay=0, queue=LIMITED, job_id=f"lim-{n}")
    carrier = Carrier(app)
    try:
        wait_for(lambda: carrier.run_once() is not None and len(promotions(delayq)) == 8,
                 timeout=10, what="every job promoted")
    finally:
        carrier.close()


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_a_damaged_waiting_member_is_dropped_and_loses_no_job(proj, app, delayq, promotion):
    """The claim takes a queue's waiting jobs off the due set as it reads their members;
    a member whose due time is not a number stopped the script midway, so the jobs taken
    before it were in no set any more (orphans, never promoted)."""
    delayq.set_rate_limit(LIMITED, "1/m")
    proj.record.apply_delayed_many([{"args": (n,), "delay": 0, "job_id": f"lim-{n}"}
                                    for n in range(20)], queue=LIMITED)
    carry_until_quiet(app, direct=promotion == "direct")
    assert len(promotions(delayq)) == delayq.store.keys.shards  # one token per shard
    for shard in delayq.store.keys:  # read after the real members, and before them
        delayq.store.client.zadd(shard.waiting, {f"{LIMITED}\0zzz\0bad": 0,
                                                 f"{LIMITED}\0\0empty": 0})
    delayq.set_rate_limit(LIMITED, "100000/s")
    time.sleep(0.05)  # a whole token for every waiting job

    carry_until_quiet(app, direct=promotion == "direct")

    assert sorted(promotions(delayq)) == sorted(f"lim-{n}" for n in range(20))
    assert sum(sum(report.found.values()) for report in check(delayq.store)) == 0
    assert sum(delayq.store.client.zcard(shard.waiting) for shard in delayq.store.keys) == 0
