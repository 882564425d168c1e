"""Pausing a task or a queue: its due jobs are held, pending, until it is resumed."""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_delayq import carrier as carrier_module
from celery_delayq.carrier import Carrier
from celery_delayq.check import check
from celery_delayq.errors import DamagedShard, InvalidOption
from celery_delayq.keys import unpack_id
from celery_delayq.scripts import SCRIPTS
from celery_delayq.store import releasing
from tests.conftest import CLUSTER, PROMOTIONS, command_calls, store_keys, wait_for

PAST = datetime(2026, 1, 1, tzinfo=timezone.utc)
PARKED = "parked.pause"  # no worker consumes it


def labels(proj) -> list[str]:
    return [run["label"] for run in proj.runs()]


def serve_once(app, **options) -> None:
    """One carrier round over every shard, then the shards go back; ``options``: the
    carrier's (``direct=True``)."""
    carrier = Carrier(app, **options)
    carrier.run_once()
    carrier.close()


@pytest.mark.parametrize("carrier", PROMOTIONS, indirect=True)
def test_a_paused_task_waits_pending_listed_cancellable_reschedulable_until_resumed(
        proj, delayq, worker, carrier):
    delayq.pause(task=proj.record.name, by="test")
    held = [proj.record.apply_delayed(args=(f"held-{n}",), eta=PAST + timedelta(seconds=n),
                                      job_id=f"held-{n}") for n in range(3)]
    assert proj.flaky.apply_delayed(args=("other task", 0), delay=0.2).get(timeout=15)

    wait_for(lambda: sum(row["paused"] for row in delayq.store.stats()) == 3,
             what="3 held jobs")
    assert labels(proj) == ["other task"]
    pending = delayq.pending(task=proj.record.name)
    assert [(job.job_id, job.paused, job.due) for job in pending] == [
        (f"held-{n}", True, PAST + timedelta(seconds=n)) for n in range(3)]
    assert delayq.get("held-0").state == "scheduled" and delayq.get("held-0").paused
    assert held[0].cancel() is True
    later = delayq.reschedule("held-1", delay=3600)
    assert later is not None and not delayq.get("held-1").paused

    assert delayq.resume(task=proj.record.name, by="test") == 1
    wait_for(lambda: "held-2" in labels(proj), what="the held job to run once resumed")
    assert delayq.get("held-1").due == later  # rescheduled: still waiting for its new time
    assert sorted(labels(proj)) == ["held-2", "other task"]


def test_resume_promotes_the_held_jobs_oldest_due_first(proj, app, delayq, redis_client):
    """(Of one shard: one business key keeps them together; each claim round takes the
    oldest of every shard.)"""
    delayq.pause(queue=PARKED)
    for n in (3, 1, 4, 0, 2):
        proj.record.apply_delayed(args=(f"job-{n}",), eta=PAST + timedelta(minutes=n),
                                  queue=PARKED, job_id=f"job-{n}", key="order:1")
    serve_once(app)
    assert redis_client.llen(PARKED) == 0
    assert sum(row["paused"] for row in delayq.store.stats()) == 5

    assert delayq.resume(queue=PARKED) == 5
    serve_once(app)
    bodies = [json.loads(m)["headers"]["delayq_job"]
              for m in reversed(redis_client.lrange(PARKED, 0, -1))]
    assert bodies == [f"job-{n}" for n in range(5)]


def test_every_carrier_obeys_a_pause_from_its_next_claim_round(proj, app, delayq, worker):
    carriers = [Carrier(app) for _ in range(2)]
    threads = [threading.Thread(target=c.run, daemon=True) for c in carriers]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(c._shards for c in carriers), what="both carriers to own shards")
        delayq.pause(task=proj.record.name, by="test")
        for n in range(16):  # ids spread over every shard, so over both carriers
            proj.record.apply_delayed(args=(f"held-{n}",), delay=0.1, job_id=f"held-{n}")
            proj.flaky.apply_delayed(args=(f"free-{n}", 0), delay=0.1, job_id=f"free-{n}")
        wait_for(lambda: len(proj.runs()) == 16, what="the 16 jobs of the other task")
        wait_for(lambda: sum(row["paused"] for row in delayq.store.stats()) == 16,
                 what="16 held jobs")
        assert not [label for label in labels(proj) if label.startswith("held")]
    finally:
        for c in carriers:
            c.stop()
        for thread in threads:
            thread.join(10)


