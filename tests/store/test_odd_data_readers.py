"""Readers never crash on odd stored data: they skip or mark it, count it, log it once.

Odd values are planted with raw Redis commands next to healthy jobs: due scores out of
datetime's range (±inf, 1e30, 1e12 s away), envelopes that are not UTF-8, nested 1,000
deep or of the wrong types, ids that are not ids, dead letters that are not JSON.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from prometheus_client import generate_latest

from celery_delayq.errors import DamagedShard
from celery_delayq.metrics import CarrierMetrics, oldest_overdue_seconds
from tests.conftest import CLUSTER, finish

pytestmark = pytest.mark.skipif(
    CLUSTER, reason="plants data with a single-node client; the readers run the same code "
    "on a cluster store (run without DELAYQ_TEST_STORE=cluster)")

TASK = "tests.proj.record"
GOOD = f'{{"t":"{TASK}"}}\n[1]\n'
DEEP = f'{{"t":"{TASK}"}}\n' + "[" * 1000 + "]" * 1000 + "\n"
#: id -> (envelope, due score): each one unreadable for a reason of its own.
ODD_JOBS: dict[str, tuple[str | bytes, float | None]] = {
    "odd:inf": (GOOD, float("inf")),
    "odd:-inf": (GOOD, float("-inf")),
    "odd:1e30": (GOOD, 1e30),
    "odd:far": (GOOD, 1e15),  # 1e12 seconds away: after the year 9999
    "odd:utf8": (f'{{"t":"{TASK}"}}\n["'.encode() + b"\xff\xfe" + b'"]\n', None),
    "odd:deep": (DEEP, None),
    "odd:list": ("[1,2]\n\n", None),
    "odd:types": (f'{{"t":"{TASK}","y":{{"a":1}},"i":[1],"q":7}}\n\n', None),
    "odd:args": (f'{{"t":"{TASK}"}}\n{{"a":1}}\n[2]', None),
    "odd:missing": (None, None),  # in the due set, no envelope
    "~!!": (GOOD, None),  # looks packed, is not
}
ODD_IDS_RAW = [b"odd:\xff"]  # an id that is not UTF-8


@pytest.fixture
def healthy(delayq):
    """30 healthy jobs over every shard, due in 10 min + n s."""
    results = delayq.schedule_many(TASK, [
        {"job_id": f"good:{n}", "delay": 600 + n, "args": [n], "key": f"order:{n % 3}"}
        for n in range(30)])
    return {f"good:{n}": result.eta for n, result in enumerate(results)}


@pytest.fixture
def planted(delayq, redis_client, healthy):
    """The odd jobs above on every shard, in the due set (after the healthy jobs unless
    said)."""
    now_ms = delayq.store.now_ms()
    for shard in delayq.store.keys:
        for job_id, (envelope, score) in ODD_JOBS.items():
            stored = f"{job_id}@{shard.shard}"
            if envelope is not None:
                redis_client.hset(shard.jobs, stored, envelope)
            redis_client.zadd(shard.due, {stored: now_ms + 900_000 if score is None else score})
            redis_client.zadd(shard.bykey, {f"order:1\x00{stored}": 0})
        for stored in ODD_IDS_RAW:
            redis_client.hset(shard.jobs, stored, GOOD)
            redis_client.zadd(shard.due, {stored: now_ms + 900_000})
            redis_client.zadd(shard.bykey, {b"order:1\x00" + stored: 0})
    return len(ODD_JOBS) + len(ODD_IDS_RAW)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("celery_delayq")]


def test_pending_lists_every_healthy_job_and_logs_the_unreadable_once(
        delayq, healthy, planted, caplog):
    caplog.set_level(logging.WARNING)
    jobs = delayq.pending(limit=1000)
    assert [job.job_id for job in jobs] == list(healthy)  # due order
    assert [job.due for job in jobs] == list(healthy.values())
    [warning] = _warnings(caplog)
    assert f"{planted * delayq.store.keys.shards} unreadable" in warning

    caplog.clear()
    by_key = delayq.pending(key="order:1", limit=1000)
    assert [job.job_id for job in by_key] == [j for j in healthy if int(j[5:]) % 3 == 1]
    assert len(_warnings(caplog)) == 1
    assert [j.job_id for j in delayq.pending(task=TASK, limit=5)] == list(healthy)[:5]


def test_search_by_argument_passes_over_odd_jobs_and_values_json_cannot_hold(
        delayq, redis_client, healthy, planted):
    shard = delayq.store.keys.shard(0)
    redis_client.hset(shard.jobs, "odd:nan", f'{{"t":"{TASK}"}}\n[NaN,5]\n{{"k":Infinity}}')
    redis_client.zadd(shard.due, {"odd:nan": delayq.store.now_ms() + 1000})
    assert [job.job_id for job in delayq.pending(args_contains=5)] == ["odd:nan", "good:5"]
    assert [job.job_id for job in delayq.pending(args_contains=7, key="order:1")] == ["good:7"]


def test_get_shows_an_odd_job_as_unreadable_instead_of_raising(delayq, healthy, planted):
    shard = delayq.store.keys.shard(1)
    for job_id in ODD_JOBS:
        if job_id in ("odd:missing", "~!!"):
            continue  # no envelope / not the stored form of any id: get() finds nothing
        job = delayq.get(f"{job_id}@1", key=None)
        assert job is not None and job.unreadable, job_id
        assert (job.task, job.state, job.shard) == ("", "scheduled", shard.shard)
    far = delayq.get("odd:far@1")
    assert "due" in far.unreadable and far.due is None
    assert "\\xff" in delayq.get("odd:utf8@1").options["envelope"]
    good = delayq.get("good:3")
    assert (good.unreadable, good.args, good.due) == ("", [3], healthy["good:3"])


def test_dead_lists_garbage_entries_as_unreadable_next_to_real_ones(
        delayq, redis_client, caplog):
    caplog.set_level(logging.WARNING)
    delayq.store.bury("real:1", None, GOOD, "task out of retries")
    time.sleep(0.002)
    delayq.store.bury("real:2", None, "", "unknown queue")
    shard = delayq.store.keys.shard(2)
    garbage = {
        "g:text": "not json", "g:list": "[1,2]", "g:no-at": '{"reason":"x"}',
        "g:no-reason": '{"at":5,"envelope":""}', "g:odd-at": '{"at":"abc","reason":5}',
        "g:inf-at": '{"at":1e400,"reason":"x"}', "g:utf8": b'{"at":1,"reason":"\xff"}',
        "g:deep": "[" * 1000 + "]" * 1000,
    }
    for stored, raw in garbage.items():
        redis_client.hset(shard.dead, stored, raw)
    redis_client.hset(shard.dead, b"~\xff", '{"at":1,"reason":"x","envelope":""}')

    dead = delayq.store.dead(limit=100)

    assert [(d["job_id"], d["reason"]) for d in dead[:2]] == [
        ("real:2", "unknown queue"), ("real:1", "task out of retries")]
    # a dead letter whose id or text holds bytes that are not UTF-8 (the dead script
    # keeps a damaged job's bytes) is listed, shown with those bytes as \xNN
    damaged = {d["job_id"]: d["reason"] for d in dead[2:] if d["at"] is not None}
    assert damaged == {"g:utf8": "\\xff", "~\\xff": "x"}
    odd = {d["job_id"]: d for d in dead[2:] if d["job_id"] not in damaged}
    assert set(odd) == set(garbage) - {"g:utf8"}
    assert all(d["reason"].startswith("unreadable dead letter") for d in odd.values())
    assert all(d["at"] is None for d in odd.values())
    [warning] = _warnings(caplog)
    assert "7 unreadable" in warning


def test_stats_earliest_and_overdue_age_skip_due_scores_out_of_range(
        delayq, healthy, planted):
    rows = delayq.store.stats()
    first_ms = round(min(healthy.values()).timestamp() * 1000)
    heads = [row["next_due_ms"] for row in rows]
    assert min(heads) == first_ms and all(isinstance(h, int) for h in heads)
    assert all(row["unreadable_due"] == 4 for row in rows)  # inf, -inf, 1e30, 1e15
    assert sum(row["pending"] for row in rows) == len(healthy) + planted * len(rows)
    assert oldest_overdue_seconds(rows) == 0.0  # -inf is not "waiting since year -∞"
    due_ms, job_id, _ = delayq.store.earliest()
    assert (due_ms, job_id) == (first_ms, "good:0")


def test_counts_and_metrics_scrape_despite_odd_data(delayq, redis_client, healthy, planted,
                                                    caplog):
    caplog.set_level(logging.WARNING)
    counts = delayq.store.keys.shard(0).counts
    redis_client.hset(counts, "garbled.count", "abc")
    redis_client.hset(counts, b"bad.\xff", 3)
    tasks, cancelled = delayq.store.counts()
    assert (tasks, cancelled) == ({TASK: 30}, 0)
    assert "2 unreadable" in _warnings(caplog)[0]

    text = generate_latest(CarrierMetrics(delayq.store).registry).decode()
    assert f'delayq_stored_jobs{{task="{TASK}"}} 30.0' in text
    assert 'delayq_unreadable_due_jobs{shard="0"} 4.0' in text
    assert "delayq_oldest_overdue_seconds 0.0" in text


def test_cli_ls_show_stats_and_health_run_on_odd_data(spawn, delayq, redis_client, healthy,
                                                      planted):
    redis_client.hset(delayq.store.keys.shard(0).dead, "g:text", "not json")

    def run(*args: str) -> tuple[int, str]:
        process = spawn("delayq", *args)
        output = finish(process)
        return process.returncode, output

    code, output = run("ls", "--limit", "1000")
    assert code == 0, output
    assert sum("good:" in line for line in output.splitlines()) == len(healthy)
    assert "unreadable" in output and "Traceback" not in output
    code, output = run("ls", "--dead")
    assert code == 0 and "g:text" in output and "unreadable dead letter" in output, output
    code, output = run("show", "odd:inf@2")
    assert code == 0 and json.loads(output)["unreadable"], output
    code, output = run("show", "odd:utf8@2")
    assert code == 0 and "\\\\xff" in output, output
    for command in ("stats", "health"):
        code, output = run(command)
        assert code == 0 and "Traceback" not in output, output


@pytest.mark.parametrize("call", [
    lambda dq: dq.get("order:1"), lambda dq: dq.store.dead(), lambda dq: dq.store.replay("x"),
    lambda dq: dq.store.drop("x", by="ops"), lambda dq: dq.store.replay_dead()],
    ids=["get", "dead", "replay", "drop", "replay_dead"])
def test_a_read_meeting_a_key_of_the_wrong_type_raises_damaged_shard(delayq, redis_client,
                                                                     call):
    """Plain reads (not the scripts, which check first) met WRONGTYPE as a bare Redis error:
    a traceback in the CLI, a server error in the admin."""
    redis_client.set(delayq.store.keys.shard(0).dead, "not a hash")
    with pytest.raises(DamagedShard, match="another type of value"):
        call(delayq)


def test_cli_says_a_damaged_key_instead_of_a_traceback(spawn, delayq, redis_client):
    redis_client.set(delayq.store.keys.shard(0).dead, "not a hash")
    process = spawn("delayq", "ls", "--dead")
    output = finish(process)
    assert process.returncode == 1 and "Traceback" not in output, output
    assert "error: a key of the store holds another type of value" in output
    assert "delayq health` names it" in output
