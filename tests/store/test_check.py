"""``delayq check [--repair]``: every kind of damage is reported with its count, repair
fixes it without losing a job (orphans are dead-lettered), and a second check is clean."""

from __future__ import annotations

import os
import subprocess
import threading

from celery_delayq.carrier import Carrier
from celery_delayq.check import check
from celery_delayq.keys import KEPT, pack_id
from tests.conftest import ROOT, celery_cli


def cli_check(redis_server, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=redis_server.url, PYTHONPATH=ROOT)
    return subprocess.run(celery_cli("delayq", "check", *args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_check_reports_each_kind_of_damage_and_repair_loses_no_job(proj, delayq, redis_client,
                                                                     redis_server):
    store, record = delayq.store, proj.record
    client = store.client  # the store's Redis: a cluster in the cluster pass
    ids = [record.apply_delayed(args=(f"j{n}",), delay=600, key=f"order-{n % 3}",
                                job_id=f"job-{n}").job_id for n in range(30)]
    clean = check(store)
    assert sum(sum(r.found.values()) for r in clean) == 0
    assert sum(r.jobs for r in clean) == 30

    def shard_of(n):
        return store.keys.shard_for(ids[n], f"order-{n % 3}")

    client.zadd(shard_of(0).due, {"ghost-due": 1})  # 1: a due member, no envelope
    client.zadd(shard_of(0).inflight, {"ghost-inflight": 1})  # 2: same, in flight
    client.hset(shard_of(0).jobs, KEPT + "ghost-inflight", "{}")  # 8: goes with that lease
    client.zrem(shard_of(1).due, pack_id(ids[1]))  # 3: an orphaned envelope
    client.zadd(shard_of(2).bykey, {"order-9\x00nosuchjob": 0})  # 5: job gone
    client.zadd(shard_of(2).bykey, {f"order-7\x00{pack_id(ids[2])}": 0})  # other key
    client.hincrby(shard_of(3).counts, "tests.proj.record", 5)  # 6: a wrong count
    client.zadd(shard_of(4).inflight, {pack_id(ids[4]): 1})  # 4: legal, not damage
    client.hset(shard_of(5).jobs, KEPT + "ghost-kept", "{}")  # 8: kept, no lease
    client.hset(shard_of(4).jobs, KEPT + pack_id(ids[4]), "{}")  # 8: legal, its lease holds

    found = check(store)
    totals = {kind: sum(r.found[kind] for r in found)
              for kind in ("dangling_due", "dangling_inflight", "orphaned", "dangling_bykey",
                           "counts", "dangling_kept")}
    assert totals == {"dangling_due": 1, "dangling_inflight": 1, "orphaned": 1,
                      "dangling_bykey": 2, "counts": 1, "dangling_kept": 1}
    assert sum(r.in_both for r in found) == 1

    reported = cli_check(redis_server)
    assert reported.returncode == 1, reported.stdout + reported.stderr
    assert "1 orphaned" in reported.stdout and "2 dangling bykey" in reported.stdout
    assert "job-1" in reported.stdout and "ghost-kept" in reported.stdout

    repaired = cli_check(redis_server, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    again = cli_check(redis_server)
    assert again.returncode == 0 and "clean: 29 jobs" in again.stdout, again.stdout
    assert [field for shard in store.keys for field in client.hkeys(shard.jobs)
            if field.startswith(KEPT)] == [KEPT + pack_id(ids[4])]

    dead = store.dead()
    assert [entry["job_id"] for entry in dead] == ["job-1"]
    assert dead[0]["reason"].startswith("orphaned")
    assert store.replay("job-1")
    pending = {job.job_id for job in delayq.pending(limit=100)}
    assert pending == set(ids)  # every job is back or was never touched
    assert delayq.store.counts()[0] == {"tests.proj.record": 30}


def test_jobs_held_by_a_pause_or_limit_that_is_gone_are_reported_and_released(
        proj, app, delayq, redis_server):
    """A held job waits for its pause's resume or its limit's room. When the record of
    the pause or of the limit's queue is gone (a key deleted by hand, a restore), nothing
    would ever release it: check names it and repair gives it its due time back."""
    from datetime import datetime, timedelta, timezone

    from tests.carrier.test_pause import PARKED, serve_once

    past = datetime(2026, 1, 1, tzinfo=timezone.utc)
    store, client = delayq.store, delayq.store.client
    delayq.pause(task=proj.record.name)
    delayq.pause(task=proj.flaky.name)
    delayq.set_rate_limit(PARKED, "1/h")  # one job goes, the next two wait for room
    for n in range(3):
        proj.record.apply_delayed(args=(n,), eta=past, job_id=f"paused-{n}", key="order:1")
        proj.flaky.apply_delayed(args=(n, 0), eta=past, job_id=f"still-{n}", key="order:2")
        proj.slow.apply_delayed(args=(f"l{n}",), eta=past + timedelta(seconds=n), queue=PARKED,
                                 job_id=f"limited-{n}", key="order:3")
    serve_once(app)
    assert sum(sum(r.found.values()) for r in check(store)) == 0  # held for a reason

    for shard in store.keys:
        client.hdel(shard.paused, f"task:{proj.record.name}")  # its pause record is gone
    waiting = store.keys.shard_for("", "order:3").waiting
    assert client.zcard(waiting) == 2
    client.zpopmin(waiting)  # the oldest waiting job lost its place in line

    found = check(store)
    assert sum(r.found["stranded"] for r in found) == 4  # 3 paused, 1 limited
    reported = cli_check(redis_server)
    assert reported.returncode == 1 and "4 stranded" in reported.stdout, reported.stdout
    assert "paused-0" in reported.stdout and "limited-1" in reported.stdout

    repaired = cli_check(redis_server, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert [(job.job_id, job.held, job.due) for job in delayq.pending(key="order:1")] == [
        (f"paused-{n}", "", past) for n in range(3)]
    assert delayq.get("still-0").paused  # its pause is still in force
    assert cli_check(redis_server).returncode == 0
    serve_once(app)  # no pause holds them: promoted; the limited job goes on waiting
    assert delayq.pending(key="order:1") == []
    assert delayq.get("limited-1").held == "rate limit"


def test_jobs_waiting_for_a_limit_whose_value_is_damaged_are_stranded(proj, app, delayq):
    """A damaged limit limits nothing, so no claim takes its waiting jobs any more."""
    from datetime import datetime, timezone

    from tests.carrier.test_pause import PARKED, serve_once

    delayq.set_rate_limit(PARKED, "1/h")
    for n in range(3):
        proj.slow.apply_delayed(args=(f"l{n}",), eta=datetime(2026, 1, 1, tzinfo=timezone.utc),
                                queue=PARKED, job_id=f"limited-{n}", key="order:3")
    serve_once(app)
    assert sum(sum(r.found.values()) for r in check(delayq.store)) == 0
    limits = delayq.store.keys.shard_for("", "order:3").limits
    delayq.store.client.hset(limits, f"rate:{PARKED}", "nan nan 1/h")
    assert sum(r.found["stranded"] for r in check(delayq.store, repair=True)) == 2
    serve_once(app)
    assert delayq.pending(key="order:3") == []


def test_check_counts_a_job_whose_first_line_nests_too_deep_without_failing(proj, delayq):
    store = delayq.store
    proj.record.apply_delayed(args=("ok",), delay=600, job_id="ok")
    shard = store.keys.shard_for("deep")
    deep = '{"t":"tests.proj.record","o":' + "[" * 50_000 + "]" * 50_000 + "}\n[]\n"
    store.client.hset(shard.jobs, pack_id("deep"), deep)
    store.client.zadd(shard.due, {pack_id("deep"): 1})

    reports = check(store)

    assert sum(r.jobs for r in reports) == 2 and not any(r.error for r in reports)
    # stored in both the hash and the due set, counted nowhere: nothing to report
    assert sum(sum(r.found.values()) for r in reports) == 0


def test_a_pending_job_whose_id_begins_with_the_kept_prefix_is_a_job_not_damage(
        proj, delayq):
    """Ids hold no control character now, but a job stored before that rule (or by hand)
    may begin with KEPT: it is on the due set, so it is a job, and a repair leaves it."""
    store = delayq.store
    legacy = KEPT + "legacy-7"
    shard = store.keys.shard_for(legacy)
    store.client.hset(shard.jobs, legacy, '{"t":"tests.proj.record"}\n["old"]\n')
    store.client.zadd(shard.due, {legacy: 9_999_999_999_999})
    store.client.hincrby(shard.counts, proj.record.name, 1)

    for repair in (False, True):
        reports = check(store, repair=repair)
        assert sum(sum(r.found.values()) for r in reports) == 0, [r.found for r in reports]
        assert sum(r.jobs for r in reports) == 1
    assert store.client.hget(shard.jobs, legacy) is not None
    assert store.client.zscore(shard.due, legacy) is not None


def test_a_check_of_a_store_in_use_reports_no_damage(proj, delayq):
    """Jobs scheduled, claimed, acked and cancelled while it scans: what changed under it
    is looked at again before it is reported (a live cluster's checks all reported dangling
    and orphaned jobs, and counts, that were none)."""
    for start in range(0, 20_000, 5000):  # a scan long enough to meet the traffic
        proj.record.apply_delayed_many([{"args": (n,), "delay": 3600, "key": f"order:{n % 7}"}
                                        for n in range(start, start + 5000)])
    stop = threading.Event()

    def traffic() -> None:
        n = 0
        while not stop.is_set():
            calls = [{"args": (n + i,), "delay": 0, "key": f"order:{(n + i) % 7}",
                      "job_id": f"busy-{n + i}"} for i in range(50)]
            proj.record.apply_delayed_many(calls, queue="parked.check")
            carrier.run_once()
            delayq.cancel_key(f"order:{n % 7}")
            n += 50

    carrier = Carrier(proj.app, batch=20)
    busy = threading.Thread(target=traffic)
    busy.start()
    try:
        reports = [report for _ in range(5) for report in check(delayq.store)]
    finally:
        stop.set()
        busy.join(30)
        carrier.close()
    assert [(r.shard, r.examples, r.error) for r in reports if r.found or r.error] == []