def test_pause_and_resume_are_journaled_with_who_did_it(delayq):
    delayq.pause(queue="refunds", by="cli:alice")
    assert delayq.paused() == {"tasks": [], "queues": ["refunds"]}
    delayq.resume(queue="refunds", by="admin:bob")
    assert delayq.paused() == {"tasks": [], "queues": []}
    entries = [fields for shard in delayq.store.keys
               for _, fields in delayq.store.client.xrange(shard.journal)]
    assert entries == [{"event": "paused", "queue": "refunds", "by": "cli:alice"},
                       {"event": "resumed", "queue": "refunds", "by": "admin:bob"}]


def test_who_paused_resumed_or_limited_is_logged_on_its_one_line_escaped(delayq, caplog):
    """``by`` is free text (a web app's user name): a line break in it forged a second log
    line, an ESC reached the terminal raw."""
    forged = "alice)\n2026-12-07 09:00:00,000 CRITICAL FORGED \x1b[31mred\x1b[0m"
    with caplog.at_level("INFO", logger="celery_delayq"):
        delayq.pause(queue="refunds", by=forged)
        delayq.resume(queue="refunds", by=forged)
        delayq.set_rate_limit("refunds", "10/s", by=forged)
    logged = [r.getMessage() for r in caplog.records if "FORGED" in r.getMessage()]
    assert len(logged) == 3
    assert not [line for line in logged if "\n" in line or "\x1b" in line]
    assert all("alice)\\x0a2026" in line for line in logged)


@pytest.mark.parametrize("arguments", [
    {}, {"task": "a", "queue": "b"}, {"task": ""}, {"queue": 7}, {"task": "line\nbreak"},
])
def test_pause_of_nothing_or_of_two_things_is_refused_and_writes_nothing(delayq, arguments):
    with pytest.raises(InvalidOption, match=r"task=|queue="):
        delayq.pause(**arguments)
    with pytest.raises(InvalidOption, match=r"task=|queue="):
        delayq.resume(**arguments)
    assert [key for key in store_keys(delayq) if not key.endswith(":meta")] == []


@pytest.mark.parametrize("name", ["caisse\u00a0principale", "zero\u200bwidth"])
def test_a_name_the_store_takes_for_a_queue_or_task_can_be_paused(delayq, name):
    """Names are refused by one rule (``reading.FORBIDDEN``) when scheduled and paused
    alike: a no-break or zero-width space is neither a control character nor a bidi
    control, so jobs can be routed to such a queue, and it can be paused."""
    delayq.pause(queue=name)
    delayq.pause(task=name)
    assert delayq.paused() == {"tasks": [name], "queues": [name]}


def test_a_held_job_keeps_its_due_time_for_keep_replace_and_error(proj, app, delayq):
    delayq.pause(task=proj.record.name)
    proj.record.apply_delayed(args=("first",), eta=PAST, job_id="same")
    serve_once(app)
    kept = proj.record.apply_delayed(args=("second",), delay=60, job_id="same")
    assert kept.eta == PAST and delayq.get("same").args == ["first"]
    replaced = proj.record.apply_delayed(args=("third",), delay=60, job_id="same",
                                         if_exists="replace")
    job = delayq.get("same")
    assert job.args == ["third"] and not job.paused and job.due == replaced.eta


@pytest.mark.skipif(CLUSTER, reason="checks the shard keys of a single Redis")
def test_a_held_job_with_a_damaged_due_score_is_claimed_to_be_dead_lettered(
        proj, app, delayq, redis_client):
    delayq.pause(task=proj.record.name)
    proj.record.apply_delayed(args=("x",), eta=PAST, job_id="odd")
    shard = delayq.store.keys.shard_for("odd")
    redis_client.zadd(shard.due, {"odd": float("-inf")})
    serve_once(app)
    assert delayq.store.dead() and delayq.store.dead()[0]["job_id"] == "odd"


TASKS = st.sampled_from(["tests.proj.record", "tests.proj.flaky"])
QUEUES = st.sampled_from(["parked.a", "parked.b"])


def empty_and_pause(delayq, tasks: set[str], queues: set[str]) -> None:
    """An empty store with these tasks and queues paused (a fresh one per example)."""
    for key in store_keys(delayq):
        delayq.store.client.delete(key)
    for task in tasks:
        delayq.pause(task=task)
    for queue in queues:
        delayq.pause(queue=queue)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.tuples(TASKS, QUEUES, st.integers(0, 10_000)), min_size=1,
                     max_size=30),
       paused_tasks=st.sets(TASKS), paused_queues=st.sets(QUEUES))
