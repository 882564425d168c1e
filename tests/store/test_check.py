"""``delayq check [--repair]``: every kind of damage is reported with its count, repair
fixes it without losing a job (orphans are dead-lettered), and a second check is clean."""

from __future__ import annotations

import os
import subprocess

from celery_delayq.check import check
from celery_delayq.keys import pack_id
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
    client.zrem(shard_of(1).due, pack_id(ids[1]))  # 3: an orphaned envelope
    client.zadd(shard_of(2).bykey, {"order-9\x00nosuchjob": 0})  # 5: job gone
    client.zadd(shard_of(2).bykey, {f"order-7\x00{pack_id(ids[2])}": 0})  # other key
    client.hincrby(shard_of(3).counts, "tests.proj.record", 5)  # 6: a wrong count
    client.zadd(shard_of(4).inflight, {pack_id(ids[4]): 1})  # 4: legal, not damage

    found = check(store)
    totals = {kind: sum(r.found[kind] for r in found)
              for kind in ("dangling_due", "dangling_inflight", "orphaned", "dangling_bykey",
                           "counts")}
    assert totals == {"dangling_due": 1, "dangling_inflight": 1, "orphaned": 1,
                      "dangling_bykey": 2, "counts": 1}
    assert sum(r.in_both for r in found) == 1

    reported = cli_check(redis_server)
    assert reported.returncode == 1, reported.stdout + reported.stderr
    assert "1 orphaned" in reported.stdout and "2 dangling bykey" in reported.stdout
    assert "job-1" in reported.stdout

    repaired = cli_check(redis_server, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    again = cli_check(redis_server)
    assert again.returncode == 0 and "clean: 29 jobs" in again.stdout, again.stdout

    dead = store.dead()
    assert [entry["job_id"] for entry in dead] == ["job-1"]
    assert dead[0]["reason"].startswith("orphaned")
    assert store.replay("job-1")
    pending = {job.job_id for job in delayq.pending(limit=100)}
    assert pending == set(ids)  # every job is back or was never touched
    assert delayq.store.counts()[0] == {"tests.proj.record": 30}
