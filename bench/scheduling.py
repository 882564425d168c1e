"""Scheduling speed and footprint: celery-delayq beside Celery's native ETA, BullMQ and
the Python client's own ceiling, on one redis-server, nothing consuming.

Per repetition (arm order reversed every other repetition, a fresh database each), each arm
``--calls`` jobs of one small argument, due in an hour or more:

* **client ceiling**: ``EVALSHA`` of a one-``ZADD`` script from redis-py (with hiredis when
  installed), one call at a time: one round trip per call and nothing else; no Python
  client schedules faster one call at a time;
* **delayq**: ``apply_delayed((n,), delay=...)``, each returning before the next;
* **delayq batched**: ``apply_delayed_many`` of 1,000 calls at a time;
* **native**: ``apply_async((n,), countdown=...)`` of a plain task;
* **BullMQ** and **BullMQ batched**: ``await queue.add(...)`` one at a time and
  ``queue.addBulk`` of 1,000 at a time, in a Node process (``bench/bullmq/add.mjs``;
  ``npm install`` there on the first run; without Node and npm those arms are skipped and
  the output says why).

Every arm checks that it stored all its jobs. Figures: calls/s and Redis ``used_memory``
growth per job. Run ``python -m bench.scheduling --help``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import redis

from celery_delayq import DelayQ
from celery_delayq.testing.redis_server import RedisServer

from . import workload
from .harness import ROOT, machine_facts
from .output import options, say, write_result
from .stats import cell, summarise, table

BULLMQ = ROOT / "bench" / "bullmq"
_DELAY = 3600
_ZADD = "return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])"
_BATCH = 1000
ARMS = ("client ceiling", "delayq", "native", "bullmq", "delayq batched", "bullmq batched")
LABELS = {
    "client ceiling": "redis-py EVALSHA of one ZADD (the client's ceiling)",
    "delayq": "celery-delayq apply_delayed(delay=)",
    "native": "Celery native apply_async(countdown=)",
    "bullmq": "BullMQ Queue.add(delay) (Node)",
    "delayq batched": "celery-delayq apply_delayed_many, 1,000 a call",
    "bullmq batched": "BullMQ Queue.addBulk, 1,000 a call (Node)",
}


def bullmq_ready() -> str | None:
    """None when the BullMQ arm can run, else why not (installing it once if it can)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not on PATH"
    if not (BULLMQ / "node_modules" / "bullmq").is_dir():
        say("installing BullMQ into bench/bullmq/node_modules (npm install, once)")
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"],
                              cwd=BULLMQ, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"npm install failed: {done.stderr.strip()[-300:]}"
    return None


def ceiling_arm(url: str, db: int, calls: int) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    sha = client.script_load(_ZADD)
    before = workload.used_memory(client)
    started = time.perf_counter()
    for n in range(calls):
        client.evalsha(sha, 1, "ceiling", n, f"~{n:021d}")
    seconds = time.perf_counter() - started
    return _figures(client, calls, seconds, before)


def app_arm(url: str, db: int, calls: int, *, write: Callable[[Any, range], None],
            delayed: bool = True) -> dict:
    """Time ``write(task, range(calls))`` after one warm-up call (connections and scripts
    loaded), then check that every job is stored."""
    client = redis.Redis.from_url(f"{url}/{db}")
    app, task = workload.standalone_app(url, db, delayed=delayed)
    write(task, range(-1, 0))
    before = workload.used_memory(client)
    started = time.perf_counter()
    write(task, range(calls))
    seconds = time.perf_counter() - started
    _check_stored(sum(client.zcard(shard.due) for shard in DelayQ.of(app).store.keys)
                  if delayed else client.llen("celery"), calls)
    app.close()
    return _figures(client, calls, seconds, before)


def one_by_one(task, numbers: range) -> None:
    for n in numbers:
        task.apply_delayed((n,), delay=_DELAY + n % 86_400)


def batched(task, numbers: range) -> None:
    for first in range(numbers.start, numbers.stop, _BATCH):
        task.apply_delayed_many([{"args": (n,), "delay": _DELAY + n % 86_400}
                                 for n in range(first, min(first + _BATCH, numbers.stop))])


def native(task, numbers: range) -> None:
    for n in numbers:
        task.apply_async((n,), countdown=_DELAY)


def bullmq_arm(url: str, db: int, calls: int, mode: str = "one") -> dict:
    return node_json("add.mjs", f"{url}/{db}", calls, mode)