def test_a_claim_takes_exactly_the_due_jobs_nothing_paused_holds(
        delayq, redis_client, jobs, paused_tasks, paused_queues):
    empty_and_pause(delayq, paused_tasks, paused_queues)
    for n, (task, queue, ms) in enumerate(jobs):
        delayq.schedule(task, (n,), eta=PAST + timedelta(milliseconds=ms), queue=queue,
                        job_id=f"job-{n}")
    free = {f"job-{n}" for n, (task, queue, _) in enumerate(jobs)
            if task not in paused_tasks and queue not in paused_queues}

    claims = delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    assert {job.job_id for claim in claims for job in claim.jobs} == free
    held = delayq.pending(limit=1000)
    assert {job.job_id for job in held} == {f"job-{n}" for n in range(len(jobs))} - free
    assert all(job.paused for job in held)


def test_a_listing_limit_takes_the_earliest_due_of_held_and_waiting_jobs_alike(
        proj, app, delayq):
    """Held jobs sort after every due score in Redis; the listing still goes by due time."""
    delayq.pause(task=proj.record.name)
    for n in (1, 3):
        proj.record.apply_delayed(args=(n,), eta=PAST + timedelta(seconds=n), job_id=f"h-{n}",
                                  key="order:1")
    serve_once(app)
    for n in (0, 2):  # not yet claimed: still plain due scores
        proj.flaky.apply_delayed(args=(n, 0), eta=PAST + timedelta(seconds=n),
                                 job_id=f"d-{n}", key="order:1")
    assert [job.job_id for job in delayq.pending(limit=3)] == ["d-0", "h-1", "d-2"]
    assert [job.job_id for job in delayq.pending(limit=10)] == ["d-0", "h-1", "d-2", "h-3"]


def hold(delayq, jobs: list[tuple[str, str, int]], **options) -> None:
    """Schedule jobs (task, queue, ms past PAST) as job-0, job-1, ..., all on one shard,
    and claim until every one is held."""
    for n, (task, queue, ms) in enumerate(jobs):
        delayq.schedule(task, (n,), eta=PAST + timedelta(milliseconds=ms), queue=queue,
                        job_id=f"job-{n}", key="tenant:1", **options)
    claims = delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    assert [claim.jobs for claim in claims if claim.jobs] == []


def stranded(delayq) -> int:
    """Held jobs nothing holds, as ``delayq check`` finds them."""
    return sum(report.found["stranded"] for report in check(delayq.store))


def test_a_resume_gives_back_a_shards_held_jobs_call_by_call(proj, delayq, monkeypatch):
    """Resume looks at RELEASE_CHUNK held jobs per script call, so a pause holding very
    many jobs never blocks Redis for long (one call for 200,000 held jobs took 1.4 s); the
    jobs another pause still holds are passed over, never looked at again."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 4)
    delayq.pause(queue=PARKED)
    delayq.pause(task=proj.flaky.name)
    hold(delayq, [(proj.flaky.name if n % 4 == 1 else proj.record.name, PARKED, n // 3)
                  for n in range(26)])
    delayq.resume(queue="parked.other")  # the scripts loaded (NOSCRIPT calls count)
    before = command_calls(delayq.store)
    assert delayq.resume(queue=PARKED) == 19
    shards = delayq.config.shards
    # the resume itself on every shard, then the release: 26 held jobs, 7 of them kept, in
    # calls of 4 on their shard (the last one short), one call on each other shard
    assert command_calls(delayq.store) - before == shards + 7 + (shards - 1)
    assert {job.job_id for job in delayq.pending(limit=100) if job.paused} == {
        f"job-{n}" for n in range(26) if n % 4 == 1}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.tuples(TASKS, QUEUES, st.integers(0, 3)), min_size=1, max_size=30),
       paused_tasks=st.sets(TASKS), paused_queues=st.sets(QUEUES, min_size=1),
       chunk=st.integers(1, 5))
def test_a_resume_call_by_call_gives_back_exactly_the_jobs_no_other_pause_holds(
        delayq, monkeypatch, jobs, paused_tasks, paused_queues, chunk):
    """Whatever the mix of pauses, ties of due time and chunk size (a cursor over held
    jobs that stay held must neither skip nor loop)."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", chunk)
    empty_and_pause(delayq, paused_tasks, paused_queues)
    jobs = [job for job in jobs if job[0] in paused_tasks or job[1] in paused_queues]
    hold(delayq, jobs)
    resumed = min(paused_queues)
    held = {f"job-{n}" for n in range(len(jobs))}
    kept = {f"job-{n}" for n, (task, queue, _) in enumerate(jobs)
            if task in paused_tasks or (queue in paused_queues and queue != resumed)}

    assert delayq.resume(queue=resumed) == len(held - kept)
    assert {job.job_id for job in delayq.pending(limit=100) if job.paused} == kept
    claims = delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    assert {job.job_id for claim in claims for job in claim.jobs} == held - kept


