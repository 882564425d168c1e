"""Scheduling one call at a time: celery-delayq beside Celery's native ETA, BullMQ and the
Python client's own ceiling, on one redis-server, nothing consuming.

Per repetition (arm order reversed every other repetition, a fresh database each):

* **client ceiling**: ``--calls`` ``EVALSHA`` of a one-``ZADD`` script from redis-py (with
  hiredis when installed): one round trip per call, nothing else; no Python client
  schedules faster than this;
* **delayq**: ``--calls`` ``apply_delayed((n,), delay=...)``, each returning before the next;
* **native**: ``--calls`` ``apply_async((n,), countdown=...)`` of a plain task;
* **BullMQ**: ``--calls`` ``await queue.add(name, {orderId: n}, {delay})`` in one Node
  process (``bench/bullmq/add.mjs``; ``npm install`` there once, needs Node and npm,
  else the arm is skipped and says why).

Figures: calls/s and Redis ``used_memory`` growth per call. Run ``python -m bench.schedule_one
--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis

from celery_delayq import DelayQ
from celery_delayq.testing.redis_server import RedisServer

from . import workload
from .harness import ROOT, machine_facts
from .output import say, write_result
from .stats import cell, summarise, table

RESULTS = ROOT / "bench" / "results"
BULLMQ = ROOT / "bench" / "bullmq"
_DELAY = 3600
_ZADD = "return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])"
ARMS = ("client ceiling", "delayq", "native", "bullmq")
LABELS = {
    "client ceiling": "redis-py EVALSHA of one ZADD (the client's ceiling)",
    "delayq": "celery-delayq apply_delayed(delay=)",
    "native": "Celery native apply_async(countdown=)",
    "bullmq": "BullMQ Queue.add(delay) (Node)",
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


def delayq_arm(url: str, db: int, calls: int) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    app, task = workload.standalone_app(url, db)
    task.apply_delayed((-1,), delay=_DELAY)  # connections and scripts loaded
    before = workload.used_memory(client)
    started = time.perf_counter()
    for n in range(calls):
        task.apply_delayed((n,), delay=_DELAY + n % 86_400)
    seconds = time.perf_counter() - started
    _check_stored(sum(client.zcard(shard.due) for shard in DelayQ.of(app).store.keys), calls)
    app.close()
    return _figures(client, calls, seconds, before)


def native_arm(url: str, db: int, calls: int) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    app, task = workload.standalone_app(url, db, delayed=False)
    task.apply_async((-1,), countdown=_DELAY)
    before = workload.used_memory(client)
    started = time.perf_counter()
    for n in range(calls):
        task.apply_async((n,), countdown=_DELAY)
    seconds = time.perf_counter() - started
    _check_stored(client.llen("celery"), calls)
    app.close()
    return _figures(client, calls, seconds, before)


def bullmq_arm(url: str, db: int, calls: int) -> dict:
    done = subprocess.run(["node", "add.mjs", f"{url}/{db}", str(calls)], cwd=BULLMQ,
                          capture_output=True, text=True, check=True)
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


RUN = {"client ceiling": ceiling_arm, "delayq": delayq_arm, "native": native_arm,
       "bullmq": bullmq_arm}


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
    return result


def report(summary: dict, arms: list[str], repeats: int, calls: int) -> str:
    many = repeats > 1
    rows = [[LABELS[arm], cell(summary[f"{arm}.per_s"], 0, many),
             cell(summary.get(f"{arm}.bytes_per_job"), 0, many)] for arm in arms]
    text = table([f"{calls:,} calls, one at a time", "calls/s", "Redis bytes/job"], rows)
    ratios = [f"delayq ÷ {name}: {cell(summary[f'delayq_over_{key}'], 2, many)}"
              for key, name in (("ceiling", "client ceiling"), ("native", "native"),
                                ("bullmq", "BullMQ add")) if f"delayq_over_{key}" in summary]
    return text + "\n\n" + "\n".join(ratios)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.schedule_one",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per arm")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--quick", action="store_true", help="2,000 calls, 1 repetition")
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.calls, opts.repeat = 2_000, 1
    if opts.out is None:
        opts.out = RESULTS / ("schedule_one-quick.json" if opts.quick else "schedule_one.json")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    arms = list(ARMS)
    skipped = bullmq_ready()
    if skipped is not None:
        say(f"BullMQ arm skipped: {skipped}")
        arms.remove("bullmq")
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
        "benchmark": "schedule_one", "machine": facts,
        "parameters": {"calls": opts.calls, "repeat": opts.repeat, "shards": 8,
                       "bullmq": None if skipped else "6.7.0", "bullmq_skipped": skipped},
        "command": " ".join(["python -m bench.schedule_one", *sys.argv[1:]]),
        "summary": summary, "repetitions": reps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
