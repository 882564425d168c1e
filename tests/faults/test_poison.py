"""Poison isolation: no stored job and no damaged key can stop the delivery of other jobs.

Bad data is planted with raw Redis commands beside healthy jobs (on every shard), then a
carrier (kombu and direct promotion) runs until nothing is due. Jobs go to the queue
``parked``, which no worker consumes, so every published message can be counted.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import redis
from prometheus_client import generate_latest

from celery_delayq import envelope
from celery_delayq.carrier import Carrier
from celery_delayq.check import check
from celery_delayq.errors import DamagedShard
from celery_delayq.keys import ShardKeys
from celery_delayq.metrics import CarrierMetrics
from celery_delayq.reading import count_of, printable
from tests.conftest import PROMOTIONS, finish, journal_events, wait_for
from tests.faults.test_carrier_faults import (
    PARKED,
    carry_until_quiet,
    parked_messages,
    schedule_due_now,
)

DEEP = "[" * 985 + "]" * 985
#: job id -> (what is stored under it, score in the due set, start of the dead-letter reason)
POISON = {
    "deep-args": (f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n[{DEEP}]\n', 0,
                  "envelope is nested too deeply"),
    "deep-fields": (f'{{"t":"tests.proj.record","o":{{"x":{DEEP}}}}}\n\n', 0,
                    "envelope is nested too deeply"),
    "not-utf8": (f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n["\xff\xfe"]\n'
                 .encode("latin-1"), 0, "envelope is not valid UTF-8"),
    "minus-inf": (f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n[1]\n', "-inf",
                  "its stored due time is not a finite number"),
    "bad-kombu-object": (f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n'
                         '[{"__type__":"datetime","__value__":5}]\n', 0,
                         "envelope holds a 'datetime' object kombu cannot decode"),
    "bad-options": ('{"t":"tests.proj.record","o":{"expires":"soon"}}\n[1]\n', 0,
                    "envelope options are unusable"),
    # message properties kombu cannot publish (refused at every call now)
    "bad-expiration": (f'{{"t":"tests.proj.record","q":"{PARKED}","p":{{"expiration":"abc"}}}}'
                       '\n[1]\n', 0, "envelope options are unusable"),
    "bad-delivery-info": (f'{{"t":"tests.proj.record","q":"{PARKED}",'
                          '"p":{"delivery_info":"x"}}\n[1]\n', 0,
                          "envelope options are unusable"),
    "\x1b]0;owned\x07\x1b[2J-id-with-escapes": (  # planted: refused at every call now
        '{"t":"tests.proj.record","o":{"expires":"soon"}}\n[1]\n', 0,
        "envelope options are unusable"),
    # a queue whose broker list kombu would keep in a key of the store (refused at every
    # call now): its LPUSH met WRONGTYPE and every batch with it was given back, for ever
    "queue-is-meta": ('{"t":"tests.proj.record","q":"delayq:meta"}\n[1]\n', 0,
                      "queue 'delayq:meta' would keep its messages in a key of the delay store"),
    "queue-is-a-shard-key": ('{"t":"tests.proj.record","q":"delayq:{0}:limits"}\n[1]\n', 0,
                             "queue 'delayq:{0}:limits' would keep its messages in a key"),
    "\xff-id-not-utf8".encode("latin-1"): (
        f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n[2]\n', 0, "its job id is not valid UTF-8"),
}


def plant(client: redis.Redis, keys, job: str | bytes, raw: str | bytes, score) -> None:
    client.hset(keys.jobs, job, raw)
    client.zadd(keys.due, {job: score})


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_poison_jobs_are_dead_lettered_and_every_healthy_job_is_delivered(
        proj, delayq, redis_client, promotion, caplog):
    raw_client = redis.Redis.from_url(delayq.config.redis_url)  # writes bytes as they are
    for shard in delayq.store.keys:
        for job, (raw, score, _) in POISON.items():
            suffix = f"-{shard.shard}".encode() if isinstance(job, bytes) else f"-{shard.shard}"
            plant(raw_client, shard, job + suffix, raw, score)
        plant(raw_client, shard, f"never-{shard.shard}", f'{{"t":"x","q":"{PARKED}"}}\n\n',
              "+inf")
    healthy = schedule_due_now(proj, 400, prefix="ok")

    with caplog.at_level(logging.ERROR, logger="celery_delayq.carrier"):
        carrier = carry_until_quiet(proj.app, direct=promotion == "direct")

    delivered = [h["delayq_job"] for h in parked_messages(redis_client)]
    assert sorted(delivered) == sorted(healthy)
    dead = {d["job_id"]: d["reason"] for d in delayq.store.dead(limit=1000)}
    shards = delayq.store.keys.shards
    assert len(dead) == shards * len(POISON) and carrier.stats.dead == len(dead)
    for job, (_, _, reason) in POISON.items():
        job = printable(job.decode(errors="surrogateescape")) if isinstance(job, bytes) else job
        assert all(dead[f"{job}-{n}"].startswith(reason) for n in range(shards)), job
    assert not [r for r in caplog.records if r.exc_info], "a data error was logged as a bug"
    assert not [r for r in caplog.records if "\x1b" in r.getMessage()], "raw escapes logged"
    # the jobs due at +inf stay stored (shown as unreadable) and a carrier sleeps on them
    assert all(delayq.get(f"never-{n}").unreadable for n in range(shards))
    idle = Carrier(proj.app, direct=promotion == "direct")
    assert idle.run_once() > 0.5  # tests.proj's idle timeout is 1 s: no busy loop
    idle.close()
    fixed = envelope.encode({"t": proj.record.name, "a": ["fixed"], "q": PARKED})
    assert delayq.store.replay("deep-args-0", envelope=fixed)
    carry_until_quiet(proj.app, direct=promotion == "direct")
    assert "deep-args-0" in [h["delayq_job"] for h in parked_messages(redis_client)]
    print(f"\n{promotion}: planted={len(dead)} dead-lettered={len(dead)} "
          f"healthy-delivered={len(delivered)}/{len(healthy)}")


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_damaged_key_stops_only_its_shard_and_removes_nothing(
        proj, delayq, redis_client, promotion, caplog, spawn):
    healthy = schedule_due_now(proj, 400, prefix="ok")
    damaged = delayq.store.keys.shard(1)
    stranded = set(delayq.store.client.zrange(damaged.due, 0, -1))
    redis_client.set(damaged.inflight, "not a sorted set")  # claim_due writes here first

    with caplog.at_level(logging.ERROR, logger="celery_delayq.carrier"):
        carry_until_quiet(proj.app, direct=promotion == "direct")

    delivered = {h["delayq_job"] for h in parked_messages(redis_client)}
    assert delivered == healthy - stranded and stranded
    assert set(delayq.store.client.zrange(damaged.due, 0, -1)) == stranded  # nothing removed
    errors = [r.getMessage() for r in caplog.records if "shard 1 cannot be served" in
              r.getMessage()]
    assert len(errors) == 1 and "holds a string, not a zset" in errors[0]
    redis_client.set(damaged.bykey, "not a sorted set")  # the schedule script writes here
    with pytest.raises(DamagedShard, match=r"delayq:\{1\}:bykey holds a string"):
        proj.record.apply_delayed(args=(1,), delay=0, key=_key_on(delayq, 1), queue=PARKED)
    assert set(delayq.store.client.zrange(damaged.due, 0, -1)) == stranded  # nothing written

    health = spawn("delayq", "health")
    assert health.wait(30) == 1
    assert "damaged: shard 1 is not served, delayq:{1}:inflight holds a string" in \
        finish(health)
    scraped = generate_latest(CarrierMetrics(delayq.store).registry).decode()
    assert 'delayq_damaged_shard{shard="1"} 1.0' in scraped
    assert 'delayq_damaged_shard{shard="0"} 0.0' in scraped

    redis_client.delete(damaged.inflight, damaged.bykey)  # the operator moves them away
    carry_until_quiet(proj.app, direct=promotion == "direct")
    assert {h["delayq_job"] for h in parked_messages(redis_client)} == healthy
    print(f"\n{promotion}: healthy={len(healthy)} delivered-while-damaged="
          f"{len(delivered)} waited-on-damaged-shard={len(stranded)}, all after repair")


@pytest.mark.parametrize(("damage", "shard", "rate_limits"), [
    ("owner", 2, {}), ("limits", 0, {}), ("limits", 0, {"elsewhere": "10/s"}),
    ("carriers", None, {}),
])
def test_a_damaged_lease_or_limits_key_stops_no_other_shard(proj, delayq, redis_client,
                                                             caplog, spawn, damage, shard,
                                                             rate_limits):
    """A shard's lease (``owner``) or ``limits`` key, read for every shard at once (the
    limits as a carrier starts: ``delayq_rate_limits``), and the store-wide ``carriers`` set:
    each stopped promotion on every shard."""
    healthy = schedule_due_now(proj, 400, prefix="ok")
    keys = delayq.store.keys
    key = keys.carriers if shard is None else getattr(keys.shard(shard), damage)
    delayq.__dict__["config"] = dataclasses.replace(delayq.config, rate_limits=rate_limits)
    if damage == "limits":
        redis_client.set(key, "not a hash")
    else:
        redis_client.hset(key, "x", "y")  # a hash where a string or a sorted set belongs
    stranded = set() if shard is None else set(delayq.store.client.zrange(
        keys.shard(shard).due, 0, -1))

    try:
        with caplog.at_level(logging.ERROR, logger="celery_delayq.carrier"):
            carry_until_quiet(proj.app, direct=False)
    finally:
        del delayq.__dict__["config"]  # read from the app's settings again

    delivered = {h["delayq_job"] for h in parked_messages(redis_client)}
    assert delivered == healthy - stranded
    errors = [r.getMessage() for r in caplog.records]
    assert [e for e in errors if key in e], errors
    assert not [r for r in caplog.records if r.exc_info], "a damaged key was logged as a bug"
    health = spawn("delayq", "health")
    assert health.wait(30) == 1
    assert f"{key} holds a" in finish(health)


@pytest.mark.parametrize("promotion", PROMOTIONS)
@pytest.mark.parametrize("count", ["abc", "1.5", "--5", "007", "9223372036854775807"])
def test_a_count_redis_cannot_add_to_fails_no_write_and_heals(proj, delayq, redis_client,
                                                                promotion, count):
    """Each script that stores, forgets or cancels a job counts it (keys.py, 6.); a count
    it cannot add to (damaged, or at the int64 limit) is set afresh instead of failing the
    script after its writes: before, the schedule call raised for a job it had stored, and
    ack raised on every batch of that task."""
    shards = delayq.store.keys.shards
    for shard in delayq.store.keys:
        redis_client.hset(shard.counts, proj.record.name, count)
    readable = count_of(count)  # at the limit it is a count; damaged ones are skipped
    assert delayq.store.counts()[0] == ({} if readable is None
                                        else {proj.record.name: shards * readable})
    assert sum(r.found["counts"] for r in check(delayq.store)) == shards

    healthy = schedule_due_now(proj, 40, prefix="ok")
    later = proj.record.apply_delayed(args=("later",), delay=3600, queue=PARKED)
    carry_until_quiet(proj.app, direct=promotion == "direct")

    assert sorted(h["delayq_job"] for h in parked_messages(redis_client)) == sorted(healthy)
    assert delayq.store.counts()[0] == {proj.record.name: 1}
    assert later.cancel()
    assert delayq.store.counts() == ({}, 1)
    assert sum(sum(r.found.values()) for r in check(delayq.store)) == 0


def _key_on(delayq, shard: int) -> str:
    """A business key whose jobs live on ``shard``."""
    return next(f"k{n}" for n in range(1000)
                if delayq.store.keys.shard_for("", f"k{n}").shard == shard)


#: The largest stream entry id: a stream whose last id is this takes no more entries.
LAST_STREAM_ID = "18446744073709551615-18446744073709551615"


def test_a_journal_with_no_stream_id_left_loses_events_not_calls(proj, delayq, redis_client,
                                                                 spawn):
    """A journal given the largest entry id (``XADD`` or ``XSETID`` by hand) refuses every
    event: the calls of its shard go on without their events (a script failed after its
    writes once: a stored job said ResponseError, a cancelled one too), and health says so."""
    shard = delayq.store.keys.shard(1)
    key = _key_on(delayq, 1)
    waiting = proj.record.apply_delayed(args=(1,), delay=600, key=key, queue=PARKED)
    redis_client.xadd(shard.journal, {"planted": "1"}, id=LAST_STREAM_ID)
    planted = redis_client.xlen(shard.journal)

    stored = proj.record.apply_delayed(args=(2,), delay=600, key=key, queue=PARKED)
    assert waiting.cancel()
    delayq.store.bury("buried", key, '{"t":"tests.proj.record"}\n[3]\n', "out of retries")
    assert [letter["job_id"] for letter in delayq.store.dead()] == ["buried"]
    healthy = schedule_due_now(proj, 40, prefix="ok")
    carry_until_quiet(proj.app, direct=False)
    assert {h["delayq_job"] for h in parked_messages(redis_client)} == healthy
    assert [job.task_id for job in delayq.store.pending(key=key)] == [stored.id]
    assert redis_client.xlen(shard.journal) == planted  # the events are what it lost
    health = spawn("delayq", "health")
    assert health.wait(30) == 1
    assert "the journal of shard 1 has no stream id left" in finish(health)

    redis_client.rename(shard.journal, "moved-away")  # as health says
    assert stored.cancel()
    assert journal_events(delayq)[-1] == "cancelled"

def test_dead_letter_of_a_planted_envelope_keeps_its_bytes(proj, delayq, redis_client):
    raw_client = redis.Redis.from_url(delayq.config.redis_url)
    raw = POISON["not-utf8"][0]
    plant(raw_client, delayq.store.keys.shard(0), "not-utf8", raw, 0)
    carry_until_quiet(proj.app, direct=False)
    stored = json.loads(raw_client.hget(delayq.store.keys.shard(0).dead, "not-utf8")
                        .decode("utf-8", "surrogateescape"))
    assert stored["envelope"].encode("utf-8", "surrogateescape") == raw


def test_a_journal_write_redis_refuses_leaves_later_worker_events_journaled(
        delayq, redis_client, caplog):
    from celery_delayq import journal

    shard = delayq.store.keys.shard(0)
    event = {"job": "order:1:close", "task": "tests.proj.record", "key": "", "task_id": "t",
             "retries": 0, "due": ""}
    caplog.set_level(logging.WARNING, logger="celery_delayq.journal")  # whatever ran before
    redis_client.set(shard.journal, "not a stream")  # XADD: WRONGTYPE
    journal._outbox.put(delayq, (0, "succeeded", event))
    journal.flush()
    assert "could not journal 1 worker event:" in caplog.text

    redis_client.delete(shard.journal)
    journal._outbox.put(delayq, (0, "succeeded", {**event, "job": "order:2:close"}))
    wait_for(lambda: redis_client.xlen(shard.journal) == 1, timeout=5,
             what="the flush thread to write the next event")


@pytest.mark.parametrize("value", [True, 5, [1], {"a": 1}, None], ids=repr)
def test_an_envelope_whose_names_are_not_text_never_fails_cancel_reschedule_or_recover(
        proj, delayq, redis_client, value):
    """A damaged envelope's task name, key and task id may be a number, list or object.
    The scripts that read them for the journal and the key index do what they are asked;
    before, they failed after their first write: a job cancelled or rescheduled reported
    an error, and recover stopped at the job, leaving the jobs after it leased."""
    store = delayq.store
    damaged = json.dumps({"t": value, "y": value, "i": value}) + "\n[1]\n"
    healthy = envelope.encode({"t": proj.record.name, "a": [1]})

    def plant(job: str, raw: str, where: str) -> ShardKeys:
        shard = store.keys.shard_for(job)
        redis_client.hset(shard.jobs, job, raw)
        redis_client.zadd(getattr(shard, where), {job: 1 if where == "inflight" else 4e12})
        return shard

    plant("to-cancel", damaged, "due")
    plant("to-reschedule", damaged, "due")
    assert delayq.cancel("to-cancel")
    assert delayq.reschedule("to-reschedule", delay=60) is not None
    shard = plant("leased-damaged", damaged, "inflight")
    redis_client.hset(shard.jobs, "leased-ok", healthy)  # after it in the lease order
    redis_client.zadd(shard.inflight, {"leased-ok": 2})
    assert store.recover([shard], 100) == (2, {})
    assert redis_client.zscore(shard.due, "leased-ok") is not None


def test_a_shard_whose_ack_fails_stops_no_other_shards_promotion(proj, delayq, redis_client):
    """Its batch reached the broker, then a key its ack writes was damaged: that ack is kept
    for the shard (sent again once it is repaired), and the other shards go on being
    promoted and acked. Kept whole, one shard's ack failed every round before anything
    was published (a diff review: 0 of 5 new jobs of a healthy shard)."""
    damaged = delayq.store.keys.shard(0)
    first = schedule_due_now(proj, 20, prefix="first")
    carrier = Carrier(proj.app, lease=60.0)
    publish = carrier.publisher.publish

    def publish_then_damage(claims, claimed_at):  # the fault, once shard 0's batch is out
        taken = publish(claims, claimed_at)
        if any(claim.shard == damaged and claim.jobs for claim in claims):
            redis_client.delete(damaged.counts)
            redis_client.set(damaged.counts, "not a hash")
            carrier.publisher.publish = publish
        return taken

    carrier.publisher.publish = publish_then_damage
    try:
        carrier.run_once()
        elsewhere = [job for job in (f"later-{n}" for n in range(40))
                     if delayq.store.keys.shard_for(job) is not damaged]
        proj.record.apply_delayed_many([{"args": (job,), "delay": 0, "job_id": job}
                                        for job in elsewhere], queue=PARKED)
        for _ in range(5):
            carrier.run_once()
        delivered = {h["delayq_job"] for h in parked_messages(redis_client)}
        assert first | set(elsewhere) <= delivered and elsewhere
        assert [shard.shard for shard in carrier._unacked] == [0]
        redis_client.delete(damaged.counts)  # the operator moves it away
        carrier.run_once()
        assert carrier._unacked == {}
    finally:
        carrier.close()
    assert carrier.stats.recovered == 0
    assert not redis_client.zcard(damaged.inflight), "shard 0's batch was acked"