def test_a_resume_goes_on_when_the_job_it_stopped_at_is_cancelled_between_calls(
        proj, delayq, monkeypatch):
    """The walk goes on after the last job it left held; cancelled before the next call,
    that job is gone, and the walk goes on from the first job of its due time, so it
    neither skips a job nor stops (chunks of 2, ties of due time)."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 2)
    delayq.pause(queue=PARKED)
    delayq.pause(task=proj.flaky.name)
    jobs = [(proj.flaky.name if n % 3 == 0 else proj.record.name, PARKED, n // 2)
            for n in range(18)]
    hold(delayq, jobs)
    real, cancelled = releasing.execute, []

    def cancel_where_it_stopped(client, calls, **options):
        replies = real(client, calls, **options)
        if calls[0][0] is SCRIPTS["release"]:
            for reply in replies:  # a cursor: "<score> <job id>" of the job it stopped at
                job_id = reply[2] and unpack_id(reply[2].split(" ", 1)[1])
                if job_id and job_id not in cancelled and len(cancelled) < 2:
                    cancelled.append(job_id)
                    assert delayq.cancel(job_id, key="tenant:1") is True
        return replies

    monkeypatch.setattr(releasing, "execute", cancel_where_it_stopped)
    assert delayq.resume(queue=PARKED) == 12
    assert len(cancelled) == 2
    kept = {f"job-{n}" for n in range(0, 18, 3)} - set(cancelled)
    assert {job.job_id for job in delayq.pending(limit=100) if job.paused} == kept


def cut_after(monkeypatch, calls: int) -> None:
    """Make the store's ``calls``-th round trip from now raise KeyboardInterrupt (Ctrl-C,
    or the Django admin's request killed by its server's timeout)."""
    made = []
    real = releasing.execute

    def cut(client, batch, **options):
        made.append(batch)
        if len(made) == calls:
            monkeypatch.setattr(releasing, "execute", real)
            raise KeyboardInterrupt
        return real(client, batch, **options)

    monkeypatch.setattr(releasing, "execute", cut)


def resume_cut_short(proj, delayq, monkeypatch, *, chunk: int, calls: int) -> None:
    """Ten jobs held by a pause of PARKED, then its resume stopped at the store's
    ``calls``-th round trip (the first ends the pause), ``chunk`` jobs per release call."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", chunk)
    delayq.pause(queue=PARKED)
    hold(delayq, [(proj.record.name, PARKED, n) for n in range(10)])
    cut_after(monkeypatch, calls)
    with pytest.raises(KeyboardInterrupt):
        delayq.resume(queue=PARKED)


def test_a_resume_cut_short_leaves_jobs_a_second_resume_or_check_gives_back(
        proj, delayq, monkeypatch):
    """A resume stopped part way (Ctrl-C, a lost connection) has ended the pause and given
    back some jobs; the rest are found by ``delayq check`` and given back by running the
    resume again (or by ``check --repair``), or by a carrier (below)."""
    resume_cut_short(proj, delayq, monkeypatch, chunk=3, calls=4)  # after two rounds
    assert delayq.paused() == {"tasks": [], "queues": []}
    assert len([job for job in delayq.pending(limit=100) if job.paused]) == 4
    assert stranded(delayq) == 4

    assert delayq.resume(queue=PARKED) == 4
    assert stranded(delayq) == 0
    assert not [job for job in delayq.pending(limit=100) if job.paused]


def test_a_carrier_finishes_a_resume_whose_caller_stopped_part_way(
        proj, app, delayq, monkeypatch):
    resume_cut_short(proj, delayq, monkeypatch, chunk=3, calls=4)  # after two rounds
    serve_once(app)  # a resume that went on a moment ago is its caller's to finish
    assert stranded(delayq) == 4

    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 0)  # it stopped going on
    serve_once(app)
    assert stranded(delayq) == 0
    assert not [job for job in delayq.pending(limit=100) if job.paused]
    assert not any(delayq.store.client.hlen(shard.releasing) for shard in delayq.store.keys)


def test_a_carrier_goes_on_with_a_release_it_took_over_a_few_rounds_a_maintenance(
        proj, app, delayq, monkeypatch):
    monkeypatch.setattr(carrier_module, "_RELEASE_ROUNDS", 1)
    resume_cut_short(proj, delayq, monkeypatch, chunk=2, calls=2)  # before its first round
    carrier = Carrier(app)
    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 0)
    carrier._maintain()
    assert stranded(delayq) == 8
    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 60_000)  # moved a moment ago: by it
    for left in (6, 4, 2, 0):
        carrier._maintain()
        assert stranded(delayq) == left
    carrier.close()


