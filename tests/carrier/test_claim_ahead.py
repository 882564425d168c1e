"""Through a backlog the carrier claims the next batch while it publishes one."""

from __future__ import annotations

import json
import logging
import re

from celery import Celery

from celery_delayq import DelayedTask
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import journal_events

PARKED = "parked.ahead"  # no worker consumes it


def published(redis_client) -> list[str]:
    """Job ids of the messages on the parked queue."""
    return [json.loads(raw)["headers"]["delayq_job"]
            for raw in redis_client.lrange(PARKED, 0, -1)]


def schedule_due(proj, n: int) -> set[str]:
    results = proj.record.apply_delayed_many(
        [{"args": (i,), "delay": 0, "job_id": f"ahead-{i}"} for i in range(n)], queue=PARKED)
    return {r.job_id for r in results}


def test_a_carrier_stopped_in_a_backlog_acks_what_it_published_and_gives_back_the_rest(
        app, proj, delayq, redis_client):
    jobs = schedule_due(proj, 60)
    carrier = Carrier(app, batch=1)  # every shard with a job left is a full claim
    assert carrier.run_once() == 0.0  # the first publish is timed: it claims nothing ahead
    assert carrier.run_once() == 0.0
    claimed_ahead = {job_id for job_id in jobs - set(published(redis_client))
                     if delayq.get(job_id).state == "claimed"}
    assert claimed_ahead, "a backlog claims the next batch before this one is published"
    carrier.close()

    first = published(redis_client)
    assert first and len(first) == len(set(first))
    assert [delayq.get(job_id) for job_id in first] == [None] * len(first)  # acked
    assert journal_events(delayq).count("promoted") == len(first)
    assert {delayq.get(job_id).state for job_id in claimed_ahead} == {"scheduled"}  # given back

    carrier = Carrier(app, batch=1)
    for _ in range(len(jobs)):
        if carrier.run_once() > 0:
            break
    carrier.close()
    assert sorted(published(redis_client)) == sorted(jobs)  # each exactly once
    # The app now lists the parked queue, and a session worker started later consumed it
    # on Celery 5.3 (its int labels then broke test_delivery): leave it empty.
    redis_client.delete(PARKED)


def test_a_carrier_whose_publish_outlasts_a_third_of_its_lease_claims_no_batch_ahead(
        app, proj, delayq, redis_client):
    # A batch claimed ahead waits through this batch's publish and then its own. With a
    # 10 ms lease, publishing 200 messages takes longer than that: a batch claimed ahead
    # would be recovered (maintenance every 10 ms) and published twice.
    jobs = schedule_due(proj, 2000)
    carrier = Carrier(app, batch=200, lease=0.01, shard_lease=0.03)
    for _ in range(50):  # 3 rounds of 800 when nothing is recovered
        if carrier.run_once() > 0:
            break
    carrier.close()
    assert carrier.stats.recovered == 0
    assert sorted(published(redis_client)) == sorted(jobs)  # each exactly once
    redis_client.delete(PARKED)


def test_a_carrier_stopped_while_its_redis_is_away_says_what_will_be_published_again(
        caplog):
    """It exited 0 saying only that its shard leases would expire: nothing told that jobs it
    had published would be published again when their leases end."""
    with RedisServer() as server:
        app = Celery("stopped-away", broker=f"{server.url}/0", set_as_current=False)
        app.conf.update(delayq_redis_retries=0, delayq_redis_socket_timeout=0.5)

        @app.task(base=DelayedTask, name="stopped_away.record", shared=False)
        def record(n):
            return n

        record.apply_delayed_many([{"args": (i,), "delay": 0} for i in range(60)],
                                  queue=PARKED)
        carrier = Carrier(app, batch=1, lease=30)
        carrier.run_once()
        carrier.run_once()
        assert carrier._ahead is not None, "a backlog claims the next batch ahead"
        server.stop()
        with caplog.at_level(logging.WARNING, logger="celery_delayq"):
            carrier.close()

    [said] = [r.getMessage() for r in caplog.records if "published again" in r.getMessage()]
    assert re.fullmatch(r"stopping with (\d+) published jobs? not acknowledged and "
                        r"(the jobs|\d+ jobs?) claimed ahead not given back \(Redis did not "
                        r"answer\): they are due again when their leases end, within 30s; "
                        r"the \1 published will be published again", said), said
