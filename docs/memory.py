"""Redis memory per pending job, for the sizing table in docs/operations.md.

Starts its own redis-server on a free port, schedules ``--jobs`` delayed calls with small
arguments through ``apply_delayed_many`` and prints the growth of ``used_memory`` per job,
with and without a business key and with the journal on and off (``delayq_journal_maxlen=0``).

    .venv/bin/python docs/memory.py --jobs 200000
"""

from __future__ import annotations

import argparse
import time

import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.testing.redis_server import RedisServer

CHUNK = 10_000


def measure(url: str, db: int, jobs: int, journal: bool, key: bool) -> dict:
    client = redis.Redis.from_url(f"{url}/{db}")
    app = Celery(f"mem{db}", broker=f"{url}/{db}", set_as_current=False)
    app.conf.delayq_journal_maxlen = 100_000 if journal else 0

    @app.task(base=DelayedTask, name="shop.close_unpaid_order")
    def close_unpaid_order(order_id):  # never runs: every job stays pending
        return order_id

    DelayQ(app).store.stats()  # creates the store's meta key before the baseline
    before = client.info("memory")["used_memory"]
    started = time.perf_counter()
    for first in range(0, jobs, CHUNK):
        items = [{"args": (n,), "delay": 3600 + n % 86_400,
                  **({"key": f"order:{n}"} if key else {})}
                 for n in range(first, min(first + CHUNK, jobs))]
        close_unpaid_order.apply_delayed_many(items)
    seconds = time.perf_counter() - started
    after = client.info("memory")["used_memory"]
    client.close()
    return {"journal": journal, "key": key, "jobs": jobs,
            "bytes_per_job": (after - before) / jobs, "jobs_per_s": jobs / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    opts = parser.parse_args()
    with RedisServer() as server:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        print(f"redis {version}, {opts.jobs:,} pending jobs per row, 8 shards")
        print(f"{'journal':>8} {'business key':>13} {'bytes/job':>10} {'MiB per 1M':>11}")
        for db, (journal, key) in enumerate([(True, True), (False, True),
                                             (True, False), (False, False)], start=1):
            row = measure(server.url, db, opts.jobs, journal, key)
            print(f"{'on' if journal else 'off':>8} {'yes' if key else 'no':>13} "
                  f"{row['bytes_per_job']:>10.0f} {row['bytes_per_job'] * 1e6 / 2**20:>11.0f}"
                  f"  ({row['jobs_per_s']:,.0f} jobs/s scheduled)")


if __name__ == "__main__":
    main()