def test_a_damaged_releasing_key_stops_no_other_shards_release(
        proj, app, delayq, monkeypatch):
    resume_cut_short(proj, delayq, monkeypatch, chunk=3, calls=2)  # before its first round
    held_on = delayq.store.keys.shard_for("job-0", "tenant:1")
    damaged = next(shard for shard in delayq.store.keys if shard is not held_on)
    delayq.store.client.set(damaged.releasing, "not a hash")
    delayq.store.client.hset(held_on.releasing, "no kind", "x")  # passed over
    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 0)
    carrier = Carrier(app)
    carrier._maintain()
    carrier.close()
    assert not [job for job in delayq.pending(limit=100) if job.paused]
    assert delayq.store.client.hgetall(held_on.releasing) == {"no kind": "x"}
    delayq.store.client.delete(damaged.releasing, held_on.releasing)


def test_a_carrier_finishes_a_rate_limit_removal_whose_caller_stopped_part_way(
        proj, app, delayq, monkeypatch):
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 3)
    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 0)
    delayq.set_rate_limit(PARKED, "1/h")
    for n in range(10):
        delayq.schedule(proj.record.name, (n,), eta=PAST, queue=PARKED, job_id=f"job-{n}",
                        key="tenant:1")
    delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    held = sum(job.held == "rate limit" for job in delayq.pending(limit=100))
    assert held >= 8
    cut_after(monkeypatch, 3)  # the removal, one round of release, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        delayq.set_rate_limit(PARKED, None)
    assert stranded(delayq) == held - 3

    serve_once(app)
    assert stranded(delayq) == 0
    assert not any(delayq.store.client.hlen(shard.releasing) for shard in delayq.store.keys)


def test_the_walk_of_an_earlier_resume_leaves_a_later_resumes_part_to_it(
        proj, app, delayq, monkeypatch):
    """Each resume walks the shard from its first held job. One that began while an
    earlier one was walking may have jobs to give back behind that walk, so the earlier
    walk's end does not mark the shard done: a carrier then finishes the later one."""
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 2)
    other = "other.pause"
    delayq.pause(queue=PARKED)
    delayq.pause(queue=other)
    hold(delayq, [(proj.record.name, PARKED if n % 2 else other, n) for n in range(8)])
    shard = delayq.store.keys.shard_for("job-0", "tenant:1")
    walks = []
    real = releasing.Releasing._release_round

    def first_round_only(self, walks_now):
        walks.extend(walks_now)
        raise KeyboardInterrupt

    monkeypatch.setattr(releasing.Releasing, "_release_round", first_round_only)
    with pytest.raises(KeyboardInterrupt):
        delayq.resume(queue=PARKED)  # its walk has not begun
    monkeypatch.setattr(releasing.Releasing, "_release_round", real)
    earlier = next(walk for walk in walks if walk.shard == shard)
    # the earlier walk's first round: job-0 is left held, job-1 given back
    going_on = delayq.store._release_round([earlier]).going_on
    cut_after(monkeypatch, 2)  # the later resume, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        delayq.resume(queue=other)
    while going_on:  # the earlier walk goes on to its end
        going_on = delayq.store._release_round(going_on).going_on
    assert [job.job_id for job in delayq.pending(limit=100) if job.paused] == ["job-0"]

    monkeypatch.setattr(releasing, "RELEASE_STALE_MS", 0)
    serve_once(app)
    assert stranded(delayq) == 0
    assert not [job for job in delayq.pending(limit=100) if job.paused]


def test_a_damaged_shard_stops_its_own_part_of_a_resume_and_no_other(proj, delayq,
                                                                      monkeypatch):
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 2)
    delayq.pause(queue=PARKED)
    for n in range(24):  # ids spread over every shard
        delayq.schedule(proj.record.name, (n,), eta=PAST, queue=PARKED, job_id=f"job-{n}")
    delayq.store.claim(list(delayq.store.keys), 1000, 60_000)
    damaged = delayq.store.keys.shard_for("job-0")
    delayq.store.client.set(damaged.limits, "not a hash")
    on_it = {f"job-{n}" for n in range(24)
             if delayq.store.keys.shard_for(f"job-{n}") == damaged}

    with pytest.raises(DamagedShard, match=re.escape(damaged.limits)):
        delayq.resume(queue=PARKED)
    assert {job.job_id for job in delayq.pending(limit=100) if job.paused} == on_it
    delayq.store.client.delete(damaged.limits)
    assert delayq.resume(queue=PARKED) == len(on_it)
