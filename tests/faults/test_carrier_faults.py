"""The carrier under faults: killed mid-batch, run twice, fed garbage, raced by cancels.

Jobs go to the queue ``parked``, which no worker consumes, so every message the
carriers published can be counted in the broker itself.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time

import pytest

from celery_delayq import envelope
from celery_delayq.carrier import Carrier
from tests.conftest import finish, wait_for

PARKED = "parked"


def parked_messages(client) -> list[dict]:
    return [json.loads(raw)["headers"] for raw in client.lrange(PARKED, 0, -1)]


def schedule_due_now(proj, n: int, prefix: str = "job", over: float = 0.0) -> set[str]:
    """n jobs for the queue PARKED, due now or (``over`` > 0) evenly over that many seconds."""
    items = [{"args": (i,), "delay": over * i / n, "job_id": f"{prefix}-{i}"} for i in range(n)]
    for start in range(0, n, 5000):
        proj.record.apply_delayed_many(items[start:start + 5000], queue=PARKED)
    return {item["job_id"] for item in items}


def store_count(client, suffix: str) -> int:
    """Entries of one kind (due, inflight) over every shard."""
    return sum(client.zcard(k) for k in client.scan_iter(f"delayq:*:{suffix}"))


def still_leased(client, leases: list[tuple[str, str, float]]) -> list[bool]:
    """For each (in-flight set, stored job id, lease deadline): does that lease still hold?"""
    pipe = client.pipeline(transaction=False)
    for key, job, _ in leases:
        pipe.zscore(key, job)
    return [score == deadline
            for score, (_, _, deadline) in zip(pipe.execute(), leases, strict=True)]


def all_delivered(client) -> bool:
    return store_count(client, "due") == 0 and store_count(client, "inflight") == 0


LEASE = 1.0  # seconds, job leases and shard leases of the carriers these tests start


def carry_until_quiet(app, direct: bool, rounds: int = 20) -> Carrier:
    """Run an in-process carrier until it expects no work now (at most ``rounds`` times)."""
    carrier = Carrier(app, direct=direct)
    try:
        for _ in range(rounds):
            if carrier.run_once() > 0:
                break
    finally:
        carrier.close()
    return carrier


def start_carrier(spawn, *extra: str):
    return spawn("delayq", "carrier", "--lease", str(LEASE), "--shard-lease", str(LEASE),
                 *extra)


@pytest.mark.slow
def test_carrier_sigkilled_five_times_while_jobs_fall_due_loses_nothing(
        proj, redis_client, spawn):
    n = 50_000
    items = [{"args": (i,), "delay": 8.0 * i / n, "job_id": f"job-{i}"} for i in range(n)]
    for start in range(0, n, 5000):
        proj.record.apply_delayed_many(items[start:start + 5000], queue=PARKED)
    rng = random.Random(20261122)
    claimed_at_kills = []
    for _kill in range(5):
        carrier = start_carrier(spawn, "--batch", "200")
        wait_for(lambda: redis_client.llen(PARKED) > 0, what="promotions")
        time.sleep(rng.uniform(0.2, 1.2))
        carrier.send_signal(signal.SIGKILL)
        carrier.wait(10)
        claimed_at_kills.append(store_count(redis_client, "inflight"))
    killed_at = time.monotonic()
    stranded = [(key, job, deadline)  # leased by the killed carriers
                for key in redis_client.scan_iter("delayq:*:inflight")
                for job, deadline in redis_client.zrange(key, 0, -1, withscores=True)]
    start_carrier(spawn, "--batch", "200")
    wait_for(lambda: not any(still_leased(redis_client, stranded)), timeout=30,
             what="leases of the killed carriers recovered")
    recovery = time.monotonic() - killed_at
    wait_for(lambda: all_delivered(redis_client), timeout=60, what="every job delivered")

    headers = parked_messages(redis_client)
    delivered = [h["delayq_job"] for h in headers]
    duplicates = len(delivered) - len(set(delivered))
    print(f"\njobs={n} kills=5 claimed-at-kills={claimed_at_kills} lost="
          f"{n - len(set(delivered))} duplicates={duplicates} recovery={recovery:.1f}s")
    assert set(delivered) == {item["job_id"] for item in items}
    assert duplicates <= sum(claimed_at_kills)
    by_job: dict[str, set[str]] = {}
    for h in headers:
        by_job.setdefault(h["delayq_job"], set()).add(h["id"])
    assert all(len(ids) == 1 for ids in by_job.values()), "a duplicate changed its task id"
    # a new carrier starts in ~2 s, then needs one lease to expire and one sweep
    assert recovery <= 2 * LEASE + 4.0


def test_two_carriers_never_promote_a_job_twice(proj, redis_client, spawn):
    jobs = schedule_due_now(proj, 20_000)
    spawn("delayq", "carrier", "--batch", "100")
    spawn("delayq", "carrier", "--batch", "100")
    wait_for(lambda: all_delivered(redis_client), timeout=60, what="every job delivered")
    delivered = [h["delayq_job"] for h in parked_messages(redis_client)]
    assert len(delivered) == len(jobs) and set(delivered) == jobs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_finishes_the_batch_and_exits_zero(proj, redis_client, spawn, signum):
    """SIGHUP (its terminal or session ended) killed it before, leaving its batch leased:
    published jobs among them were published again once the lease ended."""
    schedule_due_now(proj, 5_000)
    carrier = spawn("delayq", "carrier", "--batch", "500")
    wait_for(lambda: redis_client.llen(PARKED) > 0, what="first promotions")
    carrier.send_signal(signum)
    output = finish(carrier, timeout=20)
    assert carrier.returncode == 0, output
    assert store_count(redis_client, "inflight") == 0, "a claimed batch was left unacked"
    assert "carrier stopped" in output


PLANTED = {
    "{not json": "envelope is not valid JSON",
    '{"t": ""}': "envelope has no task name",
    '{"t": "x", "q": "parked"}\n1\n': "envelope args/kwargs have the wrong type",
    '{"t": "x", "q": "parked", "p": {"content_type": "application/x-python-serialize"}}':
        "envelope sets a content type; only JSON payloads are published",
    '{"t": "x", "q": "parked"}\n["' + "x" * 300_000 + '"]\n':
        "envelope over delayq_max_payload_bytes",
}


def test_planted_bad_envelopes_are_dead_lettered_listed_and_replayable(
        proj, delayq, redis_client, carrier, spawn):
    bad = {}
    for i in range(1000):
        raw = list(PLANTED)[i % len(PLANTED)]
        shard = delayq.store.keys.shard(i % delayq.store.keys.shards)
        redis_client.hset(shard.jobs, f"bad-{i}", raw)
        redis_client.zadd(shard.due, {f"bad-{i}": 0})
        bad[f"bad-{i}"] = PLANTED[raw]
    healthy = schedule_due_now(proj, 2000, prefix="ok")
    wait_for(lambda: all_delivered(redis_client), what="all jobs handled")
    assert {h["delayq_job"] for h in parked_messages(redis_client)} == healthy

    dead = {d["job_id"]: d["reason"] for d in delayq.store.dead(limit=5000)}
    assert dead.keys() == bad.keys()
    assert all(dead[job].startswith(reason) for job, reason in bad.items())
    listed = finish(spawn("delayq", "ls", "--dead"))
    assert len(listed.splitlines()) == 100 and "bad-" in listed  # --limit defaults to 100
    assert delayq.get("bad-3").state == "dead"

    fixed = envelope.encode({"t": proj.record.name, "a": ["fixed"], "q": PARKED})
    assert delayq.store.replay("bad-3", envelope=fixed) is True
    wait_for(lambda: any(h["delayq_job"] == "bad-3" for h in parked_messages(redis_client)),
             what="the replayed job")
    print(f"\nplanted=1000 dead-lettered={len(dead)} healthy-delivered={len(healthy)} "
          "replayed=1")


def test_a_dead_letter_whose_job_id_is_not_utf8_is_logged_to_a_utf8_log_file(
        proj, delayq, redis_client, tmp_path):
    shard = delayq.store.keys.shard(0)
    redis_client.hset(shard.jobs, b"bad-\xff", "{not json")
    redis_client.zadd(shard.due, {b"bad-\xff": 0})
    handler = logging.FileHandler(tmp_path / "carrier.log", encoding="utf-8")  # strict
    logger = logging.getLogger("celery_delayq.carrier")
    logger.addHandler(handler)
    try:
        carry_until_quiet(proj.app, direct=False)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert "dead-lettered 1 job (bad-\\xff: its job id is not valid UTF-8)" in (
        tmp_path / "carrier.log").read_text()


def test_cancel_racing_the_carrier_reports_what_happened(proj, delayq, redis_client, carrier):
    n = 10_000
    results = proj.record.apply_delayed_many(
        [{"args": (i,), "delay": 1.0 + i / 10_000, "job_id": f"race-{i}"} for i in range(n)],
        queue=PARKED)
    random.Random(7).shuffle(results)  # cancels hit jobs before, at and after their due time
    outcomes: dict[str, bool] = {}

    def cancel_all(part):
        for result in part:
            outcomes[result.job_id] = result.cancel()

    wait_for(lambda: redis_client.llen(PARKED) > 0, what="the carrier to start promoting")
    threads = [threading.Thread(target=cancel_all, args=(results[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wait_for(lambda: all_delivered(redis_client), what="the race to settle")
    delivered = [h["delayq_job"] for h in parked_messages(redis_client)]
    cancelled = {job for job, ok in outcomes.items() if ok}
    print(f"\njobs={n} cancelled={len(cancelled)} delivered={len(delivered)} "
          f"both-or-neither={n - len(cancelled) - len(set(delivered))}")
    assert len(delivered) == len(set(delivered))
    assert set(delivered) == set(outcomes) - cancelled
    assert cancelled and delivered, "the race did not overlap"


def test_carrier_survives_its_redis_connections_being_killed(proj, redis_client, carrier):
    first = schedule_due_now(proj, 50, prefix="before")
    wait_for(lambda: all_delivered(redis_client), what="first jobs")
    time.sleep(0.2)  # let the carrier go back to waiting on the wake channel
    killed = redis_client.client_kill_filter(_type="pubsub") + redis_client.client_kill_filter(
        _type="normal", skipme=True)
    assert killed > 0
    second = schedule_due_now(proj, 50, prefix="after")
    wait_for(lambda: all_delivered(redis_client), what="jobs after the kill")
    assert {h["delayq_job"] for h in parked_messages(redis_client)} == first | second


def test_connections_killed_while_the_carrier_publishes_lose_nothing(
        proj, redis_client, spawn):
    start_carrier(spawn)  # short leases: a claim whose reply was lost is recovered soon
    jobs = schedule_due_now(proj, 30_000, prefix="flow", over=2.0)  # kills land mid-flow
    wait_for(lambda: redis_client.llen(PARKED) > 0, what="promotions")
    kills = 0
    while kills < 5 and not all_delivered(redis_client):
        time.sleep(0.1)
        kills += 1
        redis_client.client_kill_filter(_type="normal", skipme=True)
        redis_client.client_kill_filter(_type="pubsub")
    wait_for(lambda: all_delivered(redis_client), timeout=60, what="every job delivered")
    headers = parked_messages(redis_client)
    delivered = [h["delayq_job"] for h in headers]
    print(f"\njobs={len(jobs)} connection-kills={kills} lost={len(jobs - set(delivered))} "
          f"duplicates={len(delivered) - len(set(delivered))}")
    assert kills > 1, "the carrier finished before the connections could be killed"
    assert set(delivered) == jobs
    assert len({(h["delayq_job"], h["id"]) for h in headers}) == len(jobs)