def node_json(script: str, *args: object, timeout: float | None = None) -> dict:
    """Run ``bench/bullmq/<script>`` with ``args`` in Node; the JSON its last line prints."""
    done = subprocess.run(["node", script, *map(str, args)], cwd=BULLMQ, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench/bullmq/{script} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_stored(found: int, calls: int) -> None:
    if found != calls + 1:  # and the warm-up call
        raise RuntimeError(f"expected {calls + 1:,} pending jobs, found {found:,}")


def _figures(client: redis.Redis, calls: int, seconds: float, before: int) -> dict:
    after = workload.used_memory(client)
    client.flushdb()
    client.close()
    return {"per_s": calls / seconds, "us_per_call": seconds / calls * 1e6,
            "bytes_per_job": (after - before) / calls}


RUN: dict[str, Callable[[str, int, int], dict]] = {
    "client ceiling": ceiling_arm,
    "delayq": partial(app_arm, write=one_by_one),
    "native": partial(app_arm, write=native, delayed=False),
    "bullmq": bullmq_arm,
    "delayq batched": partial(app_arm, write=batched),
    "bullmq batched": partial(bullmq_arm, mode="bulk"),
}


def repetition(url: str, calls: int, arms: list[str], n: int) -> dict:
    order = arms if n % 2 == 0 else arms[::-1]  # drift over time favours no arm
    result = {}
    for db, arm in enumerate(order, start=1):
        result[arm] = RUN[arm](url, db, calls)
        say(f"  {arm}: {result[arm]['per_s']:,.0f} calls/s, "
            f"{result[arm]['bytes_per_job']:,.0f} bytes/job")
    ceiling = result["client ceiling"]["per_s"]
    result["delayq_over_ceiling"] = result["delayq"]["per_s"] / ceiling
    result["delayq_over_native"] = result["delayq"]["per_s"] / result["native"]["per_s"]
    if "bullmq" in result:
        result["delayq_over_bullmq"] = result["delayq"]["per_s"] / result["bullmq"]["per_s"]
        result["batched_delayq_over_bullmq"] = (result["delayq batched"]["per_s"]
                                                / result["bullmq batched"]["per_s"])
    return result


def report(summary: dict, arms: list[str], repeats: int, calls: int) -> str:
    many = repeats > 1
    rows = [[LABELS[arm], cell(summary[f"{arm}.per_s"], 0, many),
             cell(summary.get(f"{arm}.bytes_per_job"), 0, many)] for arm in arms]
    text = table([f"{calls:,} jobs per arm", "jobs/s", "Redis bytes/job"], rows)
    ratios = [f"{name}: {cell(summary[key], 2, many)}" for key, name in (
        ("delayq_over_ceiling", "apply_delayed ÷ client ceiling"),
        ("delayq_over_native", "apply_delayed ÷ native apply_async"),
        ("delayq_over_bullmq", "apply_delayed ÷ BullMQ add"),
        ("batched_delayq_over_bullmq", "apply_delayed_many ÷ BullMQ addBulk"),
    ) if key in summary]
    return text + "\n\n" + "\n".join(ratios)


def main(argv: list[str] | None = None) -> int:
    opts = options(argv, "scheduling", __doc__, ("--calls", 20_000, "jobs per arm"),
                   {"calls": 2_000, "repeat": 1}, "2,000 calls, 1 repetition")
    arms = list(ARMS)
    skipped = bullmq_ready()
    if skipped is not None:
        say(f"BullMQ arm skipped: {skipped}")
        arms = [arm for arm in arms if not arm.startswith("bullmq")]
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        facts = machine_facts(client)
        say(f"redis-server {facts['redis_server']} at {server.url}; load average "
            f"{facts['loadavg_1m_3m_15m'][0]:.2f} (shared machine)")
        reps = []
        for n in range(opts.repeat):
            say(f"-- repetition {n + 1}/{opts.repeat}: {opts.calls:,} calls per arm --")
            reps.append(repetition(server.url, opts.calls, arms, n))
        facts["loadavg_1m_after"] = os.getloadavg()[0]
        client.close()
    summary = summarise(reps)
    print()
    print(report(summary, arms, opts.repeat, opts.calls))
    write_result(opts.out, {
        "benchmark": "scheduling", "machine": facts,
        "parameters": {"calls": opts.calls, "repeat": opts.repeat, "shards": 8,
                       "bullmq": None if skipped else "6.7.0", "bullmq_skipped": skipped},
        "command": " ".join(["python -m bench.scheduling", *sys.argv[1:]]),
        "summary": summary, "repetitions": reps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
