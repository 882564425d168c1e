"""Redis bytes per pending job: celery-delayq beside Celery's native countdown messages.

One redis-server, one database per arm (flushed before each), nothing consuming:

* **delayq** ``apply_delayed_many`` of ``--jobs`` calls with small arguments (one int),
  due over the next day, with and without a business key, with the journal on (the
  default cap) and off (``delayq_journal_maxlen=0``), and with a key and a job id of the
  caller's own (``order:<n>:close``, which adds the task id index);
* **native** ``--jobs`` ``apply_async((n,), countdown=3600)`` messages of a plain task
  with the same name and arguments, sitting in the broker list before a worker takes
  them (what a worker then holds is measured by ``bench.worker_rss``).

Figure: growth of Redis ``used_memory`` ÷ jobs. Run ``python -m bench.memory --help``.
"""

from __future__ import annotations

import os
import sys
import time

import redis

from celery_delayq.testing.redis_server import RedisServer

from . import workload
from .harness import machine_facts
from .output import options, say, write_result
from .stats import cell, summarise, table

_CHUNK = 10_000

#: arm name -> (journal on, business key, own job id); "native" is Celery's own countdown.
ARMS = {
    "delayq, journal on, key, own job id": (True, True, True),
    "delayq, journal on, key": (True, True, False),
    "delayq, journal on, no key": (True, False, False),
    "delayq, journal off, key": (False, True, False),
    "delayq, journal off, no key": (False, False, False),
}



def delayq_arm(url: str, db: int, jobs: int, journal: bool, key: bool, own_id: bool) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    client.flushdb()
    app, task = workload.standalone_app(url, db, journal_maxlen=100_000 if journal else 0)
    before = workload.used_memory(client)
    started = time.perf_counter()
    for first in range(0, jobs, _CHUNK):
        task.apply_delayed_many([
            {"args": (n,), "delay": 3600 + n % 86_400, **({"key": f"order:{n}"} if key else {}),
             **({"job_id": f"order:{n}:close"} if own_id else {})}
            for n in range(first, min(first + _CHUNK, jobs))])
    seconds = time.perf_counter() - started
    after = workload.used_memory(client)
    client.flushdb()
    client.close()
    app.close()
    return {"bytes_per_job": (after - before) / jobs, "schedule_per_s": jobs / seconds}


def native_arm(url: str, db: int, jobs: int) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    client.flushdb()
    app, task = workload.standalone_app(url, db, delayed=False)
    before = workload.used_memory(client)
    per_s = workload.native_fill(app, task, jobs)
    after = workload.used_memory(client)
    queued = client.llen("celery")
    if queued != jobs:
        raise RuntimeError(f"expected {jobs} messages in the broker list, found {queued}")
    client.flushdb()
    client.close()
    app.close()
    return {"bytes_per_job": (after - before) / jobs, "schedule_per_s": per_s}


def repetition(url: str, jobs: int, n: int) -> dict:
    arms = [*ARMS, "native"]
    if n % 2:
        arms.reverse()  # drift over time favours neither side
    result = {}
    for db, arm in enumerate(arms, start=1):
        if arm == "native":
            result[arm] = native_arm(url, db, jobs)
        else:
            result[arm] = delayq_arm(url, db, jobs, *ARMS[arm])
        say(f"  {arm}: {result[arm]['bytes_per_job']:,.0f} bytes/job "
            f"({result[arm]['schedule_per_s']:,.0f} jobs/s written)")
    result["ratio_native_over_delayq_default"] = (
        result["native"]["bytes_per_job"] / result["delayq, journal on, no key"]["bytes_per_job"])
    return result


def report(summary: dict, repeats: int, jobs: int) -> str:
    many = repeats > 1
    rows = []
    for arm in [*ARMS, "native"]:
        per_job = summary[f"{arm}.bytes_per_job"]
        mib = {k: v * 1e6 / 2**20 for k, v in per_job.items()}
        label = arm if arm != "native" else "Celery native apply_async(countdown=3600)"
        rows.append([label, cell(per_job, 0, many), cell(mib, 0, many),
                     cell(summary[f"{arm}.schedule_per_s"], 0, many)])
    text = table([f"{jobs:,} pending jobs, small args", "bytes/job", "MiB per 1M",
                  "written, jobs/s"], rows)
    ratio = cell(summary["ratio_native_over_delayq_default"], 2, many)
    return (f"{text}\n\nnative ÷ delayq (journal on, no key): {ratio}\n"
            "native messages sit in the broker until a worker reserves them; the worker then\n"
            "holds each ETA task in RAM and the broker keeps an unacked copy (bench.worker_rss).")


def main(argv: list[str] | None = None) -> int:
    opts = options(argv, "memory", __doc__, ("--jobs", 100_000, "pending jobs per arm"),
                   {"jobs": 20_000, "repeat": 1}, "20,000 jobs, 1 repetition")
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        facts = machine_facts(client)
        say(f"redis-server {facts['redis_server']} at {server.url}; load average "
            f"{facts['loadavg_1m_3m_15m'][0]:.2f} (shared machine)")
        reps = []
        for n in range(opts.repeat):
            say(f"-- repetition {n + 1}/{opts.repeat}: {opts.jobs:,} jobs per arm --")
            reps.append(repetition(server.url, opts.jobs, n))
        facts["loadavg_1m_after"] = os.getloadavg()[0]
        client.close()
    summary = summarise(reps)
    print()
    print(report(summary, opts.repeat, opts.jobs))
    result = {"benchmark": "memory", "machine": facts,
              "parameters": {"jobs": opts.jobs, "repeat": opts.repeat, "shards": 8},
              "command": " ".join(["python -m bench.memory", *sys.argv[1:]]),
              "summary": summary, "repetitions": reps}
    write_result(opts.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
